"""Run by tests/test_liveness.py::test_a_rank_stopped_inside_a_collective_is_named.

Note [Stalls inside a collective]: the last rank stops (SIGSTOP) while every rank runs large
collectives back to back, so the others are stuck inside one (its transfer), not in
negotiation. With the heartbeat timeout off it is not taken for dead: each survivor warns, once
SCALEOUT_STALL_CHECK_TIME_SECONDS have passed inside the collective, naming the stopped rank
(rank 0 from the heartbeats it no longer gets, the others from rank 0's). A few seconds later
the stopped rank is woken and exits, which ends the survivors' collectives.

argv[1]: "allgather" (through MPI) or "allreduce" (through shared memory on one machine).
argv[2]: seconds after which the stopped rank exits.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

import scaleout as so

so.init()
r, n = so.rank(), so.size()
victim = n - 1
collective = sys.argv[1]
if r == victim:
    me = os.getpid()
    # Later it ends, as a rank that exits (os._exit) when woken: not by a signal, after which
    # MPICH's launcher stops relaying the survivors' output. The sleep and the timer are the
    # scenario, not waits for an event: a stop of argv[2] s, longer than the stall check time,
    # that starts half a second in, while the large collectives below are in flight.
    signal.signal(signal.SIGUSR2, lambda *_: os._exit(9))
    subprocess.Popen(
        ["sh", "-c", f"sleep {float(sys.argv[2])}; kill -USR2 {me}; kill -CONT {me}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    threading.Timer(0.5, lambda: os.kill(me, signal.SIGSTOP)).start()
# The stopped rank's contribution is the large one: the others stay inside the collective until
# it has sent all of it.
big = np.ones((1 << 22) if r == victim else 1, np.float32)
start = time.monotonic()
try:
    while time.monotonic() - start < 60:
        if collective == "allgather":
            so.allgather(big, name="busy")
        else:
            so.allreduce(np.ones(1 << 22, np.float32), name="busy")
    print(f"rank {r}: no error within 60 s", flush=True)
except so.HorovodInternalError as exc:
    print(f"rank {r}: ended: {exc}", flush=True)
sys.exit(0)
