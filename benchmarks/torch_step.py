#!/usr/bin/env python
"""Training-step time in PyTorch: no communication vs scaleout's DistributedOptimizer vs torch
DistributedDataParallel and FSDP2 over the "scaleout" backend and over gloo, in one launch.

    mpiexec -n 2 python benchmarks/torch_step.py
    scaleoutrun -np 2 python benchmarks/torch_step.py [--steps 60] [--rounds 5] [--quick]

Models (--models): the MLP 784-1024-1024-10 with batch 64 per rank, a small CNN (PyTorch's
MNIST example net: two 3x3 convolutions, 32 and 64 channels, max-pool, 9216-128-10) with batch
32 per rank (both with cross-entropy loss), and a DLRM-like model (DLRMLike: 8 embedding tables
of 20,000 x 16 with dense gradients, bottom and top MLPs, a click logit) with batch 256 per rank.
SGD with momentum, fixed random data, 1 compute thread per rank.

Modes, each with its own copy of the model:
  no comm   every rank trains alone (plain optimizer), all ranks at once, so the machine is as
            loaded as in the other modes
  scaleout  scaleout.torch.DistributedOptimizer (allreduce started by gradient hooks)
  DDP scaleout  torch.nn.parallel.DistributedDataParallel over a process group of the
            "scaleout" backend (Note [torch.distributed backend]; dist.new_group(backend=...))
  DDP gloo  torch.nn.parallel.DistributedDataParallel over a gloo process group, started from
            the same launch (rank and size from scaleout, MASTER_ADDR 127.0.0.1, a free port)
  DDP no comm  DistributedDataParallel over a process group whose collectives do nothing (each
            rank keeps its own gradients): what DDP itself costs (its hooks, the copies into and
            out of its buckets, the division by the world size), which no backend can remove
  FSDP2 scaleout, FSDP2 gloo  fully_shard (FSDP2) on every layer and on the model, over a
            mesh of the "scaleout" group or of gloo's (DeviceMesh.from_group)
--bucket-view gives every DDP gradient_as_bucket_view=True (gradients live in the buckets: no
copies).

The last columns are the goals' ratios: DDP over scaleout against DistributedOptimizer and
against DDP over gloo. A step is zero_grad + forward + backward + optimizer step. The modes
run in alternating rounds (A B C C B A ...) after a warm-up so that machine noise hits all
alike; the ranks start every step together (a barrier), a step's time is the maximum over
ranks, and the table reports the median over all timed steps. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import free_port
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import scaleout.torch as hvd

perf = time.perf_counter


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode per round")
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per mode first")
    p.add_argument("--threads", type=int, default=1, help="torch compute threads per rank")
    p.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    p.add_argument("--models", default="mlp,cnn,dlrm")
    p.add_argument(
        "--bucket-view", action="store_true", help="DDP with gradient_as_bucket_view=True"
    )
    return p.parse_args()


class MLP(nn.Module):
    @staticmethod
    def example(batch):
        """A batch of inputs (a tuple of the forward's arguments) and its targets."""
        return (torch.randn(batch, 1, 28, 28),), torch.randint(0, 10, (batch,))

    loss = staticmethod(F.cross_entropy)

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 1024), nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class CNN(nn.Module):
    example = MLP.example
    loss = MLP.loss

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DLRMLike(nn.Module):
    """DLRM's shape, small: 8 embedding tables of 20,000 x 16 (summed bags of 4 indices; dense
    gradients, as DDP and DistributedOptimizer reduce them), a bottom MLP 13-64-16 over the dense
    features, a top MLP 144-64-1 over all nine vectors, a click logit."""

    TABLES, ROWS, DIM, BAG = 8, 20000, 16, 4

    @staticmethod
    def example(batch):
        t = DLRMLike
        dense = torch.randn(batch, 13)
        indices = torch.randint(0, t.ROWS, (t.TABLES, batch, t.BAG))
        return (dense, indices), torch.randint(0, 2, (batch,)).float()

    loss = staticmethod(F.binary_cross_entropy_with_logits)

    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(self.ROWS, self.DIM, mode="sum") for _ in range(self.TABLES)
        )
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, self.DIM))
        self.top = nn.Sequential(
            nn.Linear(self.DIM * (self.TABLES + 1), 64), nn.ReLU(), nn.Linear(64, 1)
        )

    def forward(self, dense, indices):
        pooled = [table(idx) for table, idx in zip(self.tables, indices)]
        return self.top(torch.cat([self.bottom(dense)] + pooled, dim=1)).squeeze(1)


TOPK = "scaleout top-k 1%"
MODELS = {
    "mlp": ("MLP 784-1024-1024-10", MLP, 64),
    "cnn": ("CNN (MNIST example net)", CNN, 32),
    "dlrm": ("DLRM-like, 8 tables 20000x16", DLRMLike, 256),
}
MODES = [
    "no comm",
    "scaleout",
    "DDP scaleout",
    "DDP gloo",
    "DDP no comm",
    "FSDP2 scaleout",
    "FSDP2 gloo",
]


class _Done(dist.Work):
    """A collective that did nothing, already complete."""

    def __init__(self, tensors):
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(tensors)

    def wait(self, timeout=None):
        return True

    def get_future(self):
        return self._future


