"""Run by tests/test_errors_and_lifecycle.py::test_ctrl_c_interrupts_a_blocked_wait.

Ctrl-C reaches a rank blocked in a collective that can never complete."""

import os
import signal
import threading

import numpy as np
from mpi4py import MPI

import scaleout as so

so.init()
world = MPI.COMM_WORLD
if so.rank() == 0:
    # The scenario: Ctrl-C pressed a second after the wait began (not an event to wait for).
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        so.allreduce(np.ones(2), name="never.submitted.elsewhere")
    except KeyboardInterrupt:
        print("interrupted while waiting", flush=True)
    world.send("done", dest=1)
else:
    # Stays until rank 0 is done: leaving earlier would end rank 0's wait another way.
    world.recv(source=0)
# A clean end (the interrupted allreduce fails with ShutDownError inside shutdown): Open MPI's
# launcher fails a job whose ranks leave MPI without MPI_Finalize.
so.shutdown()
