"""A collective that one rank is late for: the others are warned, naming the missing rank."""
import time

import numpy as np

import scaleout as so
from _harness import check, check_close, main


def run():
    r, n = so.rank(), so.size()
    if r != n - 1:
        h = so.allreduce_async(np.ones(3), op=so.Sum, name="late.tensor")
        time.sleep(2.5)
        check(not so.poll(h), "not complete while a rank is missing")
        so.barrier(name="go")
    else:
        so.barrier(name="go")
        h = so.allreduce_async(np.ones(3), op=so.Sum, name="late.tensor")
    check_close(so.synchronize(h), np.full(3, float(n)), "completes once the late rank submits")


if __name__ == "__main__":
    main(run)
