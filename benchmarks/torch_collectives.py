#!/usr/bin/env python
"""torch.distributed's all_reduce through the "scaleout" backend beside scaleout's own numpy
allreduce and beside gloo, in the same job (issue 25's figure).

    scaleoutrun -np 2 python benchmarks/torch_collectives.py [--blocks 8] [--seconds 0.3]

float32 Sum, in place, back to back: `dist.all_reduce(t)` on a torch tensor over the default
process group ("scaleout", Note [torch.distributed backend]), `so.allreduce_(x, op=so.Sum)`
on a numpy array of the same size (the numpy API's synchronous call), the same call on the
tensor's own memory (`t.numpy()`: torch's allocator places and pages large tensors differently
from numpy, which asks for huge pages from 4 MiB; this column takes that out of the
comparison), and `dist.all_reduce(t, group=gloo)` over a gloo group of the same ranks. Each
case runs in blocks of back-to-back calls for about --seconds; the four alternate block by
block so that the machine's state hits all alike; a block's time per call is the slowest
rank's, and the table gives the median over blocks. Results are checked. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CheckFailed, back_to_back_medians, core_info, cpu_model, fmt_time, table  # noqa: E402

import scaleout as so  # noqa: E402
import scaleout.torch  # noqa: E402,F401  (registers the backend)

SIZES = (("4 KiB", 1 << 10), ("64 KiB", 1 << 14), ("1 MiB", 1 << 18), ("16 MiB", 1 << 22))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=8, help="blocks per case and size")
    p.add_argument("--seconds", type=float, default=0.3, help="length of one block")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("scaleout")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    from mpi4py import MPI  # after scaleout started MPI (Note [PMI bootstrap])

    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for label, elements in SIZES:
        t = torch.ones(elements)
        g = torch.ones(elements)
        x = np.ones(elements, np.float32)
        v = torch.ones(elements).numpy()
        cases = [
            lambda t=t: dist.all_reduce(t),  # over the "scaleout" default group
            lambda x=x: so.allreduce_(x, op=so.Sum, name="numpy"),
            lambda v=v: so.allreduce_(v, op=so.Sum, name="tensor memory"),
            lambda g=g: dist.all_reduce(g, group=gloo),
        ]
        # Timed over MPI, whose small collectives cost microseconds, not over gloo.
        ours, numpy_, view, gloo_ = back_to_back_medians(cases, args.blocks, args.seconds, comm, 20)
        rows.append(
            (
                label,
                fmt_time(ours),
                fmt_time(numpy_),
                f"{ours / numpy_:.2f}",
                fmt_time(view),
                f"{ours / view:.2f}",
                fmt_time(gloo_),
                f"{ours / gloo_:.2f}",
            )
        )
    for label, elements in SIZES:  # one call on fresh values, checked
        t = torch.full((elements,), float(rank + 1))
        dist.all_reduce(t)
        if not torch.all(t == n * (n + 1) / 2):
            raise CheckFailed(f"dist.all_reduce of {label} gave {t[:4].tolist()}")
    if rank == 0:
        print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {n} ranks, {cpu_model()}; {core_info()}")
        print(
            f"# torch {torch.__version__}; float32 Sum in place, back to back, medians of "
            f"{args.blocks} blocks of ~{args.seconds} s each (slowest rank per block)"
        )
        headers = [
            "size",
            "dist.all_reduce (scaleout)",
            "so.allreduce_ (numpy)",
            "ratio",
            "so.allreduce_ (t.numpy())",
            "ratio",
            "dist.all_reduce (gloo)",
            "ratio",
        ]
        print("\n".join(table(rows, headers, ["l"] + ["r"] * 7)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
