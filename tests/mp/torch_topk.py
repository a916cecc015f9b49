"""Run by tests/test_topk.py::test_torch_distributed_optimizer.

DistributedOptimizer(compression=Compression.topk(...)) (Note [Top-k sparsification]): the
gradients handed to the wrapped optimizer are the mean of every rank's top-k of gradient plus
residual; with momentum correction (and every step a dense warmup step) training is exactly
momentum SGD with weight decay and Nesterov's variant, the momentum moved out of the optimizer;
the residuals are in state_dict() and come back with load_state_dict(), and
broadcast_optimizer_state() leaves each rank its own; bad arguments get errors that say what was
wrong."""

import io

import numpy as np
import torch
from _harness import check, check_close, expect_error, finish

import scaleout.torch as hvd
from scaleout import InvalidArgumentError

hvd.init()
r, n = hvd.rank(), hvd.size()


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 3)
    ).double()


def batch(q, step):
    g = torch.Generator().manual_seed(1000 * step + q)
    return torch.randn(16, 20, generator=g, dtype=torch.float64), torch.randn(
        16, 3, generator=g, dtype=torch.float64
    )


def train(opt, model, steps, first=0):
    for step in range(first, first + steps):
        x, y = batch(r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def everyone(t):
    return hvd.allgather(t.detach().reshape(1, -1)).numpy()


def top(x, k):
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


# 1. The reduced gradient is the mean of every rank's top-k (first step: residual 0), and the
#    residual is what was left.
model = make()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1),
    named_parameters=model.named_parameters(),
    compression=hvd.Compression.topk(0.1),
)
x, y = batch(r, 0)
opt.zero_grad()
torch.nn.functional.mse_loss(model(x), y).backward()
local = {name: p.grad.detach().clone().reshape(-1).numpy() for name, p in model.named_parameters()}
opt.synchronize()
for name, p in model.named_parameters():
    k = int(np.ceil(0.1 * p.numel()))
    grads = everyone(torch.from_numpy(local[name]))
    check_close(
        p.grad.reshape(-1).numpy(),
        sum(top(g, k) for g in grads) / n,
        f"{name}: mean of the ranks' top-{k}",
    )
    residual = opt.state_dict()["scaleout_topk"]["slots"][name]["residual"]
    check_close(
        residual.numpy(), local[name] - top(local[name], k), f"{name}: residual", rtol=0, atol=0
    )
with opt.skip_synchronize():
    opt.step()
check(opt.state_dict()["scaleout_topk"]["steps"] == 1, "one step counted")

# 2. Momentum correction with every step dense (warmup) is momentum SGD itself: the same model
#    as the plain DistributedOptimizer, weight decay and Nesterov included; and after training
#    the wrapped SGD still has its momentum settings.
for nesterov in (False, True):
    settings = dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    dense_model, dgc_model = make(), make()
    dense = hvd.DistributedOptimizer(
        torch.optim.SGD(dense_model.parameters(), **settings),
        named_parameters=dense_model.named_parameters(),
    )
    dgc = hvd.DistributedOptimizer(
        torch.optim.SGD(dgc_model.parameters(), **settings),
        named_parameters=dgc_model.named_parameters(),
        compression=hvd.Compression.topk(0.01, momentum_correction=True, warmup_steps=100),
    )
    train(dense, dense_model, 5)
    train(dgc, dgc_model, 5)
    for (name, a), b in zip(dense_model.named_parameters(), dgc_model.parameters()):
        check_close(
            b.detach().numpy(),
            a.detach().numpy(),
            f"nesterov={nesterov} {name}: momentum moved into the compression",
            rtol=1e-10,
            atol=1e-12,
        )
    check(
        dgc.param_groups[0]["momentum"] == 0.9 and dgc.param_groups[0]["weight_decay"] == 0.01,
        "the wrapped SGD's settings are restored after each step",
    )

