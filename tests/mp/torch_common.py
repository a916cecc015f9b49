"""Shared by the torch.distributed scripts (torch_distributed.py under scaleoutrun and
mpiexec, torch_torchrun.py under torchrun): the small model and the three training steps that
a data-parallel model must take as one process does on the global batch. Imports no MPI: the
torchrun script starts MPI only through init_process_group (Note [PMI bootstrap])."""

import torch
import torch.nn as nn


def model(dtype=torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dtype)


def train_beside_one_process(r, n, ours, opt, ref, ref_opt, seed: int, dtype=torch.float64) -> None:
    """Three steps of `ours` on this rank's 4 rows of a global batch of 4n, and of `ref` (one
    process) on the whole batch."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * n, 8, generator=g, dtype=dtype)
    y = torch.randn(4 * n, 2, generator=g, dtype=dtype)
    for _ in range(3):
        opt.zero_grad()
        ((ours(x[4 * r : 4 * r + 4]) - y[4 * r : 4 * r + 4]) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        ref_opt.step()
