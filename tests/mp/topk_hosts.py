"""Run by
tests/test_multihost_hierarchical.py::test_topk_sums_machines_densely_and_sparsifies_between_them.

Top-k across machines (run by tests/test_topk.py on network-namespace hosts): with the job's
allreduces hierarchical the exchange is Note [Hierarchical top-k]'s (machine sums, a residual per
machine, every machine's top k), checked against numpy over several steps with and without
momentum correction and warmup; the machine's ranks keep the same residual bits; error feedback
conserves the sum; a torch DistributedOptimizer trains alike on every rank. Uneven machines stay
flat. Prints one RESULT line per rank."""

import json

import numpy as np

import scaleout as so
from scaleout._native import Average
from scaleout._topk import Momentum, TopK, TopKExchange, topk_count

so.init()
r, n = so.rank(), so.size()
failures = []
places = so.allgather_object((so.cross_rank(), so.local_rank()))
machines = sorted({c for c, _ in places})
members = {h: [q for q, (c, _) in enumerate(places) if c == h] for h in machines}


def fail(what):
    failures.append(what)


def close(got, want, what, tol=1e-9):
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
        fail(f"{what}: got {got[:4]}, want {want[:4]}")


def grad(q, step, size):
    return np.random.default_rng(100 * q + step).standard_normal(size)


def top(x, k):
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def exchange_over_steps(size, density, momentum, warmup, steps=4, hierarchical=None):
    exchange = TopKExchange(
        TopK(density, warmup_steps=warmup, hierarchical=hierarchical), Average, 1.0, 1.0
    )
    residual, velocity = np.zeros(size), np.zeros(size)
    workers = [members[h] for h in machines] if exchange.hierarchical else [[q] for q in range(n)]
    ref_res = [np.zeros(size) for _ in workers]
    ref_vel = [np.zeros(size) for _ in workers]
    k = topk_count(size, density)
    put_in = np.zeros(size)
    delivered = np.zeros(size)
    name = f"x.{size}.{density}.{momentum}.{warmup}.{hierarchical}"
    for step in range(steps):
        out = np.empty(size)
        pending = exchange.start(
            name,
            grad(r, step, size),
            residual,
            step,
            velocity,
            Momentum(momentum) if momentum else None,
            out,
        )
        exchange.finish_all([(pending, out)])
        want = np.zeros(size)
        for w, ranks in enumerate(workers):
            g = sum(grad(q, step, size) for q in ranks)
            put_in += g
            if momentum:
                ref_vel[w] = momentum * ref_vel[w] + g
                ref_res[w] += ref_vel[w]
            else:
                ref_res[w] += g
            if step < warmup:
                want += ref_res[w]
                ref_res[w][:] = 0
                continue
            if exchange.hierarchical:  # each local rank's slice: its own top entries
                L = len(workers[w])
                idx = np.concatenate(
                    [
                        lo
                        + np.argsort(-np.abs(ref_res[w][lo:hi]), kind="stable")[
                            : topk_count(hi - lo, density)
                        ]
                        for lo, hi in ((size * q // L, size * (q + 1) // L) for q in range(L))
                    ]
                )
            else:
                idx = np.argsort(-np.abs(ref_res[w]), kind="stable")[:k]
            want[idx] += ref_res[w][idx]
            ref_res[w][idx] = 0
            ref_vel[w][idx] = 0
        close(out, want / n, f"{name} step {step}: result")
        delivered += out * n
        mine = [w for w, ranks in enumerate(workers) if r in ranks][0]
        close(residual, ref_res[mine], f"{name} step {step}: residual")
    # The machine's ranks hold the same residual, bit for bit; nothing is lost.
    rows = so.allgather(residual[None])
    for w, ranks in enumerate(workers):
        if any(not np.array_equal(rows[ranks[0]], rows[q]) for q in ranks):
            fail(f"{name}: the ranks of worker {w} hold different residuals")
    held = sum(rows[ranks[0]] for ranks in workers)
    if not momentum:  # (with momentum the velocities are what is conserved)
        close(delivered + held, put_in, f"{name}: delivered + residuals == put in", tol=1e-8)
    return exchange.hierarchical


hierarchical = None
for size, density, momentum, warmup in (
    (1000, 0.05, 0.0, 0),
    (70_001, 0.01, 0.9, 1),
    (5, 0.3, 0.0, 2),
):
    hierarchical = exchange_over_steps(size, density, momentum, warmup)
if exchange_over_steps(3000, 0.02, 0.0, 0, hierarchical=False):
    fail("hierarchical=False: still hierarchical")

torch_same = None
try:
    import torch

    import scaleout.torch as hvd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(50, 40), torch.nn.ReLU(), torch.nn.Linear(40, 3))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.topk(0.05, momentum_correction=True, warmup_steps=1),
    )
    for step in range(4):
        g = torch.Generator().manual_seed(r * 10 + step)
        x, y = torch.randn(16, 50, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    rows = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()])[None])
    torch_same = bool(all(torch.equal(rows[0], row) for row in rows))
except ImportError:
    pass

print(
    "RESULT "
    + json.dumps(
        {
            "hierarchical": hierarchical,
            "failures": failures[:10],
            "torch_same": torch_same,
            "algorithm": so.config()["allreduce_algorithm"],
        }
    ),
    flush=True,
)
so.shutdown()
