"""Run by tests/test_soak.py::test_ten_thousand_steps_leave_memory_flat_and_nothing_behind.

A 10,000-step soak of the torch DistributedOptimizer: after warm-up, this rank's resident
memory grows by less than 1 MiB, and no handle or name is left behind (scaleout.stats()).

argv[1]: steps (default 10000)."""

import sys

import torch
from _harness import check, main

import scaleout.torch as hvd

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
WARMUP = 1000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def run():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    before = None
    for step in range(STEPS):
        if step == WARMUP:
            before = rss_bytes()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    growth = rss_bytes() - before
    check(growth < 1 << 20, f"RSS grew by {growth / 1024:.0f} KiB over {STEPS - WARMUP} steps")
    stats = hvd.stats()
    check(stats["handles"] == 0 and stats["names_in_flight"] == 0, f"left behind: {stats}")
    # Every step's allreduces were counted (one fused allreduce or more per step).
    check(stats["collectives"]["allreduce"]["calls"] >= STEPS, f"allreduces counted: {stats}")
    weights = hvd.allgather_object([p.detach().numpy().tobytes() for p in model.parameters()])
    check(all(w == weights[0] for w in weights), "every rank has the same model")
    print(
        f"rank {hvd.rank()}: RSS growth {growth / 1024:.0f} KiB over {STEPS - WARMUP} steps",
        flush=True,
    )


if __name__ == "__main__":
    main(run)
