#!/usr/bin/env python
"""Time to accuracy across slow links: bulk-synchronous training (DistributedOptimizer, also
with fp16 and top-k 1% compression) beside local SGD (LocalSGDOptimizer, Note [Local SGD]) on
network-namespace hosts joined by rate-limited links.

    sudo python benchmarks/local_sgd.py                        # its own launcher: plain python
    python benchmarks/local_sgd.py --rates 100mbit --epochs 20 --methods bsp,local-4
    python benchmarks/local_sgd.py --model mlp --plot mlp.png   # the plot needs matplotlib

The hosts and links are benchmarks/multihost.py's (tests/_hosts.py: tc tbf at each rate on both
ends of every link). For each rate one scaleoutrun job from the first host, with --ranks-per-host
ranks on each of --hosts hosts and SCALEOUT_HIERARCHICAL_ALLREDUCE=1 (each machine sums through
shared memory, only the machines' slices cross the link: the fastest bulk-synchronous setting
there is across hosts), trains a model on scikit-learn's digits (1,797 8x8 images) from the
same start with each method in turn (--model cnn: examples/pytorch_digits.py's CNN, 38k
parameters; mlp: 64-512-512-10, 300k parameters):

  bsp          DistributedOptimizer (SGD, momentum 0.9), every gradient reduced every step
  bsp-fp16     the same, gradients sent as float16
  topk-1%      the same, Compression.topk(0.01) (error feedback)
  local-K      LocalSGDOptimizer(period=K, hierarchical=False): the model averaged every K steps
  hier-local-K LocalSGDOptimizer(period=K): also averaged inside each machine after every step
  ssp-K-S      LocalSGDOptimizer(period=K, staleness=S, hierarchical=False): bounded staleness
  diloco-K     LocalSGDOptimizer(period=K, outer_optimizer=SGD(lr --outer-lr (0.7), Nesterov
               momentum --outer-momentum (0.9)))

Each is a data-parallel run of the example: a global batch of 64 split over the ranks, lr 0.05
with cosine decay over --epochs, local methods after --warmup-epochs bulk-synchronous epochs.
After every epoch the clock stops and the model every rank would get from an average (for the
bulk-synchronous methods, the model itself) is scored on the 450 test images. Time is training
time only (the maximum over ranks of each epoch's), summed over epochs. The target is the
bulk-synchronous run's final accuracy less one point; a method's time to it is its time at the
end of the first epoch that reaches it.

With --hog the last rank starts a CPU hog (a busy Python process) on its own cores for the whole
job: a straggler. The steps/s column is the steps of all epochs over the training time.

The script is its own launcher: run it as root with plain python (not under scaleoutrun). Where
the hosts cannot be made it prints why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the hosts are the tests' (tests/_hosts.py)
sys.path.insert(0, str(REPO / "examples"))  # digits_data

METHODS = "bsp,bsp-fp16,topk-1%,local-4,local-16,hier-local-4,diloco-16"
JOB_TIMEOUT = 3600
perf = time.perf_counter


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rates", default="100mbit,1gbit", help="link rates (tc's notation)")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--warmup-epochs", type=int, default=1, help="bulk-synchronous first epochs")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco's outer SGD lr")
    p.add_argument("--outer-momentum", type=float, default=0.9, help="its Nesterov momentum")
    p.add_argument("--plot", default=None, help="write accuracy against time to this PNG")
    p.add_argument("--json", default=None, help="write every curve to this file")
    p.add_argument(
        "--hog", action="store_true", help="the last rank shares its cores with a CPU hog"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in a.methods:
        if not re.fullmatch(r"bsp|bsp-fp16|topk-1%|(local|hier-local|diloco)-\d+|ssp-\d+-\d+", m):
            p.error(f"--methods: unknown method {m!r} (known: {METHODS}, any period)")
    a.rates = [r.strip() for r in a.rates.split(",") if r.strip()]
    if a.epochs < 1 or a.warmup_epochs < 0 or a.warmup_epochs >= a.epochs:
        p.error("--epochs at least 1, --warmup-epochs from 0 to fewer than --epochs")
    return a


# ---- the job (every rank) ----


def worker(args) -> int:
    import digits_data
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import scaleout.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()

    class CNN(nn.Module):  # examples/pytorch_digits.py's
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.fc1 = nn.Linear(32 * 4 * 4, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.fc1(x.flatten(1)))
            return self.fc2(x)

    def MLP():  # noqa: N802 (a model class's place)
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    Net = {"cnn": CNN, "mlp": MLP}[args.model]

    pixels, targets = digits_data.load()
    images = torch.tensor(pixels / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(targets)
    train_idx, test_idx = digits_data.split(targets, test_fraction=0.25, seed=0)
    train_x, train_y = images[train_idx], labels[train_idx]
    test_x, test_y = images[test_idx], labels[test_idx]
    steps_per_epoch = (len(train_y) + 63) // 64

    def my_part(batch):
        per_rank, extra = divmod(len(batch), size)
        start = rank * per_rank + min(rank, extra)
        return batch[start : start + per_rank + (rank < extra)]

    def score(model, tag):
        """The test accuracy of the ranks' average model (not changing theirs)."""
        probe = Net()
        averaged = {}
        with torch.no_grad():
            for name, t in model.state_dict().items():
                averaged[name] = hvd.allreduce(t.clone(), op=hvd.Average, name=f"{tag}.{name}")
        probe.load_state_dict(averaged)
        probe.eval()
        mine = torch.arange(rank, len(test_y), size)
        with torch.no_grad():
            correct = (probe(test_x[mine]).argmax(1) == test_y[mine]).sum()
        total = hvd.allreduce(
            torch.tensor([float(correct), float(len(mine))]), op=hvd.Sum, name=f"{tag}.counts"
        )
        return (total[0] / total[1]).item()

    def build(method, model):
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if method.startswith("bsp") or method.startswith("topk"):
            compression = {
                "bsp": hvd.Compression.none,
                "bsp-fp16": hvd.Compression.fp16,
                "topk-1%": hvd.Compression.topk(0.01),
            }[method]
            return hvd.DistributedOptimizer(
                inner, named_parameters=model.named_parameters(), compression=compression
            )
        if method.startswith("ssp-"):
            _, period, staleness = method.split("-")
            return hvd.LocalSGDOptimizer(
                inner,
                model,
                period=int(period),
                warmup_steps=args.warmup_epochs * steps_per_epoch,
                hierarchical=False,
                staleness=int(staleness),
            )
        kind, period = method.rsplit("-", 1)
        outer = None
        if kind == "diloco":
            outer = torch.optim.SGD(
                model.parameters(),
                lr=args.outer_lr,
                momentum=args.outer_momentum,
                nesterov=args.outer_momentum > 0,
            )
        return hvd.LocalSGDOptimizer(
            inner,
            model,
            period=int(period),
            warmup_steps=args.warmup_epochs * steps_per_epoch,
            hierarchical=None if kind == "hier-local" else False,
            outer_optimizer=outer,
        )

    result = {
        "ranks": size,
        "algorithm": hvd.config()["allreduce_algorithm"],
        "model": args.model,
        "parameters": sum(p.numel() for p in Net().parameters()),
        "curves": {},
    }
    hog = None
    if args.hog and rank == size - 1:  # a CPU hog on this rank's cores, for the whole job
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(hog.pid, os.sched_getaffinity(0))
    for method in args.methods:
        torch.manual_seed(args.seed)
        model = Net()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = build(method, model)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
        before = hvd.stats()["collectives"].get("allreduce", {}).get("bytes", 0)
        elapsed, curve = 0.0, []
        for epoch in range(args.epochs):
            model.train()
            order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(epoch))
            hvd.barrier()
            started = perf()
            for start in range(0, len(order), 64):
                mine = my_part(order[start : start + 64])
                optimizer.zero_grad()
                loss = F.cross_entropy(model(train_x[mine]), train_y[mine])
                loss.backward()
                optimizer.step()
            took = perf() - started
            scheduler.step()
            elapsed += hvd.allreduce(
                torch.tensor(took, dtype=torch.float64), op=hvd.Max, name="epoch_time"
            ).item()
            curve.append([elapsed, score(model, f"score.{method}.{epoch}")])
        sent = hvd.stats()["collectives"].get("allreduce", {}).get("bytes", 0) - before
        result["curves"][method] = {
            "curve": curve,
            "allreduce_bytes_rank0": sent,
            "steps": args.epochs * steps_per_epoch,
        }
        if rank == 0:
            print(f"# {method}: {curve[-1][1]:.4f} after {elapsed:.1f} s", file=sys.stderr)
    if hog is not None:
        hog.kill()
        hog.wait()
    result["hog"] = bool(args.hog)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()
    return 0


