"""Run by tests/test_timeline.py::test_start_and_stop_timeline_at_run_time.

start_timeline/stop_timeline at run time, through scaleout.torch as a Horovod user calls them:
each stopped file is complete JSON holding only the collectives run while it was open, under
Horovod's torch names ("allreduce.<name>"); while it is open it already holds every finished
collective, with Horovod's event names; mark_cycles adds CYCLE_START marks; calls before init
raise ValueError as Horovod's.

argv[1]: a directory shared by the ranks."""

import os
import sys

import torch
from _harness import check, expect_error, finish
from _timeline import read

import scaleout.torch as hvd

directory = sys.argv[1]


def tensors_in(path):
    events, rows, _ = read(path)  # complete JSON as soon as stop_timeline() returned
    return set(rows.values()), [e for e in events if e.get("name") == "CYCLE_START"]


expect_error(
    ValueError,
    lambda: hvd.start_timeline(os.path.join(directory, "x.json")),
    "init",
    what="start_timeline before init",
)
hvd.init()
r = hvd.rank()
first, second = os.path.join(directory, "first.json"), os.path.join(directory, "second.json")
hvd.allreduce(torch.ones(4), name="before")
hvd.start_timeline(first, mark_cycles=True)
for _ in range(2):
    hvd.allreduce(torch.ones(4), name="during.first")
hvd.barrier()  # executed in a later step of the coordinator than the allreduces
if r == 0:
    # Note [Timeline]: written out while the job runs, whole JSON after each step's flush.
    events, rows, _ = read(first)
    names = {e.get("name") for e in events}
    check(
        {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"} <= names
        and "allreduce.during.first" in rows.values(),
        f"the open timeline holds the finished allreduces: {names}, {rows}",
    )
hvd.allgather(torch.ones(2, 2), name="during.gather")
hvd.stop_timeline()
hvd.allreduce(torch.ones(4), name="between")
hvd.start_timeline(second)
hvd.allreduce(torch.ones(4), name="during.second")
model = torch.nn.Linear(2, 1)  # its gradients under Horovod's names, "allreduce.<parameter>"
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
model(torch.ones(1, 2)).sum().backward()
opt.step()
hvd.stop_timeline()
hvd.stop_timeline()  # nothing open: does nothing
if r == 0:
    names, cycles = tensors_in(first)
    want = {"allreduce.during.first", "allgather.during.gather"}
    barriers = {name for name in names if name.startswith("barrier.")}
    check(names - barriers == want, f"first timeline holds {names}")
    check(len(cycles) >= 2, f"mark_cycles=True marks cycles ({len(cycles)})")
    names, cycles = tensors_in(second)
    want = {"allreduce.during.second", "allreduce.weight", "allreduce.bias"}
    check(names == want, f"second timeline holds {names}")
    check(not cycles, "mark_cycles=False marks none")
else:
    check(not os.path.exists(first) or os.path.getsize(first) > 0, "only rank 0 writes")
check(not os.path.exists("DYNAMIC"), "HOROVOD_TIMELINE=DYNAMIC names no file")
expect_error(ValueError, lambda: hvd.start_timeline(""), "file_path", what="empty path")
hvd.barrier()
hvd.shutdown()
expect_error(ValueError, lambda: hvd.stop_timeline(), "init", what="stop_timeline after shutdown")
finish()
