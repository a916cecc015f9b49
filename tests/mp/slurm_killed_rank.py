"""Run by tests/test_slurm.py::test_srun_a_rank_killed_from_outside_is_named.

Ranks started by srun. Once every rank is up, the last one prints "VICTIM <pid> <host>" and
waits to be killed: the test sends it SIGKILL from outside, as the kernel's OOM killer or an
operator would. Every other rank waits meanwhile in an allreduce the dead rank never joins, and
must get a HorovodInternalError naming the dead rank, its pid and host, with the rank as
culprit_ranks (Note [Liveness]); each prints "rank <r>: named: <the error>".
"""

import os
import signal
import socket
import sys

import numpy as np

import scaleout as so

so.init()
r, n = so.rank(), so.size()
victim = n - 1
pids = so.allgather_object((os.getpid(), socket.gethostname()))
so.allreduce(np.ones(1), name="up")
if r == victim:
    print(f"VICTIM {os.getpid()} {socket.gethostname()}", flush=True)
    while True:
        signal.pause()  # until the test's SIGKILL
pid, host = pids[victim]
try:
    so.allreduce(np.ones(1), name="never")
except so.HorovodInternalError as exc:
    named = f"rank {victim} (pid {pid} on {host}) died" in str(exc)
    named = named and exc.culprit_ranks == (victim,)
    print(f"rank {r}: {'named' if named else 'NOT NAMED'}: {exc}", flush=True)
    sys.exit(0 if named else 1)
print(f"rank {r}: NOT NAMED: the allreduce completed without rank {victim}", flush=True)
sys.exit(1)
