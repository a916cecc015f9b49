#!/usr/bin/env python
"""DLRM benchmark: scaleout's hybrid layout beside torch DDP with replicated tables, and the
alltoall DLRM exchanges beside mpi4py's Alltoallv, in one run.

    python benchmarks/dlrm.py                       # 1, 2 and 4 ranks, every part
    python benchmarks/dlrm.py --quick               # a smoke run: 30-45 s on 2 cores
    python benchmarks/dlrm.py --part alltoall --ranks 2,4
    python benchmarks/dlrm.py --ranks 2 --batch-size 4096 --embedding-dim 64 --steps 100

The script is its own launcher: run it with plain python (not under mpiexec or scaleoutrun).
It writes one synthetic Criteo-format file (examples/dlrm/data.py's generator) to a temporary
directory, then for every rank count starts

  - scaleout: `mpiexec -n N python benchmarks/dlrm.py --worker scaleout ...` (the venv's
    mpiexec). The model is examples/dlrm's: tables sharded over the ranks (plan_shards, tables
    above --row-wise-threshold rows split by rows), one differentiable scaleout.torch.alltoall of
    the pooled embeddings forward and one backward (ShardedEmbeddings), the MLPs under
    scaleout.torch.DistributedOptimizer, the tables stepped by a local SGD on their sparse
    gradients;
  - DDP: N processes `python benchmarks/dlrm.py --worker ddp ...` with RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT set (init_process_group("gloo"), env://), no MPI and no
    scaleout loaded. The same DLRM with every table replicated on every rank
    (model.LocalEmbeddings with sparse=False: DDP allreduces dense table gradients), wrapped
    whole in DistributedDataParallel, one SGD over all parameters. This is what a user would
    write without scaleout.

Both train the same model (same seed, same initial weights) on the same global batches with the
same learning rate, the same number of steps: on every rank count the two final losses printed
should agree to rounding. Batches are parsed from the file before timing (data reading is not
timed) and cycled.

Timing of a training step. Ranks run their steps back to back (no barrier: the collectives in a
step keep them in step). A step's time is the slowest rank's; samples/s = global batch / the
median step time (column "wall samples/s": timed steps x global batch / the loop's wall time).
The scaleout step is split from outside examples/dlrm, without changing it:
  - forward of the embeddings = ShardedEmbeddings(ids); the scaleout.torch.alltoall it calls
    is timed by a stand-in for the `so` module that sharding.py imported (the forward call,
    and the backward through pre- and post-hooks on the autograd node the call returns);
  - the rest runs as train.py's step does, but with the backward in two stages: the MLPs'
    forward and backward on a detached copy of the received embeddings (loss.backward(); this
    is where DistributedOptimizer's hooks submit the allreduces), then the embeddings' backward
    with that copy's gradient. The gradients are train.py's, and the order is the one CPU
    autograd takes in train.py's single backward (nodes by creation, newest first: the bottom
    MLP, created after the lookups, goes before them).
  Columns: "lookup" = embeddings forward + backward minus the alltoalls (the EmbeddingBag
  lookups, id checks, stacking, placing received slots, the sparse gradients); "alltoall" =
  both alltoalls, including any wait for the slowest rank and for allreduces queued before the
  backward one in the core ("of which bwd": the backward one alone); "MLP" = dense forward,
  loss and backward; "allreduce wait + SGD" = DistributedOptimizer.step() (waits for the MLP
  gradients' allreduces, then SGD on the MLPs); "table SGD" = the local sparse SGD step of this
  rank's tables; "other" = the rest (zero_grad, Python). Each is the median over steps of the
  mean over ranks, so they need not add up to the step column exactly. DDP's step is split into
  forward, backward (with DDP's overlapped gloo allreduces of every gradient, tables included)
  and SGD.

Alltoall table (ranks >= 2): the [B * T_r, D] float32 pooled embeddings a forward alltoall moves
(rank r holds T_r table shards under the same plan as training; b = B / N rows of each go to
each rank), for global batches --a2a-batches and dims --a2a-dims: scaleout's numpy
`so.alltoall(x, splits=...)`, scaleout.torch.alltoall (what ShardedEmbeddings calls, without
autograd), mpi4py `comm.Alltoallv` with receive counts known and the receive buffer
preallocated, and mpi4py with the counts exchanged first (`comm.Alltoall` of the counts, a fresh
receive buffer, then Alltoallv: what scaleout's alltoall has to do, as it is given only the send
splits). Method as benchmarks/allreduce.py's: warm-up, methods in alternating blocks, a barrier
before each iteration, an iteration's time is the maximum over ranks, medians reported, each
result checked once.

Ranks beyond the machine's cores are oversubscribed (4 ranks on a 2-core machine): the tables
say so; such numbers measure time-slicing as much as communication.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Bench, CheckFailed, cpu_model, cpuset, fmt_time, free_port, table

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "dlrm"
sys.path.insert(0, str(EXAMPLE_DIR))

KiB = 1024
MiB = 1024 * KiB
perf = time.perf_counter

PHASES = ["lookup", "alltoall", "mlp", "allreduce_wait", "table_sgd", "other"]
PHASE_LABELS = [
    "emb lookup f+b",
    "alltoall f+b",
    "MLP f+b",
    "allreduce wait + MLP SGD",
    "table SGD (sparse)",
    "other",
]
DDP_PHASES = ["forward", "backward", "sgd"]
DDP_LABELS = ["forward", "backward + gloo allreduce", "SGD (dense, all tables)"]


# ---- arguments ----


def int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers like 1,2,4") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--part",
        choices=["train", "ddp", "alltoall", "all"],
        default="all",
        help="train: scaleout training; ddp: the DDP baseline; alltoall: the "
        "alltoall table; all (default): the three",
    )
    p.add_argument(
        "--ranks",
        type=int_list,
        default=None,
        help="rank counts, e.g. 1,2,4 (default; the alltoall table skips 1)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed training steps per launch (default 40; --quick: 8)",
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 5; --quick: 2)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="launches of each of scaleout and DDP per rank count, alternating "
        "which goes first (default 2; --quick: 1); steps of all rounds pooled",
    )
    p.add_argument("--batch-size", type=int, default=2048, help="global batch (default 2048)")
    p.add_argument("--tables", type=int, default=26, help="embedding tables (default 26)")
    p.add_argument("--embedding-dim", type=int, default=16, help="default 16")
    p.add_argument(
        "--table-rows",
        type=int,
        default=20000,
        help="rows of each table: Criteo's cardinalities capped at this (default "
        "20000, as examples/dlrm)",
    )
    p.add_argument(
        "--row-wise-threshold",
        type=int,
        default=15000,
        help="scaleout splits tables with more rows by rows over every rank "
        "(default 15000, as examples/dlrm/train.py)",
    )
    p.add_argument("--bottom-mlp", type=int_list, default=[64], help="default 64")
    p.add_argument("--top-mlp", type=int_list, default=[64, 32], help="default 64,32")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument(
        "--distinct-batches",
        type=int,
        default=None,
        help="global batches in the synthetic file, cycled (default 4; --quick: 2)",
    )
    p.add_argument(
        "--a2a-batches",
        type=int_list,
        default=[256, 2048, 4096],
        help="global batches of the alltoall table (default 256,2048,4096)",
    )
    p.add_argument(
        "--a2a-dims",
        type=int_list,
        default=[16, 64],
        help="embedding dims of the alltoall table (default 16,64)",
    )
    p.add_argument(
        "--a2a-iters",
        type=int,
        default=None,
        help="timed alltoall iterations up to 2 MiB sent per rank, fewer above "
        "(default 200; --quick: 30)",
    )
    p.add_argument("--quick", action="store_true", help="a short run (CI smoke), under a minute")
    p.add_argument(
        "--launch-timeout",
        type=float,
        default=None,
        help="seconds one launch may take (default 900; --quick: 180)",
    )
    # internal: how the launcher starts its workers
    p.add_argument("--worker", choices=["scaleout", "ddp"], help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument(
        "--worker-part",
        choices=["train", "alltoall", "both"],
        default="both",
        help=argparse.SUPPRESS,
    )
    a = p.parse_args(argv)
    quick = a.quick
    a.ranks = a.ranks or [1, 2, 4]
    a.steps = a.steps if a.steps is not None else (8 if quick else 40)
    a.warmup = a.warmup if a.warmup is not None else (2 if quick else 5)
    a.rounds = a.rounds if a.rounds is not None else (1 if quick else 2)
    a.distinct_batches = a.distinct_batches or (2 if quick else 4)
    a.a2a_iters = a.a2a_iters or (30 if quick else 200)
    a.launch_timeout = a.launch_timeout or (180.0 if quick else 900.0)
    if a.steps < 1 or a.rounds < 1 or a.warmup < 0:
        p.error("--steps and --rounds must be at least 1, --warmup at least 0")
    if a.worker is None:
        bad = [n for n in a.ranks if a.batch_size % n]
        if bad and a.part != "alltoall":
            p.error(f"--batch-size {a.batch_size} does not split evenly over {bad} ranks")
    return a


def table_sizes(args) -> list:
    from data import default_table_sizes

    return default_table_sizes(cap=args.table_rows, count=args.tables)


# ---- formatting ----


def fmt_size(nbytes: float) -> str:
    if nbytes >= MiB:
        return f"{nbytes / MiB:.2f} MiB"
    return f"{nbytes / KiB:.1f} KiB"


def median(values) -> float:
    import statistics

    return float(statistics.median(values)) if len(values) else float("nan")


# ---- what every worker reports about itself ----


def affinity() -> str:
    try:
        return cpuset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return "?"


def load_batches(args, path: Path, rank: int, size: int) -> list:
    """The first --distinct-batches global batches of the file, as this rank's tensors:
    (dense [b, 13], labels [b], ids of the whole global batch [B, T])."""
    import torch
    from data import local_batches

    batches = []
    for batch in local_batches(path, args.batch_size, table_sizes(args), rank, size):
        batches.append(
            (
                torch.from_numpy(batch.dense),
                torch.from_numpy(batch.labels),
                torch.from_numpy(batch.ids),
            )
        )
        if len(batches) == args.distinct_batches:
            break
    if not batches:
        raise SystemExit(f"{path} holds less than one global batch ({args.batch_size} rows)")
    return batches


# ---- scaleout worker ----


class TimedAlltoall:
    """Stands in for scaleout.torch inside examples/dlrm/sharding.py (its module global `so`):
    every attribute is the real module's, except alltoall, whose forward is timed around the
    call and whose backward is timed by a pre-hook and a post-hook on the autograd node that the
    call's output comes from (the reverse alltoall runs inside that node)."""

    def __init__(self, module):
        self._module = module
        self.forward = 0.0
        self.backward = 0.0
        self._backward_start = 0.0

    def __getattr__(self, name):
        return getattr(self._module, name)

    def alltoall(self, tensor, *args, **kwargs):
        t0 = perf()
        result = self._module.alltoall(tensor, *args, **kwargs)
        self.forward += perf() - t0
        out = result[0] if isinstance(result, tuple) else result
        if out.grad_fn is not None:
            out.grad_fn.register_prehook(self._start)
            out.grad_fn.register_hook(self._end)
        return result

    def _start(self, grad_outputs):
        self._backward_start = perf()

    def _end(self, grad_inputs, grad_outputs):
        self.backward += perf() - self._backward_start

    def take(self) -> tuple:
        times = (self.forward, self.backward)
        self.forward = self.backward = 0.0
        return times