class NoCommGroup(dist.ProcessGroup):
    """The "DDP no comm" mode's process group: its allreduce and broadcast leave every rank's
    tensors as they are, its allgathers give each rank its own input for every rank's (what
    DDP's start-up check of the parameters' shapes reads)."""

    def getBackendName(self):
        return "nocomm"

    def allreduce(self, tensors, opts):
        return _Done(tensors)

    broadcast = allreduce

    def allgather(self, outputs, inputs, opts):
        for outs, t in zip(outputs, inputs):
            for out in outs:
                out.copy_(t)
        return _Done(outputs)

    def _allgather_base(self, output, t, opts):
        output.copy_(t.reshape(-1).repeat(output.numel() // max(t.numel(), 1)).view_as(output))
        return _Done([output])


dist.Backend.register_backend(
    "nocomm", lambda store, rank, size, timeout: NoCommGroup(rank, size), devices=["cpu"]
)


def start_gloo():
    port = hvd.broadcast_object(
        free_port() if hvd.rank() == 0 else None, root_rank=0, name="torch_step.port"
    )
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())


def make_steppers(model_cls, batch, modes=tuple(MODES), bucket_view=False):
    """One step function per mode in `modes`, each over its own copy of the same model (DDP
    needs the gloo process group started)."""
    torch.manual_seed(0)
    inputs, target = model_cls.example(batch)
    base = model_cls()
    steppers = {}

    def stepper(model, opt):
        def step():
            opt.zero_grad()
            model_cls.loss(model(*inputs), target).backward()
            opt.step()

        return step

    def copy():
        m = model_cls()
        m.load_state_dict(base.state_dict())
        return m

    if "no comm" in modes:
        m = copy()
        steppers["no comm"] = stepper(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    if "scaleout" in modes:
        m = copy()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
            named_parameters=m.named_parameters(),
        )
        steppers["scaleout"] = stepper(m, opt)
    if TOPK in modes:  # benchmarks/multihost.py's: 1% of each gradient, error feedback
        m = copy()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
            named_parameters=m.named_parameters(),
            compression=hvd.Compression.topk(0.01),
        )
        steppers[TOPK] = stepper(m, opt)
    if "DDP scaleout" in modes:  # DDP over the "scaleout" torch.distributed backend
        group = dist.new_group(backend="scaleout")
        ddp = nn.parallel.DistributedDataParallel(
            copy(), process_group=group, gradient_as_bucket_view=bucket_view
        )
        steppers["DDP scaleout"] = stepper(
            ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        )
    if "DDP gloo" in modes:
        ddp = nn.parallel.DistributedDataParallel(copy(), gradient_as_bucket_view=bucket_view)
        steppers["DDP gloo"] = stepper(
            ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        )
    if "DDP no comm" in modes:
        group = dist.new_group(backend="nocomm")
        ddp = nn.parallel.DistributedDataParallel(
            copy(), process_group=group, gradient_as_bucket_view=bucket_view
        )
        steppers["DDP no comm"] = stepper(
            ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        )
    for backend in ("scaleout", "gloo"):
        mode = f"FSDP2 {backend}"
        if mode in modes:  # fully_shard on every layer with parameters, then on the model
            group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend=backend)
            mesh = DeviceMesh.from_group(group, "cpu")
            m = copy()
            for layer in m.modules():
                if layer is not m and any(True for _ in layer.parameters(recurse=False)):
                    fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
            steppers[mode] = stepper(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    return steppers, grad_bytes


def timed_steps(step, count):
    times = []
    for _ in range(count):
        hvd.barrier()
        t0 = perf()
        step()
        times.append(perf() - t0)
    # a step's time is the slowest rank's
    return hvd.allreduce(
        torch.tensor(times, dtype=torch.float64), op=hvd.Max, name="torch_step.times"
    ).tolist()


def main():
    args = parse_args()
    if args.quick:
        args.steps, args.rounds, args.warmup = 5, 2, 2
    hvd.init()
    torch.set_num_threads(args.threads)
    start_gloo()
    rows = []
    for key in args.models.split(","):
        label, model_cls, batch = MODELS[key]
        steppers, grad_bytes = make_steppers(model_cls, batch, bucket_view=args.bucket_view)
        for mode in MODES:
            for _ in range(args.warmup):
                steppers[mode]()
        samples = {mode: [] for mode in MODES}
        for round_index in range(args.rounds):
            order = MODES if round_index % 2 == 0 else MODES[::-1]
            for mode in order:
                samples[mode] += timed_steps(steppers[mode], args.steps)
        medians = {mode: statistics.median(samples[mode]) * 1e3 for mode in MODES}
        rows.append((label, batch, grad_bytes, medians))
    if hvd.rank() == 0:
        print(
            f"torch {torch.__version__}, {hvd.size()} ranks, {args.threads} thread(s) per rank, "
            f"median of {args.rounds * args.steps} steps per mode (max over ranks)"
            + (", DDP with gradient_as_bucket_view=True" if args.bucket_view else "")
        )
        head = (
            "| model | batch/rank | gradients | "
            + " | ".join(MODES)
            + " | scaleout overhead | DDP scaleout overhead | DDP gloo overhead "
            + "| DDP scaleout / scaleout | DDP scaleout / DDP gloo |"
        )
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for label, batch, grad_bytes, med in rows:
            base = med["no comm"]
            cells = " | ".join(f"{med[m]:.1f} ms" for m in MODES)
            print(
                f"| {label} | {batch} | {grad_bytes / 2**20:.1f} MiB | {cells} | "
                f"+{med['scaleout'] - base:.1f} ms | +{med['DDP scaleout'] - base:.1f} ms | "
                f"+{med['DDP gloo'] - base:.1f} ms | "
                f"{med['DDP scaleout'] / med['scaleout']:.2f} | "
                f"{med['DDP scaleout'] / med['DDP gloo']:.2f} |"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
