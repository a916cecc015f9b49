"""Run by tests/test_errors_and_lifecycle.py::test_shutdown_and_init_again.

Collectives before init, shutdown with pending work, idempotent shutdown, init again."""

import numpy as np
from _harness import check, expect_error, finish

import scaleout as so


def run():
    expect_error(
        so.NotInitializedError,
        lambda: so.allreduce(np.ones(2)),
        "init",
        what="allreduce before init",
    )
    expect_error(so.NotInitializedError, so.rank, "init", what="rank before init")
    so.init()
    r, n = so.rank(), so.size()
    check(so.is_initialized(), "initialized")
    check(so.grouped_allreduce([]) == [], "an empty group as the first collective")
    check(so.allreduce(np.ones(3), op=so.Sum, name="a")[0] == n, "first life")
    # rank 0 leaves a collective pending that others never submit, then shuts down
    if r == 0:
        h = so.allreduce_async(np.ones(3), name="never")
    so.barrier()
    so.shutdown()
    so.shutdown()  # idempotent
    check(not so.is_initialized(), "not initialized after shutdown")
    if r == 0:
        expect_error(
            so.ShutDownError,
            lambda: so.synchronize(h),
            "shut down",
            what="pending handle fails at shutdown",
        )
    expect_error(so.NotInitializedError, lambda: so.allreduce(np.ones(2)), what="after shutdown")
    for life in range(2):
        so.init()
        check(so.size() == n and so.rank() == r, "same layout after re-init")
        check(so.allreduce(np.ones(3), op=so.Sum, name="a")[0] == n, f"life {life + 2}")
        if r == 0 and life == 0:  # pending when this life ends
            stale = so.allreduce_async(np.ones(3), name="never.again")
        if r == 0 and life == 1:  # a handle of an earlier runtime, used in a new one
            expect_error(
                so.ShutDownError,
                lambda: so.poll(stale),
                "shut down",
                what="poll of a handle from before the last shutdown",
            )
            expect_error(
                so.ShutDownError,
                lambda: so.synchronize(stale),
                "shut down",
                what="synchronize of a handle from before the last shutdown",
            )
        so.barrier()
        so.shutdown()
    # a rank that shuts down while another still waits: the waiter gets ShutDownError, no hang
    so.init()
    # The waiters leave together once each has its error: a slow one must not submit after
    # rank 0 has gone, and be told of rank 0 instead of rank 1. (mpi4py after init: scaleout
    # imports it, Note [Intel MPI and dead peers].)
    from mpi4py import MPI

    waiters = MPI.COMM_WORLD.Split(MPI.UNDEFINED if r == 1 else 0, r)
    if r == 1:
        so.shutdown()
    else:
        try:
            so.allreduce(np.ones(2), name="orphan")
            check(False, "peer shut down: no error")
        except so.ShutDownError as e:
            check("rank 1" in str(e) and "shut down" in str(e), f"peer shut down: {e}")
            # Note [Error details]: the culprit as data
            check(e.culprit_ranks == (1,) and e.process_set_id is None, f"culprits of {e!r}")
        waiters.Barrier()
        waiters.Free()
        so.shutdown()
    # rank 0 leaves first: the others' later collectives fail at once instead of hanging
    so.init()
    so.barrier()
    if r == 0:
        so.shutdown()
    else:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                so.allreduce(np.ones(2), name=f"after0.{time.monotonic()}")
            except so.ShutDownError as e:
                check("rank 0" in str(e), f"names rank 0: {e}")
                check(e.culprit_ranks == (0,), f"culprits of {e!r}: {e.culprit_ranks}")
                break
        else:
            check(False, "collectives kept working after rank 0 shut down")
        expect_error(
            so.ShutDownError,
            lambda: so.allreduce(np.ones(2), name="again"),
            "rank 0",
            what="still failing, not hanging",
        )
        so.shutdown()
    finish()


if __name__ == "__main__":
    run()
