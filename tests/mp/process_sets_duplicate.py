"""Run by tests/test_process_sets.py::test_a_set_given_twice_at_init_is_a_value_error.

As Horovod's init: the same ranks twice in init(process_sets=...), in any order, raise a
ValueError naming the later entry, on every rank; a correct init in the same process then
works, and its sets run collectives."""

import torch
from _harness import check, main
from mpi4py import MPI

import scaleout.torch as hvd

n = MPI.COMM_WORLD.size
two = [0, 1] if n > 2 else [1]  # (at 2 ranks [0, 1] is every rank: the global set's)
refused = everyone = None
try:
    hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet(two), hvd.ProcessSet(two[::-1])])
except ValueError as exc:
    refused = exc
# A set of every rank is the global set's: a duplicate too (Horovod's init counts the global
# set as seen before the list).
try:
    hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet(range(hvd.size()))])
except ValueError as exc:
    everyone = exc
first, pair = hvd.ProcessSet([0]), hvd.ProcessSet(two)


def body():
    check(
        refused is not None and "process_sets entry number 2 is a duplicate" in str(refused),
        f"the duplicate refused: {refused!r}",
    )
    check(
        everyone is not None and "process_sets entry number 1 is a duplicate" in str(everyone),
        f"a set of every rank refused: {everyone!r}",
    )
    check(first.process_set_id is not None and pair.process_set_id is not None, f"{first} {pair}")
    if pair.included():
        got = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, process_set=pair)
        want = float(sum(q + 1 for q in two))
        check(got.tolist() == [want], f"allreduce on {pair}: {got}")


main(body, process_sets=[first, pair])
