"""Run by tests/test_adasum.py::test_torch_distributed_optimizer_combines_parameter_changes.

DistributedOptimizer(op=Adasum) (Note [Adasum optimizer]): each step, every rank's parameter
change from the wrapped optimizer's local step is combined with Horovod's Adasum tree and
added to the parameters, checked against a numpy evaluation for SGD with momentum over three
steps; every rank ends with the same model; 3 ranks get NotImplementedError as Horovod."""

import torch
from _harness import check, check_close, expect_error, finish

import scaleout.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)


def pair(a, b):
    dot, na, nb = a @ b, a @ a, b @ b
    ca = 1 - dot / (2 * na) if na > 0 else 1.0
    cb = 1 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def tree(vectors):
    while len(vectors) > 1:
        vectors = [pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def batch(q, step):
    g = torch.Generator().manual_seed(100 * step + q)
    return torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(
        8, 2, generator=g, dtype=torch.float64
    )


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)
    ).double()


if n & (n - 1) == 0:
    model = make()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    # The reference: every rank's model and momentum, stepped locally, changes combined.
    refs = [make() for _ in range(n)]
    ref_opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in refs]
    for step in range(3):
        x, y = batch(r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        starts = [p.detach().clone() for p in refs[0].parameters()]
        deltas = []
        for q in range(n):
            xq, yq = batch(q, step)
            ref_opts[q].zero_grad()
            torch.nn.functional.mse_loss(refs[q](xq), yq).backward()
            ref_opts[q].step()
            deltas.append([(p.detach() - s).numpy() for p, s in zip(refs[q].parameters(), starts)])
        with torch.no_grad():
            for i, s in enumerate(starts):
                combined = tree([deltas[q][i].ravel() for q in range(n)]).reshape(s.shape)
                for q in range(n):
                    list(refs[q].parameters())[i].copy_(s + torch.from_numpy(combined))
        for (name, p), want in zip(model.named_parameters(), refs[0].parameters()):
            check_close(
                p.detach().numpy(),
                want.detach().numpy(),
                f"step {step}: {name}",
                rtol=1e-10,
                atol=1e-12,
            )
    weights = hvd.allgather_object([p.detach().numpy().tobytes() for p in model.parameters()])
    check(all(w == weights[0] for w in weights), "every rank has the same model")
    opt.synchronize()  # does nothing with Adasum (as Horovod)
    expect_error(AssertionError, lambda: opt.skip_synchronize().__enter__(), "Adasum")
else:
    model = make()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    x, y = batch(r, 0)

    def backward():
        torch.nn.functional.mse_loss(model(x), y).backward()

    expect_error(NotImplementedError, backward, "non-power of 2")
finish()
