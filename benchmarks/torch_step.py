#!/usr/bin/env python
"""Training-step time in PyTorch: no communication vs scaleout's DistributedOptimizer vs torch
DistributedDataParallel over the "scaleout" backend and over gloo, in one launch.

    mpiexec -n 2 python benchmarks/torch_step.py
    scaleoutrun -np 2 python benchmarks/torch_step.py [--steps 60] [--rounds 5] [--quick]

Models: the MLP 784-1024-1024-10 with batch 64 per rank, and a small CNN (PyTorch's MNIST
example net: two 3x3 convolutions, 32 and 64 channels, max-pool, 9216-128-10) with batch 32 per
rank. SGD with momentum, cross-entropy loss, fixed random data, 1 compute thread per rank.

Modes, each with its own copy of the model:
  no comm   every rank trains alone (plain optimizer), all ranks at once, so the machine is as
            loaded as in the other modes
  scaleout  scaleout.torch.DistributedOptimizer (allreduce started by gradient hooks)
  DDP scaleout  torch.nn.parallel.DistributedDataParallel over a process group of the
            "scaleout" backend (Note [torch.distributed backend]; dist.new_group(backend=...))
  DDP gloo  torch.nn.parallel.DistributedDataParallel over a gloo process group, started from
            the same launch (rank and size from scaleout, MASTER_ADDR 127.0.0.1, a free port)

A step is zero_grad + forward + backward + optimizer step. The modes run in alternating rounds
(A B C C B A ...) after a warm-up so that machine noise hits all alike; the ranks start every
step together (a barrier), a step's time is the maximum over ranks, and the table reports the
median over all timed steps. Rank 0 prints.
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
    p.add_argument("--models", default="mlp,cnn")
    return p.parse_args()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 1024), nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


TOPK = "scaleout top-k 1%"
MODELS = {"mlp": ("MLP 784-1024-1024-10", MLP, 64), "cnn": ("CNN (MNIST example net)", CNN, 32)}
MODES = ["no comm", "scaleout", "DDP scaleout", "DDP gloo"]


def start_gloo():
    port = hvd.broadcast_object(
        free_port() if hvd.rank() == 0 else None, root_rank=0, name="torch_step.port"
    )
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())


def make_steppers(model_cls, batch, modes=tuple(MODES)):
    """One step function per mode in `modes`, each over its own copy of the same model (DDP
    needs the gloo process group started)."""
    torch.manual_seed(0)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    base = model_cls()
    steppers = {}

    def stepper(model, opt):
        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
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
        ddp = nn.parallel.DistributedDataParallel(copy(), process_group=group)
        steppers["DDP scaleout"] = stepper(
            ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        )
    if "DDP gloo" in modes:
        ddp = nn.parallel.DistributedDataParallel(copy())
        steppers["DDP gloo"] = stepper(
            ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        )
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
        steppers, grad_bytes = make_steppers(model_cls, batch)
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
        )
        head = (
            "| model | batch/rank | gradients | "
            + " | ".join(MODES)
            + " | scaleout overhead | DDP scaleout overhead | DDP gloo overhead |"
        )
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for label, batch, grad_bytes, med in rows:
            base = med["no comm"]
            cells = " | ".join(f"{med[m]:.1f} ms" for m in MODES)
            print(
                f"| {label} | {batch} | {grad_bytes / 2**20:.1f} MiB | {cells} | "
                f"+{med['scaleout'] - base:.1f} ms | +{med['DDP scaleout'] - base:.1f} ms | "
                f"+{med['DDP gloo'] - base:.1f} ms |"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
