#!/usr/bin/env python
"""Small collectives back to back: scaleout beside mpi4py on the same MPI, in the same run.

    scaleoutrun -np 2 python benchmarks/small_collectives.py [--blocks 10] [--seconds 0.3]
    scaleoutrun -np 4 python benchmarks/small_collectives.py      # 4 ranks on 2 cores

A training loop's small collectives (a loss or metric allreduce, a barrier) follow one another
with nothing between them, unlike allreduce.py, which puts a barrier before every iteration.
Each case runs in blocks of back-to-back calls for about --seconds; the libraries alternate
block by block (A B B A ...) so that the machine's state hits both alike; a block's time per
call is the slowest rank's; the table gives the median over blocks. Cases: float32 Sum
allreduce of 4 KiB and 64 KiB in place (`so.allreduce_(x, name=...)`, the synchronous call:
Note [Caller drives]; beside `comm.Allreduce(MPI.IN_PLACE, x)`), the asynchronous form
(`so.synchronize(so.allreduce_async_(...))`, which hands the work to the coordinator thread),
and a barrier (`so.barrier()` beside `comm.Barrier()`). Results are checked. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CheckFailed, back_to_back_medians, core_info, cpu_model, fmt_time, table  # noqa: E402

import scaleout as so  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="blocks per library and case")
    p.add_argument("--seconds", type=float, default=0.3, help="length of one block")
    args = p.parse_args()
    so.init()
    comm = MPI.COMM_WORLD.Dup()
    n = comm.size
    rows = []
    for label, elements in (("4 KiB", 1024), ("64 KiB", 16384)):
        x = np.ones(elements, np.float32)
        y = np.ones(elements, np.float32)

        def scaleout_sync(x=x):
            so.allreduce_(x, op=so.Sum, name="small")

        def scaleout_async(x=x):
            so.synchronize(so.allreduce_async_(x, op=so.Sum, name="small.async"))

        def mpi(y=y):
            comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)

        rows.append((f"allreduce_ {label}", scaleout_sync, mpi))
        rows.append((f"allreduce_async_ + synchronize {label}", scaleout_async, mpi))
    rows.append(("barrier", so.barrier, comm.Barrier))

    out = []
    for name, ours, theirs in rows:
        a, b = back_to_back_medians([ours, theirs], args.blocks, args.seconds, comm, 200)
        out.append((name, fmt_time(a), fmt_time(b), f"{a / b:.2f}"))
    # The values grew by a factor of n per call; check one call's result on fresh data.
    for elements in (1024, 16384):
        x = np.full(elements, float(comm.rank + 1), np.float32)
        so.allreduce_(x, op=so.Sum, name="check")
        if not np.all(x == n * (n + 1) / 2):
            raise CheckFailed(f"allreduce_ of {elements} float32 gave {x[:4]}")
    if comm.rank == 0:
        print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {n} ranks, {cpu_model()}; {core_info()}")
        print(f"# back to back, medians of {args.blocks} blocks of ~{args.seconds} s each")
        print("\n".join(table(out, ["case", "scaleout", "mpi4py", "ratio"], ["l", "r", "r", "r"])))
    so.shutdown()


if __name__ == "__main__":
    main()
