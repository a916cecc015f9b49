"""Run by
tests/test_stall_shutdown.py::test_a_skipped_collective_fails_on_every_rank_after_the_shutdown_time.

Stall shutdown (Note [Stall shutdown]): the last rank skips a collective the others submit, and
submits one they never will. After the stall shutdown time every rank's pending collective fails
with ShutDownError (Horovod's HorovodInternalError, a RuntimeError) naming both tensors and the
ranks each waits for; later collectives fail the same way; shutdown() and init() start a job
that works again."""

import numpy as np
from _harness import check, check_close, expect_error, main

import scaleout as so


def run():
    r, n = so.rank(), so.size()
    last = n - 1
    others = "rank 0" if n == 2 else "ranks " + ", ".join(str(k) for k in range(n - 1))
    name = "skipped.by.last" if r != last else "only.on.last"
    h = so.allreduce_async(np.ones(3), name=name)
    msg = expect_error(
        so.HorovodInternalError,
        lambda: so.synchronize(h),
        "stall shutdown: ",
        "allreduce 'skipped.by.last' (waited ",
        f"for rank {last})",
        "allreduce 'only.on.last' (waited ",
        f"for {others})",
        "scaleout has shut down on every rank",
        what="the stalled collective fails",
    )
    check(
        issubclass(so.ShutDownError, so.HorovodInternalError)
        and issubclass(so.ShutDownError, RuntimeError),
        "ShutDownError is a RuntimeError",
    )
    expect_error(
        so.ShutDownError,
        lambda: so.allreduce(np.ones(2), name="after"),
        msg.split(".")[0],
        what="a later collective fails with the same reason",
    )
    so.shutdown()
    so.init()
    check_close(
        so.allreduce(np.ones(3), op=so.Sum, name="again"),
        np.full(3, float(n)),
        "init() after the stall shutdown gives a working job",
    )


if __name__ == "__main__":
    main(run)
