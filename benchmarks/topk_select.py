#!/usr/bin/env python
"""Top-k selection on the CPU (Compression.topk's, Note [Top-k sparsification]): scaleout's
sampled-threshold selection beside numpy's full argpartition and torch.topk, one process, one
thread.

    python benchmarks/topk_select.py [--iters 30]

For each size (float32, standard normal entries) and density: the median time of `iters`
selections by each method, methods interleaved per iteration, and the ratios. Every method's
selection is checked to hold the same magnitudes as a full sort's first k.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from time import perf_counter as perf

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from _common import CheckFailed, cpu_model, fmt_time, table  # noqa: E402

from scaleout._topk import select_topk, topk_count  # noqa: E402

SIZES = [65_536, 1 << 20, 4 << 20, 16 << 20]
DENSITIES = [0.001, 0.01]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    print(
        f"# top-k selection, float32; cpu={cpu_model()} python={platform.python_version()} "
        f"numpy={np.__version__}"
        + (f" torch={torch.__version__}" if torch else "")
        + f"; median of {args.iters}, 1 thread"
    )
    rows = []
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = rng.standard_normal(n).astype(np.float32)
        scratch = np.empty_like(x)
        for density in DENSITIES:
            k = topk_count(n, density)
            methods = {
                "scaleout (sampled)": lambda: select_topk(x, k, 7, scratch),
                "np.argpartition": lambda: np.argpartition(np.abs(x), n - k)[n - k :],
            }
            if torch is not None:
                t = torch.from_numpy(x)
                methods["torch.topk"] = lambda: torch.topk(t.abs(), k, sorted=False)[1].numpy()
            want = np.sort(np.abs(x))[::-1][:k]
            for name, fn in methods.items():
                got = np.sort(np.abs(x[fn()]))[::-1]
                if not np.array_equal(got, want):
                    raise CheckFailed(f"{name}: not the top {k} of {n}")
            times = {name: [] for name in methods}
            for _ in range(args.iters):
                for name, fn in methods.items():
                    t0 = perf()
                    fn()
                    times[name].append(perf() - t0)
            med = {name: statistics.median(v) for name, v in times.items()}
            ours = med["scaleout (sampled)"]
            rows.append(
                [f"{n:,}", f"{density:g}", f"{k:,}"]
                + [fmt_time(med[m]) for m in methods]
                + [f"{med[m] / ours:.1f}x" for m in methods if m != "scaleout (sampled)"]
            )
    headers = ["entries", "density", "k", *methods] + [
        f"{m} / scaleout" for m in methods if m != "scaleout (sampled)"
    ]
    for line in table(rows, headers, ["r"] * len(headers)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
