"""Run by tests/test_timeline.py::test_timeline_is_a_chrome_trace_of_every_tensor.

A run with SCALEOUT_TIMELINE set: rank 0 writes the trace checked by the test."""

import numpy as np
from _harness import main

import scaleout as so


def run():
    for _ in range(3):
        hs = [so.allreduce_async(np.ones(100), name=f"layer{i}.grad") for i in range(4)]
        for h in hs:
            so.synchronize(h)
    so.allgather(np.ones((2, 2)), name='odd "name"')
    so.shutdown()


if __name__ == "__main__":
    main(run)
