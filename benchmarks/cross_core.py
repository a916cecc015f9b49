#!/usr/bin/env python
"""This VM's slow state (issue 27): a 64 MiB allreduce beside the machine's copy rates, job by job.

    python benchmarks/cross_core.py [--runs 30]

Starts --runs 2-rank jobs one after another (`scaleoutrun -np 2`, this script with --worker).
Each job times scaleout's in-place 64 MiB float32 allreduce (the median of 10, after 3
warm-ups), then two copies on rank 0 (the best of 5 or 8): "cross-core", 4 MiB that rank 1 has
just written into a shared buffer (their lines in the other CPU's caches or beyond), and
"private", 64 MiB between two of its own buffers. The table lists the jobs by allreduce time;
the last lines compare the cross-core rate of the slow jobs (over twice the fastest job's
time) with the others'. Rank 0 of each job prints its line.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

perf = time.perf_counter
LINE = re.compile(r"allreduce ([\d.]+) ms cross-core ([\d.]+) GB/s private ([\d.]+) GB/s")


def best(fn, times: int) -> float:
    out = []
    for _ in range(times):
        t = perf()
        fn()
        out.append(perf() - t)
    return min(out)


def worker() -> None:
    from multiprocessing import shared_memory

    import numpy as np

    import scaleout as so

    so.init()
    x = np.zeros(16 << 20, np.float32)  # 64 MiB; zeros stay zeros under Sum
    for _ in range(3):
        so.allreduce_(x, name="cross_core.64MiB")
    times = []
    for _ in range(10):
        so.barrier()
        t = perf()
        so.allreduce_(x, name="cross_core.64MiB")
        times.append(perf() - t)
    allreduce = statistics.median(times)

    nbytes = 4 << 20
    name = so.broadcast_object(None if so.rank() else f"so-cross-core-{os.getpid()}", 0)
    if so.rank() == 0:
        sm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
    so.barrier()
    if so.rank() != 0:
        sm = shared_memory.SharedMemory(name=name)
    shared = np.ndarray(nbytes // 4, np.float32, buffer=sm.buf)
    mine = np.zeros(nbytes // 4, np.float32)
    reads = []
    for k in range(8):
        if so.rank() == 1:
            shared.fill(k)
        so.barrier()
        if so.rank() == 0:
            reads.append(best(lambda: np.copyto(mine, shared), 1))
        so.barrier()
    a, b = np.ones(16 << 20, np.float32), np.zeros(16 << 20, np.float32)
    private = best(lambda: np.copyto(b, a), 5)
    if so.rank() == 0:
        cross = nbytes / 2**30 / min(reads)
        print(
            f"allreduce {allreduce * 1e3:.1f} ms cross-core {cross:.1f} GB/s "
            f"private {0.0625 / private:.1f} GB/s",
            flush=True,
        )
    shared = mine = None  # the shared buffer is closed below: no array may hold it
    so.barrier()
    sm.close()
    if so.rank() == 0:
        sm.unlink()
    so.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker()
        return 0
    launcher = Path(sys.executable).with_name("scaleoutrun")
    cmd = [str(launcher), "-np", "2", sys.executable, str(Path(__file__).resolve()), "--worker"]
    rows = []
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}; {args.runs} jobs", flush=True)
    for _ in range(args.runs):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        found = LINE.search(out.stdout)
        if out.returncode != 0 or found is None:
            print(out.stdout[-2000:] + out.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(tuple(float(v) for v in found.groups()))
    rows.sort()
    print("| 64 MiB allreduce | cross-core read (4 MiB) | private copy (64 MiB) |")
    print("|---:|---:|---:|")
    for ms, cross, private in rows:
        print(f"| {ms:.1f} ms | {cross:.1f} GB/s | {private:.1f} GB/s |")
    slow = [r for r in rows if r[0] > 2 * rows[0][0]]
    fast = [r for r in rows if r[0] <= 2 * rows[0][0]]
    for what, group in (("fast", fast), ("slow", slow)):
        if group:
            print(
                f"# {what} jobs ({len(group)}): allreduce median "
                f"{statistics.median(r[0] for r in group):.1f} ms, cross-core median "
                f"{statistics.median(r[1] for r in group):.1f} GB/s, private median "
                f"{statistics.median(r[2] for r in group):.1f} GB/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
