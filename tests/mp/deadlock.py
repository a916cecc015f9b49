"""Run by tests/test_deadlock.py::test_deadlocks_are_reported_on_every_rank_and_the_job_goes_on.

Deadlock detection (Note [Deadlock]): when every rank waits for collectives no rank can
complete, each raises DeadlockError (a RuntimeError) within a couple of seconds, naming what
every rank waits for, and the job goes on. A rank that is still computing is never taken for
deadlocked.

argv[1]: numpy or torch (the front end whose handles the ranks wait on)."""

import sys
import time

import numpy as np
from _harness import check, check_close, expect_error, main_tests

import scaleout as so

FRONT = sys.argv[1]
if FRONT == "torch":
    import torch

    import scaleout.torch as hvd

    def reduce(value, name):
        return hvd.allreduce(torch.full((2,), float(value)), op=hvd.Sum, name=name)

    def shown(name):  # as Horovod's torch front end names an allreduce
        return f"allreduce.{name}"
else:
    hvd = so

    def reduce(value, name):
        return so.allreduce(np.full(2, float(value)), op=so.Sum, name=name)

    def shown(name):
        return name


def timed(fn):
    start = time.monotonic()
    try:
        fn()
    finally:
        timed.seconds = time.monotonic() - start


def test_names_that_differ_between_ranks(r, n):
    # a typo on one rank: rank 0 waits for 'grad.w', the others for 'grad.W'
    name = "grad.w" if r == 0 else "grad.W"
    others = "rank 1" if n == 2 else "ranks " + ", ".join(str(k) for k in range(1, n))
    msg = expect_error(
        hvd.DeadlockError,
        lambda: timed(lambda: reduce(1, name)),
        "deadlock",
        f"rank 0 waits for '{shown('grad.w')}'",
        f"'{shown('grad.W')}' submitted only by " + others,
        f"'{shown('grad.w')}' submitted only by rank 0",
        what="differing names",
    )
    check(isinstance(hvd.DeadlockError("x"), RuntimeError), "DeadlockError is a RuntimeError")
    check(timed.seconds < 10, f"detected in {timed.seconds:.1f} s")
    check_close(reduce(r, "after.deadlock"), [n * (n - 1) / 2] * 2, "the job goes on")
    del msg


def test_a_collective_skipped_on_one_rank(r, n):
    # the last rank caught an exception and skipped 'step.1', so it waits in 'step.2' while the
    # others wait in 'step.1': every rank's call fails, and all meet again at 'step.3'
    mine = "step.2" if r == n - 1 else "step.1"
    expect_error(
        hvd.DeadlockError,
        lambda: reduce(1, mine),
        f"'{shown(mine)}'",
        f"'{shown('step.1')}' submitted only by",
        f"'{shown('step.2')}' submitted only by rank " + str(n - 1),
        what="a skipped collective",
    )
    check_close(reduce(1, "step.3"), [n, n], "back in step afterwards")


def test_unnamed_collectives_off_by_one(r, n):
    # rank 0 makes one unnamed call more than the others: its second one waits alone, while the
    # others wait at the next point they all should have met
    check_close(so.allreduce(np.ones(1), op=so.Sum), [n], "the first unnamed call pairs up")
    if r == 0:
        expect_error(
            hvd.DeadlockError,
            lambda: so.allreduce(np.ones(1), op=so.Sum),
            "rank 0 waits for 'allreduce.noname.",
            what="rank 0's extra unnamed call",
        )
    else:
        expect_error(
            hvd.DeadlockError,
            lambda: so.allreduce(np.ones(1), name="sync.point"),
            "'allreduce.noname.",
            "submitted only by rank 0",
            what="the others, at their next collective",
        )
    check_close(so.allreduce(np.ones(1), op=so.Sum, name="named.again"), [n], "named works")


def test_a_rank_that_computes_is_not_deadlocked(r, n):
    if r == n - 1:
        end = time.monotonic() + 3.0
        x = 0.0
        while time.monotonic() < end:  # busy: not blocked, however long the others wait
            x += np.sum(np.ones(1000))
    check_close(reduce(1, "after.compute"), [n, n], "a slow rank just makes the others wait")


def test_a_rank_that_sleeps_is_not_deadlocked(r, n):
    if r == n - 1:
        time.sleep(3.0)  # waiting on nothing of scaleout's: not blocked either
    check_close(reduce(1, "after.sleep"), [n, n], "a sleeping rank just makes the others wait")


if __name__ == "__main__":
    main_tests(globals())
