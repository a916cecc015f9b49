#!/usr/bin/env python
"""Autotune (HOROVOD_AUTOTUNE=1) against a grid sweep of the settings it tunes, in one launch.

    scaleoutrun -np 2 python benchmarks/autotune.py [--models mlp,cnn,dlrm] [--quick]
    python benchmarks/autotune.py --hosts 2 --rate 1gbit     # as root: its own launcher

With --hosts N it runs itself across tests/_hosts.py's network-namespace hosts, one rank each,
every link limited to --rate (benchmarks/_common.py's run_on_hosts).

Workloads (torch, SGD, fixed random data, 1 compute thread per rank): benchmarks/torch_step.py's
MLP 784-1024-1024-10 (batch 64 per rank) and CNN (batch 32 per rank), and examples/dlrm's DLRM
(26 tables of up to 20,000 rows sharded over the ranks and exchanged by alltoall, the dense
MLPs under DistributedOptimizer; global batch 256).

For each workload:
  grid      scaleout re-initialised with each fusion threshold x cycle time of the grid fixed
            (SCALEOUT_FUSION_THRESHOLD, SCALEOUT_CYCLE_TIME): --warmup steps, then --steps
            timed; the median step time (a step's time is the slowest rank's)
  autotune  re-initialised with HOROVOD_AUTOTUNE=1 and Horovod's other autotune variables at
            their defaults, --tune-steps steps (rank 0's CSV says where tuning ended and what it
            kept); then --steps timed steps in the same job, with what it kept
  confirm   the grid's best setting and the kept one, each re-initialised fixed, in alternating
            rounds (--rounds), so the machine's state changes hit both alike

Rank 0 prints the grid and one summary row per workload: the grid's best setting and its step
time, the configured default's, the kept setting, its step time in the autotune job and in the
confirm rounds, and the ratio kept / best (confirm rounds).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _common import run_on_hosts
from torch_step import CNN, MLP

import scaleout.torch as hvd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "dlrm"))

perf = time.perf_counter
FUSION_MIB = [0, 1, 4, 16, 64]
CYCLE_MS = [0, 1, 3, 10, 20]
DEFAULT = (64.0, 1.0)  # the core's defaults: 64 MiB, 1 ms


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default="mlp,cnn,dlrm")
    p.add_argument("--steps", type=int, default=30, help="timed steps per setting")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps after each init")
    p.add_argument("--tune-steps", type=int, default=200, help="steps of the autotune job")
    p.add_argument("--rounds", type=int, default=3, help="confirm rounds")
    p.add_argument("--threads", type=int, default=1, help="torch compute threads per rank")
    p.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    p.add_argument("--hosts", type=int, default=0, help="run across this many namespace hosts")
    p.add_argument("--rate", default="1gbit", help="with --hosts: each link's rate (tc tbf)")
    return p.parse_args()


def image_workload(model_cls, batch):
    def make():
        torch.manual_seed(0)
        model = model_cls()
        x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            named_parameters=model.named_parameters(),
        )

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    return make


def dlrm_workload(global_batch=256, dim=16):
    from data import NUM_CATEGORICAL, NUM_DENSE, default_table_sizes
    from model import DLRM, DenseArch, bce_loss
    from sharding import ShardedEmbeddings, plan_shards

    def make():
        size, rank = hvd.size(), hvd.rank()
        sizes = default_table_sizes()
        torch.manual_seed(0)
        dense_arch = DenseArch(NUM_CATEGORICAL, dim)
        embeddings = ShardedEmbeddings(plan_shards(sizes, size, 15000), rank, dim)
        model = DLRM(dense_arch, embeddings)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(dense_arch.parameters(), lr=0.5),
            named_parameters=dense_arch.named_parameters(),
        )
        held = list(embeddings.parameters())
        tables = torch.optim.SGD(held, lr=0.5) if held else None
        rng = np.random.default_rng(0)
        local = global_batch // size
        dense = torch.from_numpy(rng.random((local, NUM_DENSE), dtype=np.float32))
        ids = torch.from_numpy(np.stack([rng.integers(0, n, global_batch) for n in sizes], 1))
        labels = torch.from_numpy(rng.integers(0, 2, local).astype(np.float32))

        def step():
            opt.zero_grad()
            if tables is not None:
                tables.zero_grad()
            bce_loss(model(dense, ids), labels).backward()
            opt.step()
            if tables is not None:
                tables.step()

        return step

    return make


WORKLOADS = {
    "mlp": ("MLP 784-1024-1024-10", image_workload(MLP, 64)),
    "cnn": ("CNN (MNIST example net)", image_workload(CNN, 32)),
    "dlrm": ("DLRM (26 sharded tables)", dlrm_workload()),
}


def start(env: dict) -> None:
    """(Re)initialises scaleout with `env` set (None: unset)."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    hvd.init()


