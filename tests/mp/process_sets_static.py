"""Run by tests/test_process_sets.py::test_process_sets_from_communicators_at_init_only.

Process sets registered at init only (dynamic sets off): a set made from an mpi4py
communicator, add/remove refused with a hint, and init's argument checked."""

import numpy as np
from _harness import check, check_close, expect_error, main
from mpi4py import MPI

import scaleout as so

r0 = MPI.COMM_WORLD.rank
EVEN = MPI.COMM_WORLD.Split(r0 % 2, r0)
BY_COMM = so.ProcessSet(EVEN)


def body():
    r, n = so.rank(), so.size()
    evens = list(range(0, n, 2))
    # Every rank's set is registered on every rank, in the order of the first rank giving it.
    check(
        BY_COMM.process_set_id == 1 + r % 2
        and BY_COMM.ranks == (evens if r % 2 == 0 else list(range(1, n, 2))),
        f"a set from a communicator: {BY_COMM}",
    )
    total = so.allreduce(np.array([float(r)]), op=so.Sum, process_set=BY_COMM)
    check_close(total, [float(sum(BY_COMM.ranks))], "allreduce on the communicator's set")
    expect_error(
        so.InvalidArgumentError,
        lambda: so.add_process_set([0]),
        "SCALEOUT_DYNAMIC_PROCESS_SETS=1",
        what="add without dynamic sets",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.remove_process_set(BY_COMM),
        "dynamic process sets are off",
        what="remove without dynamic sets",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.ones(1), process_set="evens"),
        "process_set must be a ProcessSet",
        what="not a ProcessSet",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.ProcessSet(["0"]),
        "list of ranks",
        what="ranks that are not ints",
    )


if __name__ == "__main__":
    # Each rank registers the set of its own communicator (even ranks or odd ranks): as in
    # Horovod, every rank passes a communicator it belongs to, and the sets differ by rank.
    expect_error(
        so.InvalidArgumentError,
        lambda: so.init(process_sets="bogus"),
        "list of ProcessSet objects or 'dynamic'",
        what="init's argument",
    )
    main(body, process_sets=[BY_COMM])
