"""Run by tests/test_errors_and_lifecycle.py::test_mismatches_and_bad_input_raise_on_every_rank.

Bad input: errors that name what was wrong, raised on every rank, and no hang."""

import numpy as np
from _harness import check, expect_error, main

import scaleout as so


def run():
    r, n = so.rank(), so.size()
    # shape mismatch: reported on every rank, naming the tensor, the field and the ranks
    shape = (3,) if r == n - 1 else (2,)
    msg = expect_error(
        so.MismatchError,
        lambda: so.allreduce(np.zeros(shape), name="grads.w"),
        "grads.w",
        "shape",
        f"rank {n - 1} has [3]",
        what="shape mismatch",
    )
    check("[2]" in msg, "message shows the other ranks' shape")
    h = so.allreduce_async(np.zeros(shape), name="grads.async")
    expect_error(so.MismatchError, lambda: so.synchronize(h), "grads.async", what="async mismatch")
    check(so.synchronize(h) is None, "a failed handle has no result when synchronized again")
    dtype = np.float64 if r == 0 else np.float32
    expect_error(
        so.MismatchError,
        lambda: so.allreduce(np.zeros(4, dtype), name="dt"),
        "dtype",
        "float64",
        "float32",
        "rank 0",
        what="dtype mismatch",
    )
    op = so.Sum if r == 0 else so.Max
    expect_error(
        so.MismatchError,
        lambda: so.allreduce(np.zeros(4), op=op, name="op"),
        "reduce op",
        "Sum",
        "Max",
        what="op mismatch",
    )
    expect_error(
        so.MismatchError,
        lambda: so.allreduce(np.zeros(4), name="pre", prescale_factor=1.0 + (r == 1)),
        "prescale",
        what="prescale mismatch",
    )
    expect_error(
        so.MismatchError,
        lambda: so.broadcast(np.zeros(4), root_rank=r % 2, name="root"),
        "root rank",
        what="root mismatch",
    )
    if r == 0:
        expect_error(
            so.MismatchError,
            lambda: so.allreduce(np.zeros(2), name="kind"),
            "operation",
            "allreduce",
            "allgather",
            what="collective mismatch",
        )
    else:
        expect_error(
            so.MismatchError,
            lambda: so.allgather(np.zeros(2), name="kind"),
            "operation",
            what="collective mismatch",
        )
    expect_error(
        so.MismatchError,
        lambda: so.allgather(np.zeros((1, 2 + (r == 0))), name="agdim"),
        "shape after the first dimension",
        what="allgather trailing-dim mismatch",
    )
    # after all those errors the job still works, and a cached name changes shape cleanly
    for _ in range(3):
        check(so.allreduce(np.ones(5), op=so.Sum, name="steady")[0] == n, "recovers after errors")
    expect_error(
        so.MismatchError,
        lambda: so.allreduce(np.ones(5 + (r == 0)), name="steady"),
        "shape",
        what="cached name, new mismatched shape",
    )
    check(so.allreduce(np.ones(7), op=so.Sum, name="steady")[0] == n, "cached name, new shape")

    # local errors
    # A name is in flight until its collective completes. Each rank submits a name of its own,
    # which no other rank submits before the barrier, so it is still in flight when the rank
    # submits it again; after the barrier each rank submits the others' names.
    from mpi4py import MPI

    own = so.allreduce_async(np.ones(3), op=so.Sum, name=f"dup.{r}")
    expect_error(
        so.DuplicateNameError,
        lambda: so.allreduce_async(np.ones(3), op=so.Sum, name=f"dup.{r}"),
        f"dup.{r}",
        "already in flight",
        what="duplicate name",
    )
    MPI.COMM_WORLD.Barrier()
    others = [
        so.allreduce_async(np.ones(3), op=so.Sum, name=f"dup.{k}") for k in range(n) if k != r
    ]
    check(
        all(so.synchronize(h).tolist() == [n] * 3 for h in [own] + others),
        "the first submission of a duplicated name completes",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.zeros(2, np.complex64)),
        "complex64",
        what="unsupported dtype",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.zeros(2, bool), name="b"),
        "bool",
        "Average",
        what="bool average",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.zeros(2), op=17),
        "reduce op",
        what="unknown op",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.broadcast(np.zeros(2), root_rank=n),
        "root rank",
        what="root out of range",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.alltoall(np.zeros(n + 1)),
        "not divisible",
        what="alltoall without splits",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.alltoall(np.zeros(3), splits=[1] * (n + 1)),
        "splits",
        what="alltoall splits length",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.zeros(2), name=""),
        "name",
        what="empty name",
    )
    so.barrier()

    # A handle dropped before completion: the collective still completes on every rank, its
    # buffers stay alive meanwhile, and the name is free again afterwards.
    dropped = so.allreduce_async(np.full(50000, float(r)), op=so.Sum, name="dropped")
    del dropped
    so.barrier(name="after.drop")
    got = so.allreduce(np.ones(3), op=so.Sum, name="dropped")
    check(got.tolist() == [n] * 3, "a dropped handle's name can be used again")


if __name__ == "__main__":
    main(run)
