"""Run by tests/test_torch.py::test_n_ranks_with_batch_b_train_like_one_process_with_batch_nb.

Synchronous SGD: n ranks with batch b each train exactly like one process with batch n*b.

Every rank also trains the single-process reference on the whole global batch (no
communication) and compares parameters after every run. float64, so "exactly" means to
rounding.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from _harness import check, check_close, main

import scaleout.torch as hvd

torch.set_num_threads(1)

B = 4  # rows per rank per backward pass
STEPS = 6


def global_batch(step, micro, rows, features=6, classes=3, dtype=torch.float64):
    g = torch.Generator().manual_seed(10_000 + 100 * step + micro)
    x = torch.randn(rows, features, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (rows,), generator=g)
    return x, y


def mlp(dtype=torch.float64):
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    ).to(dtype)


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(kind)


def compare(model, ref, what, rtol, atol):
    for (k, p), (_, q) in zip(model.state_dict().items(), ref.state_dict().items()):
        check_close(p.numpy(), q.numpy(), f"{what}: {k}", rtol=rtol, atol=atol)


def train_pair(r, n, kind, passes, dtype=torch.float64, make_model=mlp, data=global_batch):
    """Returns (distributed model, reference model) after STEPS steps."""
    model = make_model(dtype)
    ref = make_model(dtype)
    opt = hvd.DistributedOptimizer(
        make_optimizer(kind, model.parameters()),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
    )
    ref_opt = make_optimizer(kind, ref.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        batches = [data(step, m, n * B, dtype=dtype) for m in range(passes)]
        for x, y in batches:
            mine = slice(r * B, (r + 1) * B)
            # mean over this rank's rows, and over the passes as one would locally
            (F.cross_entropy(model(x[mine]), y[mine]) / passes).backward()
        opt.step()
        ref_opt.zero_grad()
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    return model, ref


def test_optimizers(r, n):
    for kind in ("sgd", "adam"):
        for passes in (1, 2):
            model, ref = train_pair(r, n, kind, passes)
            compare(
                model,
                ref,
                f"{kind}, backward_passes_per_step={passes}, {n} ranks",
                rtol=1e-9,
                atol=1e-11,
            )
            # and the training moved the parameters at all
            moved = (model[0].weight - mlp()[0].weight).detach().abs().max()
            check(float(moved) > 1e-3, f"{kind}/{passes}: parameters moved ({float(moved)})")
    model, ref = train_pair(r, n, "sgd", 1, dtype=torch.float32)
    compare(model, ref, "float32 sgd", rtol=1e-4, atol=1e-5)


class BNNet(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn2 = norm[1](4)
        self.fc = nn.Linear(4 * 5 * 5, 8)
        self.bn1 = norm[0](8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.bn2(self.conv(x)))
        return self.out(torch.tanh(self.bn1(self.fc(h.flatten(1)))))


def bn_batch(step, micro, rows, dtype=torch.float64):
    g = torch.Generator().manual_seed(20_000 + 100 * step + micro)
    x = torch.randn(rows, 2, 5, 5, generator=g, dtype=dtype) * 2 + 1
    return x, torch.randint(0, 3, (rows,), generator=g)


def test_sync_batch_norm(r, n):
    def sync_net(dtype):
        torch.manual_seed(3)
        return BNNet((hvd.SyncBatchNorm, hvd.SyncBatchNorm)).to(dtype)

    def plain_net(dtype):
        torch.manual_seed(3)
        return BNNet((nn.BatchNorm1d, nn.BatchNorm2d)).to(dtype)

    # same initial weights: both seeded identically, BatchNorm has no random init
    model = sync_net(torch.float64)
    ref = plain_net(torch.float64)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = bn_batch(step, 0, n * B)
        mine = slice(r * B, (r + 1) * B)
        opt.zero_grad()
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    compare(
        model,
        ref,
        f"SyncBatchNorm vs BatchNorm on the global batch, {n} ranks",
        rtol=1e-9,
        atol=1e-11,
    )
    check(int(model.bn1.num_batches_tracked) == STEPS, "SyncBatchNorm counts batches")
    model.eval()
    ref.eval()
    x, _ = bn_batch(99, 0, 3)
    check_close(model(x).detach().numpy(), ref(x).detach().numpy(), "eval mode matches")

    # convert_sync_batchnorm keeps parameters and statistics
    torch.manual_seed(4)
    plain = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None)).double()
    plain(torch.randn(5, 3, dtype=torch.float64))
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    check(isinstance(converted[1], hvd.SyncBatchNorm), "BatchNorm1d converted")
    compare(converted, plain, "converted state", rtol=0, atol=0)
    x = torch.randn(2 * n, 3, dtype=torch.float64)
    out = converted(x[r * 2 : (r + 1) * 2])
    check_close(
        out.detach().numpy(),
        plain(x)[r * 2 : (r + 1) * 2].detach().numpy(),
        "converted layer normalises over the global batch (cumulative momentum)",
    )
    check_close(
        converted[1].running_var.numpy(),
        plain[1].running_var.numpy(),
        "converted running variance (unbiased, global)",
    )


def run():
    r, n = hvd.rank(), hvd.size()
    test_optimizers(r, n)
    test_sync_batch_norm(r, n)


if __name__ == "__main__":
    main(run)
