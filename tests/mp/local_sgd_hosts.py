"""Run by tests/test_multihost_hierarchical.py::test_local_sgd_averages_machines_every_step.

LocalSGDOptimizer across two machines whose allreduces are hierarchical (Note [Local SGD], Note
[Host sets]): after every local step the ranks of a machine hold the same model, the machines
differ until a round over the job, after which every rank holds the same model; stats() counts
both kinds of round. Prints one RESULT line per rank."""

import json

import torch
import torch.nn as nn

import scaleout.torch as hvd

torch.set_num_threads(1)
hvd.init()
failures = []
places = hvd.allgather_object(hvd.cross_rank())


def state(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
opt = hvd.LocalSGDOptimizer(torch.optim.SGD(net.parameters(), lr=0.05), net, period=3)
hierarchical = opt._so_local.hosts is not None
for step in range(6):
    g = torch.Generator().manual_seed(100 * hvd.rank() + step)
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    copies = hvd.allgather_object(state(net))
    mine = [c for q, c in enumerate(copies) if places[q] == hvd.cross_rank()]
    others = [c for q, c in enumerate(copies) if places[q] != hvd.cross_rank()]
    if not all(torch.equal(mine[0], c) for c in mine):
        failures.append(f"step {step}: the machine's ranks differ")
    apart = not all(torch.equal(mine[0], c) for c in others)
    if (step + 1) % 3 == 0 and apart:
        failures.append(f"step {step}: the machines differ after a round over the job")
    if (step + 1) % 3 != 0 and not apart:
        failures.append(f"step {step}: the machines agree between rounds")
stats = hvd.stats()["local_sgd"]
print(
    "RESULT " + json.dumps({"hierarchical": hierarchical, "failures": failures, "stats": stats}),
    flush=True,
)
hvd.shutdown()
