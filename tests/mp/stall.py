"""Run by
tests/test_errors_and_lifecycle.py::test_stalled_collective_is_reported_with_the_missing_rank,
tests/test_process_sets.py::test_a_stall_inside_a_set_is_reported_on_its_ranks_naming_job_ranks,
tests/test_stall_shutdown.py::test_no_stall_shutdown_when_the_check_is_disabled.

A collective that one rank is late for: the others are warned, naming the missing rank.
With the argument `set`, the collective runs on a process set of ranks 1..n-1 while rank 0,
outside it, goes on with collectives of its own."""

import sys
import time

import numpy as np
from _harness import check, check_close, main

import scaleout as so


def run():
    r, n = so.rank(), so.size()
    on_set = SETS[0] if SETS else so.global_process_set
    if SETS and not on_set.included():
        for i in range(5):  # never held up by the set's stall
            so.allreduce(np.ones(1), name=f"own.{i}", process_set=SETS[1])
        return
    members = on_set.size()
    if r != n - 1:
        h = so.allreduce_async(np.ones(3), op=so.Sum, name="late.tensor", process_set=on_set)
        time.sleep(2.5)  # the scenario: the last rank is late, past the stall check time
        check(not so.poll(h), "not complete while a rank is missing")
        so.barrier(name="go", process_set=on_set)
    else:
        so.barrier(name="go", process_set=on_set)
        h = so.allreduce_async(np.ones(3), op=so.Sum, name="late.tensor", process_set=on_set)
    check_close(
        so.synchronize(h), np.full(3, float(members)), "completes once the late rank submits"
    )


if __name__ == "__main__":
    from mpi4py import MPI

    size = MPI.COMM_WORLD.size
    SETS = [so.ProcessSet(range(1, size)), so.ProcessSet([0])] if sys.argv[1:] == ["set"] else []
    main(run, process_sets=SETS or None)