def scaleout_train(args, comm, path: Path) -> dict:
    import numpy as np
    import sharding
    import torch
    from model import DenseArch, bce_loss

    import scaleout.torch as sot

    rank, n = sot.rank(), sot.size()
    torch.set_num_threads(args.threads)
    sizes = table_sizes(args)
    plan = sharding.plan_shards(sizes, n, args.row_wise_threshold)
    torch.manual_seed(args.seed)
    dense_arch = DenseArch(len(sizes), args.embedding_dim, args.bottom_mlp, args.top_mlp)
    embeddings = sharding.ShardedEmbeddings(plan, rank, args.embedding_dim, seed=args.seed)
    sot.broadcast_parameters(dense_arch.state_dict(), root_rank=0)
    dense_optimizer = sot.DistributedOptimizer(
        torch.optim.SGD(dense_arch.parameters(), lr=args.lr),
        named_parameters=dense_arch.named_parameters(),
    )
    held = list(embeddings.parameters())
    table_optimizer = torch.optim.SGD(held, lr=args.lr) if held else None
    timer = TimedAlltoall(sharding.so)
    sharding.so = timer
    batches = load_batches(args, path, rank, n)

    def step(batch) -> list:
        dense, labels, ids = batch
        t0 = perf()
        dense_optimizer.zero_grad()
        if table_optimizer is not None:
            table_optimizer.zero_grad()
        t1 = perf()
        embedded = embeddings(ids)  # lookups + forward alltoall
        t2 = perf()
        received = embedded.detach().requires_grad_()
        loss = bce_loss(dense_arch(dense, received), labels)
        loss.backward()  # MLPs; allreduces submitted by hooks
        t3 = perf()
        embedded.backward(received.grad)  # backward alltoall + lookups' backward
        t4 = perf()
        dense_optimizer.step()  # waits for the allreduces
        t5 = perf()
        if table_optimizer is not None:
            table_optimizer.step()
        t6 = perf()
        a2a_forward, a2a_backward = timer.take()
        phases = [
            (t2 - t1 - a2a_forward) + (t4 - t3 - a2a_backward),
            a2a_forward + a2a_backward,
            t3 - t2,
            t5 - t4,
            t6 - t5,
        ]
        total = t6 - t0
        losses.append(loss.detach())
        return phases + [total - sum(phases), total, a2a_backward]

    losses = []
    for i in range(args.warmup):
        step(batches[i % len(batches)])
    comm.Barrier()
    records = []
    start = perf()
    for i in range(args.warmup, args.warmup + args.steps):
        records.append(step(batches[i % len(batches)]))
    elapsed = perf() - start
    local = np.asarray(records, dtype=np.float64)  # [steps, phases + step + a2a bwd]
    everyone = comm.gather(local, root=0)
    elapsed = comm.reduce(elapsed, op=_mpi().MAX, root=0)
    final_loss = comm.allreduce(float(losses[-1])) / n  # equal local batches
    sharding.so = timer._module
    if rank != 0:
        return {}
    stacked = np.stack(everyone)  # [ranks, steps, columns]
    columns = PHASES + ["step", "alltoall_backward"]
    return {
        "step_max": stacked[:, :, columns.index("step")].max(axis=0).tolist(),
        "phases": {name: stacked[:, :, k].mean(axis=0).tolist() for k, name in enumerate(columns)},
        "wall": elapsed,
        "final_loss": final_loss,
        "shards": [len(s) for s in plan.shards],
    }