# 3. Sparse training keeps every rank's model the same.
model = make()
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    named_parameters=model.named_parameters(),
    compression=hvd.Compression.topk(0.05, momentum_correction=True),
)
train(opt, model, 6)
for name, p in model.named_parameters():
    mine = p.detach().reshape(-1).numpy()
    check(
        all(np.array_equal(mine, other) for other in everyone(p)), f"{name}: the same on every rank"
    )

# 4. Residuals and velocities are optimizer state: saved, loaded, broadcast.
saved = opt.state_dict()
slots = saved["scaleout_topk"]["slots"]
check(set(slots) == {name for name, _ in model.named_parameters()}, "a slot per parameter")
check(all(set(s) == {"residual", "velocity"} for s in slots.values()), "residual and velocity")
check(any(s["residual"].abs().sum() > 0 for s in slots.values()), "residuals hold something")
buffer = io.BytesIO()
torch.save(saved, buffer)
buffer.seek(0)
model2 = make()
opt2 = hvd.DistributedOptimizer(
    torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9),
    named_parameters=model2.named_parameters(),
    compression=hvd.Compression.topk(0.05, momentum_correction=True),
)
opt2.load_state_dict(torch.load(buffer))
loaded = opt2.state_dict()["scaleout_topk"]
check(loaded["steps"] == 6, "the step count comes back")
for name, s in slots.items():
    for key in ("residual", "velocity"):
        check(torch.equal(loaded["slots"][name][key], s[key]), f"{name} {key} comes back")
# broadcast_optimizer_state gives root's momentum buffers, but each rank keeps its own residual
# (what it has not sent; root's copied everywhere would be sent size times).
mine = {name: s["residual"].clone() for name, s in slots.items()}
for group in opt.param_groups:
    for p in group["params"]:
        opt.state[p]["momentum_buffer"] = torch.full_like(p, float(r))
hvd.broadcast_optimizer_state(opt, root_rank=0)
for p in model.parameters():
    check(bool((opt.state[p]["momentum_buffer"] == 0).all()), "root's momentum buffers")
for name, s in opt.state_dict()["scaleout_topk"]["slots"].items():
    check(torch.equal(s["residual"], mine[name]), f"{name}: the rank's own residual kept")
    if n > 1:
        rows = everyone(s["residual"])
        check(
            not all(np.array_equal(rows[0], row) for row in rows),
            f"{name}: residuals differ between ranks",
        )
train(opt, model, 1, first=6)  # and training goes on from there

# 5. Bad arguments.
for bad in (0, 1.5, -0.1, "0.1", True):
    expect_error(
        InvalidArgumentError, lambda: hvd.Compression.topk(bad), "density", what=f"density {bad!r}"
    )
expect_error(
    InvalidArgumentError,
    lambda: hvd.Compression.topk(0.1, warmup_steps=-1),
    "warmup_steps",
    what="negative warmup",
)
model = make()
expect_error(
    InvalidArgumentError,
    lambda: hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters()),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.topk(0.1, momentum_correction=True),
    ),
    "torch.optim.SGD",
    "Adam",
    what="momentum correction with Adam",
)
expect_error(
    InvalidArgumentError,
    lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.topk(0.1, momentum_correction=True),
    ),
    "momentum > 0",
    what="momentum correction without momentum",
)
expect_error(
    InvalidArgumentError,
    lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.topk(0.1, momentum_correction=0.9),
    ),
    "momentum_correction=True",
    what="a momentum number with an optimizer",
)
expect_error(
    InvalidArgumentError,
    lambda: hvd.allreduce(torch.ones(3), compression=hvd.Compression.topk(0.1)),
    "DistributedOptimizer",
    what="top-k on a single allreduce",
)
if n & (n - 1) == 0:
    expect_error(
        InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            op=hvd.Adasum,
            compression=hvd.Compression.topk(0.1),
        ),
        "Adasum",
        what="with Adasum",
    )
finish()
