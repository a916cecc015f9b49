"""Run by tests/test_errors_and_lifecycle.py::test_join_with_uneven_steps.

join() with uneven amounts of data: joined ranks contribute zeros to allreduces, allgather and
broadcast fail on every rank still running (as in Horovod), nothing hangs."""

import numpy as np
from _harness import check, check_close, expect_error, main

import scaleout as so


def run():
    r, n = so.rank(), so.size()
    steps = 3 + 2 * r  # the last rank has the most data
    for step in range(steps):
        active = [k for k in range(n) if step < 3 + 2 * k]
        got = so.allreduce(np.full(4, float(r + 1), np.float32), op=so.Sum, name="grad")
        check_close(got, np.full(4, float(sum(k + 1 for k in active))), f"step {step} sum")
        avg = so.allreduce(np.full(2, float(n)), name="avg")  # Average divides by the full size
        check_close(avg, np.full(2, float(len(active))), f"step {step} average")
        if len(active) == n:
            g = so.allgather(np.full((1, 2), r), name="rows")
            check(g.shape == (n, 2), f"step {step}: allgather before any rank joined")
        else:  # Horovod: "Allgather is not supported with Join at this time"
            expect_error(
                so.InvalidArgumentError,
                lambda: so.allgather(np.full((1, 2), r), name="rows"),
                "allgather 'rows' cannot run while",
                "joined",
                "not supported with join()",
                what=f"step {step}: allgather after a join",
            )
            expect_error(
                RuntimeError,
                lambda: so.broadcast(np.ones(2), 0, name="bcast"),
                "broadcast 'bcast' cannot run while",
                "joined",
                what=f"step {step}: broadcast after a join",
            )
    last = so.join()
    check(last == n - 1, f"join returns the last rank to join ({last})")
    # the job goes on normally after everyone joined, and join works twice
    check(so.allreduce(np.ones(1), op=so.Sum, name="after")[0] == n, "allreduce after join")
    if r == 0:
        so.allreduce(np.ones(1), op=so.Sum, name="only0")
    check(so.join() == 0 if n > 1 else True, "second join: rank 0 joins last")


if __name__ == "__main__":
    main(run)
