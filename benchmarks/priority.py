#!/usr/bin/env python
"""What gradient priority and forward overlap gain (Note [Priority], Note [Forward overlap]):
training-step time and next-step start, with and without them, in one launch.

    scaleoutrun -np 2 python benchmarks/priority.py [--steps 20] [--rounds 6] [--quick]
    python benchmarks/priority.py --hosts 2 --rate 1gbit     # as root: its own launcher

With --hosts N it makes tests/_hosts.py's network-namespace hosts (benchmarks/multihost.py's),
with every link limited to --rate by tc tbf, and runs itself on them: one rank per host,
started by scaleoutrun from the first host. Where the hosts cannot be made it says why and
exits 0.

Models: benchmarks/torch_step.py's CNN (batch 32 per rank) and a model with a long forward
pass, "deep": 784-1024 then eight 1024-1024 layers then 10, batch 128 per rank. SGD with
momentum, 1 compute thread per rank, fixed random data.

Modes, each with its own copy of the model:
  no comm           every rank trains alone (plain optimizer), all ranks at once
  scaleout          DistributedOptimizer as Horovod's: step() waits for every gradient
  priority          the same with priority=True: the first layers' reductions go first
  priority+overlap  priority=True, overlap_forward=model: step() returns at once and each layer
                    waits for its own reduction and update at the next forward

A mode's steps run back to back, with no barrier between them (a barrier would wait for every
reduction and undo the overlap): a block of --steps steps starts after a barrier, and ends once
every update is applied (the model's state_dict()); its time per step is the slowest rank's.
Next-step start: from the end of a step's backward to the start of the next step's first layer
(where forward can begin: after step() without overlap, after the first layer's update with
it), median over all steps of all ranks. Modes run in alternating rounds after a warm-up; medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import run_on_hosts
from torch_step import CNN

import scaleout.torch as hvd

perf = time.perf_counter
MODES = ["no comm", "scaleout", "priority", "priority+overlap"]


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(784, 1024)
        self.hidden = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(8))
        self.last = nn.Linear(1024, 10)

    def forward(self, x):
        x = F.relu(self.first(x.flatten(1)))
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.last(x)


MODELS = {"cnn": ("CNN (MNIST example net)", CNN, 32), "deep": ("deep MLP, 10 layers", Deep, 128)}


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per mode first")
    p.add_argument("--models", default="cnn,deep")
    p.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    p.add_argument("--hosts", type=int, default=0, help="run across this many namespace hosts")
    p.add_argument("--rate", default="1gbit", help="with --hosts: each link's rate (tc tbf)")
    return p.parse_args()


def on_hosts(args) -> int:
    # The job's own arguments, rebuilt from the parsed ones (so `--hosts=2` cannot reach it).
    worker = ["--steps", str(args.steps), "--rounds", str(args.rounds)]
    worker += ["--warmup", str(args.warmup), "--models", args.models]
    worker += ["--quick"] if args.quick else []
    return run_on_hosts(__file__, worker, args.hosts, args.rate, "priority benchmark")


class Stepper:
    """One mode's model and optimizer; records backward ends and first-layer starts."""

    def __init__(self, mode, model_cls, batch, state):
        torch.manual_seed(hvd.rank())
        self.x = torch.randn(batch, 1, 28, 28)
        self.y = torch.randint(0, 10, (batch,))
        self.model = model_cls()
        self.model.load_state_dict(state)
        opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        if mode != "no comm":
            opt = hvd.DistributedOptimizer(
                opt,
                named_parameters=self.model.named_parameters(),
                priority=mode != "scaleout",
                overlap_forward=self.model if mode == "priority+overlap" else None,
            )
        self.opt = opt
        self.gaps = []
        self.backward_end = None
        first = next(m for m in self.model.modules() if list(m.parameters(recurse=False)))
        # Registered after the optimizer's own hook: runs once the first layer is updated.
        first.register_forward_pre_hook(lambda *_: self._first_layer())

    def _first_layer(self):
        if self.backward_end is not None:
            self.gaps.append(perf() - self.backward_end)
            self.backward_end = None

    def step(self):
        self.opt.zero_grad()
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.backward_end = perf()
        self.opt.step()

    def block(self, steps):
        hvd.barrier()
        t0 = perf()
        for _ in range(steps):
            self.step()
        self.model.state_dict()  # applies what overlap deferred (Note [Forward overlap])
        self.backward_end = None
        return (perf() - t0) / steps


def main():
    args = parse_args()
    if args.hosts:
        sys.exit(on_hosts(args))
    if args.quick:
        args.steps, args.rounds, args.warmup = 5, 2, 2
    hvd.init()
    torch.set_num_threads(1)
    rows = []
    for key in args.models.split(","):
        label, model_cls, batch = MODELS[key]
        torch.manual_seed(0)
        state = model_cls().state_dict()
        steppers = {mode: Stepper(mode, model_cls, batch, state) for mode in MODES}
        for s in steppers.values():
            s.block(args.warmup)
            s.gaps.clear()
        per_step = {mode: [] for mode in MODES}
        for round_index in range(args.rounds):
            for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
                t = steppers[mode].block(args.steps)
                per_step[mode].append(
                    hvd.allreduce(torch.tensor([t]), op=hvd.Max, name="priority.block").item()
                )
        step_ms = {m: statistics.median(v) * 1e3 for m, v in per_step.items()}
        gaps = {
            m: hvd.allgather_object(s.gaps, name=f"priority.gaps.{key}.{m}")
            for m, s in steppers.items()
        }
        start_ms = {
            m: statistics.median(g for rank in v for g in rank) * 1e3 for m, v in gaps.items()
        }
        grad_mib = sum(p.numel() * p.element_size() for p in steppers["no comm"].model.parameters())
        rows.append((label, batch, grad_mib / 2**20, step_ms, start_ms))
    if hvd.rank() == 0:
        print(
            f"torch {torch.__version__}, {hvd.size()} ranks, 1 thread per rank; blocks of "
            f"{args.steps} steps, {args.rounds} rounds; step time per step (slowest rank, median "
            "of blocks) / next-step start (end of backward to the first layer's forward, median)"
        )
        head = "| model | batch/rank | gradients | " + " | ".join(MODES) + " |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for label, batch, mib, step_ms, start_ms in rows:
            cells = " | ".join(f"{step_ms[m]:.1f} ms / {start_ms[m]:.2f} ms" for m in MODES)
            print(f"| {label} | {batch} | {mib:.1f} MiB | {cells} |")


if __name__ == "__main__":
    main()