def fixed(fusion_mib: float, cycle_ms: float) -> dict:
    return {
        "SCALEOUT_AUTOTUNE": "0",
        "HOROVOD_AUTOTUNE": None,
        "SCALEOUT_FUSION_THRESHOLD": str(int(fusion_mib * 2**20)),
        "SCALEOUT_CYCLE_TIME": str(cycle_ms),
    }


def timed(step, count: int) -> list:
    times = []
    for _ in range(count):
        t0 = perf()
        step()
        times.append(perf() - t0)
    return hvd.allreduce(
        torch.tensor(times, dtype=torch.float64), op=hvd.Max, name="autotune.times"
    ).tolist()


def run_fixed(make, setting, args) -> list:
    start(fixed(*setting))
    step = make()
    for _ in range(args.warmup):
        step()
    times = timed(step, args.steps)
    hvd.shutdown()
    return times


def run_autotune(make, log: Path, args):
    """The autotune job: (kept setting or None, the step at which tuning ended, times after)."""
    start(
        {
            "SCALEOUT_AUTOTUNE": "1",
            "SCALEOUT_AUTOTUNE_LOG": str(log),
            "SCALEOUT_FUSION_THRESHOLD": None,
            "SCALEOUT_CYCLE_TIME": None,
        }
    )
    step = make()
    for _ in range(args.tune_steps):
        step()
    kept = None
    if hvd.rank() == 0:
        rows = list(csv.reader(log.read_text().splitlines()))[1:]
        max_samples = int(os.environ.get("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 16))
        if len(rows) == max_samples + 1:  # every sample scored, then the kept row
            kept = (float(rows[-1][5]), float(rows[-1][4]))
    kept = hvd.broadcast_object(kept, root_rank=0, name="autotune.kept")
    times = timed(step, args.steps)
    hvd.shutdown()
    os.environ.pop("SCALEOUT_AUTOTUNE_LOG", None)
    return kept, times


def median_ms(times) -> float:
    return statistics.median(times) * 1e3


def main():
    args = parse_args()
    if args.hosts:
        # The job's own arguments, rebuilt from the parsed ones (so --hosts cannot reach it).
        worker = ["--models", args.models, "--steps", str(args.steps)]
        worker += ["--warmup", str(args.warmup), "--tune-steps", str(args.tune_steps)]
        worker += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
        worker += ["--quick"] if args.quick else []
        sys.exit(run_on_hosts(__file__, worker, args.hosts, args.rate, "autotune benchmark"))
    if args.quick:
        args.steps, args.warmup, args.rounds = 5, 2, 1
    torch.set_num_threads(args.threads)
    grid = [(f, c) for f in FUSION_MIB for c in CYCLE_MS]
    out = []
    for key in args.models.split(","):
        label, make = WORKLOADS[key]
        if args.quick:
            grid = [(0, 0), DEFAULT]
        sweep = {s: median_ms(run_fixed(make, s, args)) for s in grid}
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "autotune.csv"
            kept, after = run_autotune(make, log, args)
        best = min(sweep, key=sweep.get)
        confirm = {best: [], DEFAULT: []}
        if kept is not None:
            confirm[kept] = []
        for r in range(args.rounds):
            order = list(confirm) if r % 2 == 0 else list(confirm)[::-1]
            for s in order:
                confirm[s] += run_fixed(make, s, args)
        out.append((label, sweep, best, kept, median_ms(after), confirm))
    from mpi4py import MPI  # the rank, with scaleout shut down

    if MPI.COMM_WORLD.rank != 0:
        return
    print(
        f"torch {torch.__version__}, {MPI.COMM_WORLD.size} ranks, median of {args.steps} steps "
        f"per setting (max over ranks); autotune job of {args.tune_steps} steps, Horovod's "
        "defaults"
    )
    for label, sweep, *_ in out:
        print(f"\n{label}: step time (ms) by fusion threshold (rows, MiB) and cycle time (ms)")
        cycles = sorted({c for _, c in sweep})
        print("| MiB \\ ms | " + " | ".join(f"{c:g}" for c in cycles) + " |")
        print("|---|" + "---|" * len(cycles))
        for f in sorted({f for f, _ in sweep}):
            cells = [f"{sweep[(f, c)]:.2f}" if (f, c) in sweep else "-" for c in cycles]
            print(f"| {f:g} | " + " | ".join(cells) + " |")
    print(
        "\n| workload | grid best | best (confirm) | default (confirm) | kept by autotune | "
        "autotune job after tuning | kept (confirm) | kept / best |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, _, best, kept, after, confirm in out:
        b = median_ms(confirm[best])
        d = median_ms(confirm[DEFAULT])
        k = median_ms(confirm[kept]) if kept is not None else float("nan")
        kept_text = f"{kept[0]:g} MiB, {kept[1]:g} ms" if kept else "tuning not over"
        print(
            f"| {label} | {best[0]:g} MiB, {best[1]:g} ms | {b:.2f} ms | {d:.2f} ms | "
            f"{kept_text} | {after:.2f} ms | {k:.2f} ms | {k / b:.3f} |"
        )


if __name__ == "__main__":
    main()
