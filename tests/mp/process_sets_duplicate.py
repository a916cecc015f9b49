"""Run by tests/test_process_sets.py::test_a_set_given_twice_at_init_is_a_value_error.

As Horovod's init: the same ranks twice in init(process_sets=...), in any order, raise a
ValueError naming the later entry, on every rank; a correct init in the same process then
works, and its sets run collectives."""

import torch
from _harness import check, main

import scaleout.torch as hvd

refused = None
try:
    hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 0])])
except ValueError as exc:
    refused = exc
first, pair = hvd.ProcessSet([0]), hvd.ProcessSet([0, 1])


def body():
    check(
        refused is not None and "process_sets entry number 2 is a duplicate" in str(refused),
        f"the duplicate refused: {refused!r}",
    )
    check(first.process_set_id is not None and pair.process_set_id is not None, f"{first} {pair}")
    if pair.included():
        got = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, process_set=pair)
        check(got.tolist() == [3.0], f"allreduce on {pair}: {got}")


main(body, process_sets=[first, pair])
