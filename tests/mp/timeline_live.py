"""Run by tests/test_timeline.py::test_horovod_timeline_is_whole_json_while_the_job_runs, with
HOROVOD_TIMELINE=argv[1] and HOROVOD_TIMELINE_MARK_CYCLES=1 set before init, through
scaleout.torch as a Horovod user writes it.

Rank 0 reads the file while the job runs: after the first allreduce (and a barrier, which the
coordinator runs in a later step than the allreduce, so the step that ran it has written it
out) it is a whole JSON array holding allreduce.test_allreduce's negotiation and execution and
cycle marks, under Horovod's names; a collective still waiting for a rank shows as a
negotiation begun and not ended, in a file that is still whole JSON."""

import sys

import torch
from _harness import check, main
from _timeline import read
from mpi4py import MPI

import scaleout.torch as so

path = sys.argv[1]


def run():
    r = so.rank()
    so.allreduce(torch.ones(4), name="test_allreduce")
    so.barrier()
    if r == 0:
        events, rows, spans = read(path)  # json.load: whole JSON while the job runs
        names = {e.get("name") for e in events}
        mine = [(s["name"], s["end"] is not None) for s in spans if s["tensor"] == rows.get(1)]
        check(
            rows.get(1) == "allreduce.test_allreduce"
            and mine == [("NEGOTIATE_ALLREDUCE", True), ("ALLREDUCE", True)]
            and "CYCLE_START" in names,
            f"after the first allreduce: rows {rows}, its spans {mine}, events {names}",
        )
    # Rank 0 submits 'late' and then 'fence'; the others run 'fence' first and submit 'late'
    # only once rank 0 says so: when fence is done, rank 0's coordinator has taken 'late'.
    world = MPI.COMM_WORLD
    if r == 0:
        late = so.allreduce_async(torch.ones(2), op=so.Sum, name="late")
        so.allreduce(torch.ones(2), name="fence")
        so.barrier()  # a later step: the one that ran fence has written it out
    else:
        so.allreduce(torch.ones(2), name="fence")
        so.barrier()
    if r == 0:
        _, rows, spans = read(path)
        waiting = [s for s in spans if s["tensor"] == "allreduce.late"]
        check(
            [(s["name"], s["end"]) for s in waiting] == [("NEGOTIATE_ALLREDUCE", None)],
            f"a collective waiting for the other ranks: {waiting}",
        )
    world.bcast("go", root=0)
    if r != 0:
        late = so.allreduce_async(torch.ones(2), op=so.Sum, name="late")
    got = so.synchronize(late).tolist()
    check(got == [float(so.size())] * 2, f"late: {got}")
    so.shutdown()
    if r == 0:
        _, rows, spans = read(path)
        done = [(s["name"], s["end"] is not None) for s in spans if s["tensor"] == "allreduce.late"]
        check(
            done == [("NEGOTIATE_ALLREDUCE", True), ("ALLREDUCE", True)], f"after shutdown: {done}"
        )


if __name__ == "__main__":
    main(run)