# ---- the launcher ----


def run_job(hosts, args) -> tuple:
    from _hosts import NETWORK_ENV, job_command

    command = job_command(
        {h: args.ranks_per_host for h in hosts.names},
        Path(__file__).resolve(),
        "--worker",
        "--epochs",
        str(args.epochs),
        "--warmup-epochs",
        str(args.warmup_epochs),
        "--methods",
        ",".join(args.methods),
        "--seed",
        str(args.seed),
        "--model",
        args.model,
        "--outer-lr",
        str(args.outer_lr),
        "--outer-momentum",
        str(args.outer_momentum),
        *(["--hog"] if args.hog else []),
    )
    env = {**NETWORK_ENV, "SCALEOUT_HIERARCHICAL_ALLREDUCE": "1"}
    started = perf()
    try:
        done = hosts.run_on(hosts.names[0], command, env=env, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {JOB_TIMEOUT} s"
    for line in done.stdout.splitlines():
        match = re.match(r"^\[0\] RESULT (.*)$", line)
        if match and done.returncode == 0:
            return json.loads(match.group(1)), f"{perf() - started:.0f} s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return None, f"failed (exit {done.returncode}):\n{tail}"


def time_to(curve, target):
    for elapsed, accuracy in curve:
        if accuracy >= target:
            return elapsed
    return None


def report(rate, found, out) -> None:
    curves = found["curves"]
    base = curves.get("bsp")
    target = None if base is None else base["curve"][-1][1] - 0.01
    out(
        f"## {found['model']} ({found['parameters']} parameters), links at {rate}: "
        f"{found['ranks']} ranks, allreduce {found['algorithm']}"
        + ("; the last rank shares its cores with a CPU hog" if found.get("hog") else "")
    )
    if target is not None:
        out(f"target: bsp's final accuracy less one point = {target:.4f}")
    out(
        "| method | final accuracy | best | training time | steps/s | time to target | vs bsp | "
        "allreduce MiB (rank 0) |"
    )
    out("|---|---:|---:|---:|---:|---:|---:|---:|")
    base_time = None if target is None else time_to(base["curve"], target)
    for method, c in curves.items():
        curve = c["curve"]
        reached = None if target is None else time_to(curve, target)
        speed = f"{base_time / reached:.2f}x" if reached and base_time else "-"
        out(
            f"| {method} | {curve[-1][1]:.4f} | {max(a for _, a in curve):.4f} | "
            f"{curve[-1][0]:.1f} s | {c['steps'] / curve[-1][0]:.0f} | "
            f"{'-' if reached is None else f'{reached:.1f} s'} | "
            f"{speed} | {c['allreduce_bytes_rank0'] / 2**20:.1f} |"
        )


def plot(panels: list, path: str, hosts: int) -> None:
    """One panel per (rate, RESULT) pair: accuracy against training time, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (rate, found) in zip(axes[0], panels):
        for method, c in found["curves"].items():
            xs, ys = zip(*c["curve"])
            ax.plot(xs, ys, marker=".", label=method)
        ax.set_title(f"digits {found['model']}, {found['ranks']} ranks on {hosts} hosts, {rate}")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.8, 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args) -> int:
    from _hosts import HostsUnavailable, LinkLimit, made_hosts, missing_prerequisite

    missing = missing_prerequisite(rate_limited=True)
    if missing:
        print(f"local SGD benchmark skipped: {missing}")
        return 0
    limits = [LinkLimit(r) for r in args.rates]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}; {args.hosts} hosts x {args.ranks_per_host} "
        f"ranks; {args.epochs} epochs (local methods after {args.warmup_epochs} "
        f"bulk-synchronous); seed {args.seed}; diloco's outer SGD lr {args.outer_lr}, "
        f"momentum {args.outer_momentum}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="scaleout-localsgd-") as workdir:
        try:
            with made_hosts(Path(workdir), args.hosts, limits[0]) as hosts:
                for limit in limits:
                    hosts.limit_links(limit)
                    print(f"# running {limit.rate} ...", file=sys.stderr, flush=True)
                    found, note = run_job(hosts, args)
                    print(f"# job at {limit.rate}: {note}")
                    if found is not None:
                        results[limit.rate] = found
                        report(limit.rate, found, print)
        except HostsUnavailable as exc:
            print(f"local SGD benchmark skipped: {exc}")
            return 0
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot and results:
        plot(list(results.items()), args.plot, args.hosts)
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(worker(arguments) if arguments.worker else main(arguments))
