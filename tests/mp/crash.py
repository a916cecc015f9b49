"""Run by tests/test_errors_and_lifecycle.py::test_a_crashing_rank_ends_the_job.

One rank dies in the middle of training; the job must end, not hang."""

import os
import sys

import numpy as np

import scaleout as so

so.init()
for _ in range(5):
    so.allreduce(np.ones(1000), name="g")
if so.rank() == so.size() - 1:
    os._exit(7)
so.allreduce(np.ones(1000), name="never_completes")
print("unreachable", flush=True)
sys.exit(0)