def _mpi():
    from mpi4py import MPI

    return MPI


def alltoall_bench(args, comm) -> list:
    """One row per (global batch, dim): the medians of the four alltoall methods."""
    import numpy as np
    import torch
    from sharding import plan_shards

    import scaleout as so
    import scaleout.torch as sot

    MPI = _mpi()
    rank, n = comm.rank, comm.size
    plan = plan_shards(table_sizes(args), n, args.row_wise_threshold)
    held = [len(s) for s in plan.shards]
    bench = Bench(comm)
    rows = []
    for batch in args.a2a_batches:
        if batch % n:
            continue
        local = batch // n
        for dim in args.a2a_dims:
            out_rows = local * held[rank]  # rows to each rank
            in_rows = [local * h for h in held]  # rows from each rank
            send = np.empty((n * out_rows, dim), dtype=np.float32)
            for q in range(n):
                send[q * out_rows : (q + 1) * out_rows] = rank * 1000 + q
            send_t = torch.from_numpy(send)
            splits = [out_rows] * n
            counts = np.array([out_rows * dim] * n, dtype=np.int64)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            rcounts = np.array([r * dim for r in in_rows], dtype=np.int64)
            rdispls = np.concatenate([[0], np.cumsum(rcounts)[:-1]])
            recv = np.empty((sum(in_rows), dim), dtype=np.float32)
            name = f"bench.dlrm.a2a.{batch}.{dim}"
            tname = f"bench.dlrm.a2a.torch.{batch}.{dim}"
            counts32 = np.array([out_rows * dim] * n, dtype=np.int32)
            got32 = np.empty(n, dtype=np.int32)

            def check(what, received):
                start = 0
                for q in range(n):
                    part = np.asarray(received)[start : start + in_rows[q]]
                    if part.shape != (in_rows[q], dim) or not (part == q * 1000 + rank).all():
                        raise CheckFailed(
                            f"{what} (batch {batch}, dim {dim}): wrong rows from rank {q}"
                        )
                    start += in_rows[q]

            def so_numpy():
                return so.alltoall(send, splits=splits, name=name)[0]

            def so_torch():
                return sot.alltoall(send_t, splits=splits, name=tname)[0]

            def mpi_known():
                comm.Alltoallv(
                    [send, (counts, displs), MPI.FLOAT], [recv, (rcounts, rdispls), MPI.FLOAT]
                )

            def mpi_exchanged():
                comm.Alltoall(counts32, got32)
                out = np.empty((int(got32.sum()) // dim, dim), dtype=np.float32)
                got = got32.astype(np.int64)
                comm.Alltoallv(
                    [send, (counts, displs), MPI.FLOAT],
                    [out, (got, np.concatenate([[0], np.cumsum(got)[:-1]])), MPI.FLOAT],
                )
                return out

            check("scaleout alltoall", so_numpy())
            check("scaleout.torch alltoall", so_torch().numpy())
            mpi_known()
            check("mpi4py Alltoallv", recv)
            check("mpi4py Alltoall + Alltoallv", mpi_exchanged())
            # Ranks may hold different numbers of shards: every count is the largest rank's,
            # so that all ranks run the same number of iterations.
            most = comm.allreduce(send.nbytes, op=MPI.MAX)
            peer = comm.allreduce(out_rows * dim * 4, op=MPI.MAX)
            iters = max(
                min(10, args.a2a_iters),
                min(args.a2a_iters, int(args.a2a_iters * 2 * MiB // max(most, 1))),
            )
            times = bench.interleaved(
                [so_numpy, so_torch, mpi_known, mpi_exchanged],
                iters,
                warmup=3 if most >= 16 * MiB else 10,
            )
            rows.append(
                {
                    "batch": batch,
                    "dim": dim,
                    "send_bytes": most,
                    "peer_bytes": peer,
                    "iters": iters,
                    "medians": [float(np.median(t)) for t in times],
                }
            )
    return rows


def scaleout_worker(args) -> None:
    from mpi4py import MPI

    import scaleout.torch as sot

    comm = MPI.COMM_WORLD.Dup()
    sot.init()
    result = {"ranks": comm.size}
    try:
        if args.worker_part in ("train", "both"):
            result["train"] = scaleout_train(args, comm, args.data)
        if args.worker_part in ("alltoall", "both") and comm.size > 1:
            result["alltoall"] = alltoall_bench(args, comm)
    except CheckFailed as e:
        print(f"rank {comm.rank}: {e}", file=sys.stderr, flush=True)
        comm.Abort(1)
    affinities = comm.gather(affinity(), root=0)
    if comm.rank == 0:
        result["info"] = worker_info(affinities)
        args.result.write_text(json.dumps(result))
    comm.Barrier()
    comm.Free()
    sot.shutdown()


def worker_info(affinities: list) -> dict:
    import torch

    info = {"torch": torch.__version__, "affinity": affinities}
    try:
        import hashlib

        import mpi4py
        from mpi4py import MPI

        import scaleout
        from scaleout import _native

        core = _native.build_info()
        with open(core["library"], "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        info.update(
            scaleout=scaleout.__version__,
            mpi4py=mpi4py.__version__,
            mpi=" ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
            core=f"{core['build']}; {os.path.basename(core['library'])} sha256:{digest}",
        )
    except Exception as e:  # informational only
        info["core"] = f"unavailable ({type(e).__name__}: {e})"
    return info


# ---- DDP worker ----


def ddp_worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://")
    result = ddp_train(args)
    if result:
        args.result.write_text(json.dumps(result))
    # The DDP model is freed before the process group: one that outlives it until the
    # interpreter shuts down aborts the process now and then ("terminate called without an
    # active exception" from a gloo thread). DDP's hooks form reference cycles, hence collect().
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def ddp_train(args) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist
    from model import DLRM, DenseArch, LocalEmbeddings, bce_loss

    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = table_sizes(args)
    torch.manual_seed(args.seed)
    dense_arch = DenseArch(len(sizes), args.embedding_dim, args.bottom_mlp, args.top_mlp)
    embeddings = LocalEmbeddings(sizes, args.embedding_dim, seed=args.seed)
    for bag in embeddings.tables:
        bag.sparse = False  # DDP and sparse gradients do not mix well: dense, as users do
    model = torch.nn.parallel.DistributedDataParallel(DLRM(dense_arch, embeddings))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    local = args.batch_size // n
    # This rank's rows of each global batch: the same rows scaleout's rank trains its MLPs on.
    batches = [
        (dense, labels, ids[rank * local : (rank + 1) * local].contiguous())
        for dense, labels, ids in load_batches(args, args.data, rank, n)
    ]
    losses = []

    def step(batch) -> list:
        dense, labels, ids = batch
        t0 = perf()
        optimizer.zero_grad()
        t1 = perf()
        loss = bce_loss(model(dense, ids), labels)
        t2 = perf()
        loss.backward()
        t3 = perf()
        optimizer.step()
        t4 = perf()
        losses.append(loss.detach())
        return [t2 - t1, t3 - t2, t4 - t3, t4 - t0]

    for i in range(args.warmup):
        step(batches[i % len(batches)])
    dist.barrier()
    records = []
    start = perf()
    for i in range(args.warmup, args.warmup + args.steps):
        records.append(step(batches[i % len(batches)]))
    elapsed = torch.tensor([perf() - start], dtype=torch.float64)
    local_times = torch.tensor(records, dtype=torch.float64)
    everyone = [torch.empty_like(local_times) for _ in range(n)]
    dist.all_gather(everyone, local_times)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    final = losses[-1].clone()
    dist.all_reduce(final)
    affinities = [None] * n
    dist.all_gather_object(affinities, affinity())
    if rank != 0:
        return {}
    stacked = torch.stack(everyone).numpy()  # [ranks, steps, 4]
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "ranks": n,
        "train": {
            "step_max": stacked[:, :, -1].max(axis=0).tolist(),
            "phases": {
                name: stacked[:, :, k].mean(axis=0).tolist()
                for k, name in enumerate(DDP_PHASES + ["step"])
            },
            "wall": float(elapsed),
            "final_loss": float(final) / n,
            "grad_bytes": grad_bytes,
        },
        "info": {"torch": torch.__version__, "numpy": np.__version__, "affinity": affinities},
    }


# ---- the launcher ----


def worker_command(args, kind: str, data: Path, result: Path, part: str) -> list:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--data",
        str(data),
        "--result",
        str(result),
        "--worker-part",
        part,
    ]
    for flag in (
        "steps",
        "warmup",
        "batch_size",
        "tables",
        "embedding_dim",
        "table_rows",
        "row_wise_threshold",
        "lr",
        "seed",
        "threads",
        "distinct_batches",
        "a2a_iters",
    ):
        cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    for flag in ("bottom_mlp", "top_mlp", "a2a_batches", "a2a_dims"):
        cmd += ["--" + flag.replace("_", "-"), ",".join(map(str, getattr(args, flag)))]
    return cmd


def clean_env() -> dict:
    """This environment without any launcher's settings (each launch is a job of its own)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCAL", "OMPI_"))
    }


class LaunchFailed(Exception):
    pass


def start(cmd: list, env: dict, log: Path) -> subprocess.Popen:
    """A worker (or mpiexec) in a session of its own, so that it can be stopped with every
    process it started; its output goes to `log` (a pipe could fill up and block it)."""
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(processes: list, logs: list, timeout: float, what: str) -> None:
    """Waits for every process; on a failure or the timeout, kills the others (only these,
    with the processes they started)."""
    deadline = time.monotonic() + timeout
    failed = None
    pending = list(processes)
    while pending and failed is None:
        for p in list(pending):
            if p.poll() is not None:
                pending.remove(p)
                if p.returncode != 0:
                    failed = p
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in pending:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in processes:
        p.wait()
    if failed is not None or pending:
        why = (
            f"exit status {failed.returncode}"
            if failed is not None
            else f"still running after {timeout:.0f} s"
        )
        tail = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
        raise LaunchFailed(f"{what}: {why}\n{tail}")


def launch_scaleout(args, n: int, data: Path, tmp: Path, part: str) -> dict:
    result = tmp / f"scaleout-{n}-{time.monotonic_ns()}.json"
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(n)]
    log = result.with_suffix(".log")
    process = start(cmd + worker_command(args, "scaleout", data, result, part), clean_env(), log)
    finish([process], [log], args.launch_timeout, f"scaleout at {n} ranks")
    return json.loads(result.read_text())


def launch_ddp(args, n: int, data: Path, tmp: Path) -> dict:
    result = tmp / f"ddp-{n}-{time.monotonic_ns()}.json"
    port = free_port()
    processes, logs = [], []
    for rank in range(n):
        env = clean_env()
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        logs.append(result.with_suffix(f".{rank}.log"))
        processes.append(start(worker_command(args, "ddp", data, result, "train"), env, logs[-1]))
    finish(processes, logs, args.launch_timeout, f"DDP at {n} ranks")
    return json.loads(result.read_text())


def affinity_summary(per_launch: dict) -> str:
    """{(layout, n): [each rank's cores]} -> 'scaleout 2: 0-1 0-1; ...', or one set for all."""
    every = {c for cores in per_launch.values() for c in cores}
    if len(every) == 1:
        return f"every rank: {every.pop()}"
    return "; ".join(
        f"{layout} {n}: {' '.join(cores)}" for (layout, n), cores in sorted(per_launch.items())
    )


def header(args, info: dict, sizes: list, data_rows: int, affinities: dict) -> list:
    cpu = cpu_model()
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    knobs = (
        " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("SCALEOUT_"))
        or "no SCALEOUT_* set"
    )
    interactions = (args.tables + 1) * args.tables // 2
    bottom = "-".join(map(str, [13, *args.bottom_mlp, args.embedding_dim]))
    top = "-".join(map(str, [args.embedding_dim + interactions, *args.top_mlp, 1]))
    lines = [
        f"# scaleout DLRM benchmark  {now}  host={socket.gethostname()}",
        f"# cpu={cpu}  nproc={os.cpu_count()}  torch={info.get('torch', '?')}  "
        f"scaleout={info.get('scaleout', '?')}  mpi4py={info.get('mpi4py', '?')}  "
        f"python={sys.version.split()[0]}",
        f"# MPI library: {info.get('mpi', '?')}",
        f"# scaleout core: {info.get('core', '?')}",
        f"# env: {knobs}",
        f"# cpu affinity: {affinity_summary(affinities) if affinities else '?'}",
        f"# model: {args.tables} tables (Criteo's cardinalities capped at {args.table_rows}: "
        f"{sum(sizes)} rows), dim {args.embedding_dim}, bottom MLP {bottom}, top MLP {top}, "
        f"SGD lr {args.lr}",
    ]
    if args.part != "alltoall":
        lines += [
            f"# data: examples/dlrm/data.py write_synthetic (seed {args.seed}, {data_rows} rows "
            f"= {args.distinct_batches} global batches of {args.batch_size}, parsed before "
            "timing, cycled)",
            f"# training: {args.warmup} warm-up + {args.steps} timed steps per launch, "
            f"{args.rounds} launch(es) of each layout per rank count (scaleout and DDP "
            f"alternating which goes first), {args.threads} torch thread(s) per rank",
        ]
    return lines


def oversubscribed(n: int) -> str:
    cores = os.cpu_count() or 1
    return f" (oversubscribed: {n} ranks on {cores} cores)" if n > cores else ""


def train_tables(args, results: dict, out) -> None:
    """results[(layout, n)]: the 'train' dicts of every launch (their steps are pooled)."""

    def summary(layout, n):
        runs = results.get((layout, n))
        if not runs:
            return None
        steps = [t for r in runs for t in r["step_max"]]
        med = median(steps)
        return {
            "rate": args.batch_size / med,
            "step": med,
            "wall": len(steps) * args.batch_size / sum(r["wall"] for r in runs),
            "loss": ", ".join(sorted({f"{r['final_loss']:.5f}" for r in runs})),
        }

    rows = []
    for n in args.ranks:
        so_, ddp = summary("scaleout", n), summary("ddp", n)
        if so_ is None and ddp is None:
            continue

        def cell(s, key, fmt):
            return fmt(s[key]) if s is not None else "-"

        ratio = f"{so_['rate'] / ddp['rate']:.2f}" if so_ and ddp else "-"
        rows.append(
            [
                f"{n}{'*' if oversubscribed(n) else ''}",
                cell(so_, "rate", lambda v: f"{v:,.0f}"),
                cell(ddp, "rate", lambda v: f"{v:,.0f}"),
                ratio,
                cell(so_, "step", fmt_time),
                cell(ddp, "step", fmt_time),
                cell(so_, "wall", lambda v: f"{v:,.0f}"),
                cell(ddp, "wall", lambda v: f"{v:,.0f}"),
                cell(so_, "loss", str),
                cell(ddp, "loss", str),
            ]
        )
    if not rows:
        return
    out(
        f"## DLRM training, global batch {args.batch_size}, samples/s: scaleout hybrid (tables "
        "sharded, alltoall, DistributedOptimizer, sparse local SGD) beside torch DDP over gloo "
        "(tables replicated, dense gradients)"
    )
    hdr = [
        "ranks",
        "scaleout samples/s",
        "DDP samples/s",
        "scaleout / DDP",
        "scaleout step",
        "DDP step",
        "scaleout wall samples/s",
        "DDP wall samples/s",
        f"scaleout loss @{args.warmup + args.steps}",
        f"DDP loss @{args.warmup + args.steps}",
    ]
    for line in table(rows, hdr, ["r"] * len(hdr)):
        out(line)
    notes = [
        "samples/s = global batch / median step time, a step's time being its slowest "
        "rank's; wall samples/s = timed steps x global batch / the timed loop's wall time"
    ]
    ddp_runs = [results[("ddp", n)][0] for n in args.ranks if results.get(("ddp", n))]
    if ddp_runs:
        notes.append(
            f"DDP allreduces {fmt_size(ddp_runs[0]['grad_bytes'])} of gradients per "
            "step (every table's, dense) and its SGD updates every table row"
        )
    if any(oversubscribed(n) for n in args.ranks):
        notes.append(f"* oversubscribed: more ranks than this machine's {os.cpu_count()} cores")
    notes.append(
        "loss: the mean over ranks of the last step's loss; both layouts train the same "
        "model on the same batches, so the two should agree"
    )
    for note in notes:
        out(f"({note})")

    split_rows = []
    for n in args.ranks:
        runs = results.get(("scaleout", n))
        if not runs:
            continue
        phases = {
            k: [v for r in runs for v in r["phases"][k]]
            for k in PHASES + ["step", "alltoall_backward"]
        }
        step = median(phases["step"])
        cells = [f"{median(phases[k]) * 1e3:.2f} ({median(phases[k]) / step:.0%})" for k in PHASES]
        cells.insert(
            PHASES.index("alltoall") + 1, f"{median(phases['alltoall_backward']) * 1e3:.2f}"
        )
        shards = runs[0]["shards"]
        split_rows.append(
            [f"{n}{'*' if oversubscribed(n) else ''}", "/".join(map(str, shards))]
            + cells
            + [f"{step * 1e3:.2f}"]
        )
    if split_rows:
        out()
        out(
            "## where a scaleout step goes: ms (share of the step); per phase the median over "
            "steps of the mean over ranks"
        )
        labels = list(PHASE_LABELS)
        labels.insert(PHASES.index("alltoall") + 1, "of which bwd")
        for line in table(
            split_rows,
            ["ranks", "shards/rank"] + labels + ["step"],
            ["r", "l"] + ["r"] * (len(labels) + 1),
        ):
            out(line)
        out(
            "(the alltoalls' time includes waiting for the slowest rank, and the backward one "
            "is submitted after the MLP gradients' allreduces, so it may wait behind them; "
            "the method is in this script's docstring)"
        )
    ddp_rows = []
    for n in args.ranks:
        runs = results.get(("ddp", n))
        if not runs:
            continue
        phases = {k: [v for r in runs for v in r["phases"][k]] for k in DDP_PHASES + ["step"]}
        step = median(phases["step"])
        ddp_rows.append(
            [f"{n}{'*' if oversubscribed(n) else ''}"]
            + [
                f"{median(phases[k]) * 1e3:.2f} ({median(phases[k]) / step:.0%})"
                for k in DDP_PHASES
            ]
            + [f"{step * 1e3:.2f}"]
        )
    if ddp_rows:
        out()
        out("## where a DDP step goes: ms (share of the step), as above")
        for line in table(
            ddp_rows, ["ranks"] + DDP_LABELS + ["step"], ["r"] + ["r"] * (len(DDP_PHASES) + 1)
        ):
            out(line)


def alltoall_tables(args, results: dict, out) -> None:
    for n in args.ranks:
        rows_in = results.get(("alltoall", n))
        if not rows_in:
            continue
        rows = []
        for r in rows_in:
            so_np, so_torch, mpi_known, mpi_exchanged = r["medians"]
            rows.append(
                [
                    r["batch"],
                    r["dim"],
                    fmt_size(r["send_bytes"]),
                    fmt_size(r["peer_bytes"]),
                    r["iters"],
                    fmt_time(so_np),
                    fmt_time(so_torch),
                    fmt_time(mpi_known),
                    fmt_time(mpi_exchanged),
                    f"{so_np / mpi_known:.2f}",
                    f"{so_torch / mpi_known:.2f}",
                    f"{so_np / mpi_exchanged:.2f}",
                ]
            )
        out()
        out(
            f"## alltoall of the pooled embeddings, {n} ranks{oversubscribed(n)}: float32 "
            f"[B * T_r, D] per rank, {args.tables} tables; medians (an iteration = the slowest "
            "rank's time)"
        )
        hdr = [
            "B",
            "D",
            "sent/rank",
            "to each rank",
            "iters",
            "scaleout",
            "scaleout.torch",
            "mpi4py Alltoallv",
            "mpi4py +counts",
            "ratio",
            "ratio torch",
            "ratio +counts",
        ]
        for line in table(rows, hdr, ["r"] * len(hdr)):
            out(line)
        out(
            "(scaleout = so.alltoall(x, splits=...), numpy; scaleout.torch = "
            "scaleout.torch.alltoall; mpi4py Alltoallv: receive counts known, buffer "
            "preallocated; +counts: comm.Alltoall of the counts, a new buffer, then Alltoallv; "
            "ratio = scaleout / Alltoallv, ratio torch = scaleout.torch / Alltoallv, "
            "ratio +counts = scaleout / +counts; sizes are the largest rank's)"
        )


def main() -> int:
    args = parse_args()
    if args.worker == "scaleout":
        scaleout_worker(args)
        return 0
    if args.worker == "ddp":
        ddp_worker(args)
        return 0
    if any(k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")):
        print(
            "dlrm benchmark: run it with plain python, not under mpiexec or scaleoutrun: it "
            "starts its own ranks",
            file=sys.stderr,
        )
        return 2
    from data import write_synthetic

    t_start = perf()
    out = lambda line="": print(line, flush=True)  # noqa: E731
    sizes = table_sizes(args)
    do_train = args.part in ("train", "all")
    do_ddp = args.part in ("ddp", "all")
    do_a2a = args.part in ("alltoall", "all")
    results, info, affinities = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="dlrm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "synthetic.tsv"
        data_rows = args.batch_size * args.distinct_batches
        if do_train or do_ddp:
            write_synthetic(
                data, data_rows, seed=args.seed, num_categorical=args.tables, vocab_sizes=sizes
            )
        try:
            for n in args.ranks:
                for round_index in range(args.rounds):
                    launches = []
                    a2a_now = do_a2a and round_index == 0 and n > 1
                    if do_train or a2a_now:
                        part = (
                            "both" if do_train and a2a_now else "train" if do_train else "alltoall"
                        )
                        launches.append(("scaleout", part))
                    if do_ddp:
                        launches.append(("ddp", None))
                    if round_index % 2:
                        launches.reverse()
                    for kind, part in launches:
                        print(
                            f"# running {kind} at {n} rank(s), round {round_index + 1}"
                            f"{': ' + part if part else ''} ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        if kind == "scaleout":
                            got = launch_scaleout(args, n, data, tmp, part)
                            info = info or got.get("info", {})
                            affinities[("scaleout", n)] = got["info"]["affinity"]
                            if "train" in got:
                                results.setdefault(("scaleout", n), []).append(got["train"])
                            if "alltoall" in got:
                                results[("alltoall", n)] = got["alltoall"]
                        else:
                            got = launch_ddp(args, n, data, tmp)
                            info = {**got.get("info", {}), **info}
                            affinities[("DDP", n)] = got["info"]["affinity"]
                            results.setdefault(("ddp", n), []).append(got["train"])
        except LaunchFailed as e:
            print(f"dlrm benchmark: {e}", file=sys.stderr, flush=True)
            return 1
    for line in header(args, info, sizes, data_rows, affinities):
        out(line)
    out()
    train_tables(args, results, out)
    alltoall_tables(args, results, out)
    out()
    out(f"# total benchmark time {perf() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
