"""Run by tests/test_errors_and_lifecycle.py::test_ctrl_c_interrupts_a_blocked_wait.

Ctrl-C reaches a rank blocked in a collective that can never complete."""
import os
import signal
import threading
import time

import numpy as np

import scaleout as so

so.init()
if so.rank() == 0:
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        so.allreduce(np.ones(2), name="never.submitted.elsewhere")
    except KeyboardInterrupt:
        print("interrupted while waiting", flush=True)
else:
    time.sleep(2)
os._exit(0)
