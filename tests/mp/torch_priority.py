"""Run by tests/test_torch.py::test_priority_executes_highest_first_in_rounds ("order") and
tests/test_torch.py::test_overlap_forward_trains_bit_for_bit_like_step ("train").

order (run with SCALEOUT_CYCLE_TIME long and SCALEOUT_PRIORITY_BYTES=256): reductions that
become ready together execute highest priority first, one per round, in the timeline rank 0
writes (Note [Priority]); allreduces larger than that, cut into parts, give the right sums.
train (run with SCALEOUT_FUSION_THRESHOLD=0, and every gradient smaller than the default
SCALEOUT_PRIORITY_BYTES, so none is cut into parts: beyond 2 ranks a sum's rounding depends on
where a tensor lands in a fused buffer or a part, which timing and priorities change):
DistributedOptimizer(priority=..., overlap_forward=model) updates the model bit for bit as the
plain one does (Note [Forward overlap]), and refuses what it cannot do."""

import os
import sys

import torch
import torch.nn as nn
from _harness import check, expect_error, main
from _timeline import read

import scaleout.torch as hvd

torch.set_num_threads(1)


def check_order():
    """A 'gate' tensor that rank 0 submits first and the others last keeps everything else
    half-submitted, so the six reductions become ready in one round, whatever their timing."""
    path = sys.argv[2]
    hvd.start_timeline(path)
    priorities = [4, 1, 6, 2, 5, 3]  # submitted in this order on every rank; the gate's is 0
    gate = torch.ones(4)
    handles = []
    if hvd.rank() == 0:
        handles.append(hvd.allreduce_async_(gate, name="gate"))
    for p in priorities:
        handles.append(hvd.allreduce_async_(torch.ones(64), name=f"t{p}", priority=p))
    if hvd.rank() != 0:
        handles.append(hvd.allreduce_async_(gate, name="gate"))
    for h in handles:
        hvd.synchronize(h)
    hvd.stop_timeline()
    if hvd.rank() == 0:
        _, _, spans = read(path)
        starts = {s["tensor"]: s["ts"] for s in spans if s["name"] == "ALLREDUCE"}
        order = sorted(starts, key=lambda name: starts[name])
        check(
            order == [f"allreduce.{name}" for name in ("t6", "t5", "t4", "t3", "t2", "t1", "gate")],
            f"executed highest priority first: {order}",
        )
    # Parts: 40 KB and 10 KB tensors in 256-byte parts, of every dtype the core reduces in
    # parts alike, beside a whole one; a part's elements are reduced like a tensor's.
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16):
        big = (torch.arange(10000) % 7 + r).to(dtype)
        small = torch.full((2500,), float(r + 1)).to(dtype)
        handles = [
            hvd.allreduce_async_(big, name=f"big.{dtype}", op=hvd.Sum, priority=1),
            hvd.allreduce_async_(small, name=f"small.{dtype}", op=hvd.Average, priority=2),
            hvd.allreduce_async_(torch.ones(3, dtype=dtype), name=f"plain.{dtype}", op=hvd.Sum),
        ]
        out = [hvd.synchronize(h) for h in handles]
        want = (torch.arange(10000) % 7 * n + n * (n - 1) // 2).to(dtype)
        check(torch.equal(out[0], want), f"{dtype}: a tensor reduced in parts")
        check(torch.equal(out[1], torch.full((2500,), (n + 1) / 2).to(dtype)), f"{dtype}: avg")
        check(torch.equal(out[2], torch.full((3,), n, dtype=dtype)), f"{dtype}: whole")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 16), nn.Tanh())
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.head(self.block(x)))


def make(seed=1):
    torch.manual_seed(seed)
    return Net()


def batch(step):
    g = torch.Generator().manual_seed(100 * hvd.rank() + step)
    return torch.randn(5, 3, 6, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def train(make_opt, overlap, steps=5, set_to_none=True, reads=False, passes=1, **options):
    """Trains a fresh model; returns it, its optimizer and the optimizer's state_dict."""
    model = make()
    base = make_opt(model)
    opt = hvd.DistributedOptimizer(
        base,
        model.named_parameters(),
        overlap_forward=model if overlap else None,
        backward_passes_per_step=passes,
        **options,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        for k in range(passes):
            x, y = batch(10 * step + k)
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()  # before the deferred updates run: they keep the step's own lr
        if reads and step == 2:
            # The model's state_dict applies the deferred updates (the next forward finds
            # them done and does not apply them twice).
            model.state_dict()
    return model, opt, opt.state_dict()


def same_state(a, b, what):
    sa, sb = a.state_dict(), b.state_dict()
    check(list(sa) == list(sb), f"{what}: same keys")
    check(all(torch.equal(sa[k], sb[k]) for k in sa), f"{what}: bit for bit equal")


def check_training():
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)  # noqa: E731
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.01)  # noqa: E731
    cases = [
        ("SGD", sgd, {}, ({}, {"set_to_none": False}, {"reads": True})),
        ("Adam", adam, {}, ({}, {"set_to_none": False}, {"reads": True})),
        ("SGD fp16, 2 passes", sgd, {"compression": hvd.Compression.fp16, "passes": 2}, ({},)),
    ]
    for name, make_opt, options, variants in cases:
        plain, _, plain_state = train(make_opt, overlap=False, **options)
        for kwargs in variants:
            model, opt, state = train(make_opt, overlap=True, **options, **kwargs)
            same_state(model, plain, f"{name} overlap_forward {kwargs}")
            moments = [
                (k, torch.equal(v, plain_state["state"][i][k]))
                for i, s in state["state"].items()
                for k, v in s.items()
                if isinstance(v, torch.Tensor)
            ]
            check(moments and all(ok for _, ok in moments), f"{name} {kwargs}: optimizer state")
            del opt
    # The updates are deferred: right after step() the first layer still has its old weight,
    # and the next forward (here an evaluation) applies it.
    model = make()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(), overlap_forward=model
    )
    before = model.block.conv.weight.detach().clone()
    x, y = batch(0)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    check(torch.equal(model.block.conv.weight, before), "the update waits for the forward")
    with torch.no_grad():
        model(x)
    check(not torch.equal(model.block.conv.weight, before), "the forward applied the update")
    # A priority order that the user gives changes no value.
    model, ref = make(), make()
    ordered = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model.named_parameters(),
        priority=[name for name, _ in reversed(list(model.named_parameters()))],
    )
    plain = hvd.DistributedOptimizer(
        torch.optim.SGD(ref.parameters(), lr=0.1), ref.named_parameters(), priority=False
    )
    for step in range(3):
        for m, o in ((model, ordered), (ref, plain)):
            o.zero_grad()
            x, y = batch(step)
            nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    same_state(model, ref, "priority order")


class Attention(nn.Module):
    """nn.MultiheadAttention reads its out_proj's weight without calling out_proj."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.attn(x, x, x)[0].mean(0))


def check_other_models():
    """nn.MultiheadAttention, a parameter group added later, and load_state_dict in between."""

    def run(overlap, extra_group):
        torch.manual_seed(3)
        model = Attention()
        first = model.attn.parameters() if extra_group else model.parameters()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(first, lr=0.1, momentum=0.5),
            model.named_parameters(),
            overlap_forward=model if overlap else None,
        )
        if extra_group:
            opt.add_param_group({"params": list(model.out.parameters()), "lr": 0.05})
        g = torch.Generator().manual_seed(hvd.rank())
        for _ in range(4):
            opt.zero_grad()
            x, y = torch.randn(5, 2, 8, generator=g), torch.randint(0, 3, (2,), generator=g)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        model.state_dict()  # the last update (its names stay in flight until it is applied)
        return model

    for extra_group in (False, True):
        same_state(run(True, extra_group), run(False, extra_group), f"attention {extra_group}")
    # Loading weights after step(): the load wins over the deferred update.
    model = make()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(), overlap_forward=model
    )
    x, y = batch(0)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    model.load_state_dict(saved)
    with torch.no_grad():
        model(x)
    check(torch.equal(model.out.weight, saved["out.weight"]), "load_state_dict after step()")


class Tied(nn.Module):
    """Uses its child's weight outside the child's forward."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return x @ self.inner.weight.t()


def check_refusals():
    model = make()
    params = model.named_parameters
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    for bad, fragment in (
        ("block", "sequence of parameters"),
        (3, "sequence of parameters"),
        (["nope"], "'nope'"),
        (["out.bias", "out.bias"], "more than once"),
        ([torch.zeros(2)], "a tensor"),
    ):
        expect_error(
            ValueError,
            lambda bad=bad: hvd.DistributedOptimizer(sgd(), params(), priority=bad),
            fragment,
            what=f"priority={bad!r}",
        )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), params(), overlap_forward="model"),
        "torch.nn.Module",
    )
    expect_error(
        ValueError,
        lambda: hvd.allreduce_async_(torch.ones(2), name="negative", priority=-1),
        "priority must be 0 or more",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), params(), overlap_forward=model.block),
        "does not hold",
        "out.weight",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd(), params(), op=hvd.Adasum, overlap_forward=model),
        "Adasum",
    )
    # A parameter read outside its module's forward: the backward that follows says so.
    tied = Tied()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(tied.parameters(), lr=0.1), tied.named_parameters(), overlap_forward=tied
    )
    x = torch.ones(2, 4)
    tied(x).sum().backward()
    opt.step()
    opt.zero_grad()
    expect_error(
        hvd.ScaleoutError, lambda: tied(x).sum().backward(), "inner.weight", "outside the forward"
    )
    opt.zero_grad()
    opt.synchronize()  # nothing deferred is left: the optimizer goes on
    tied.inner(x).sum().backward()
    opt.step()


def run():
    if sys.argv[1] == "order":
        check_order()
    else:
        check_training()
        check_other_models()
        check_refusals()
    hvd.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("SCALEOUT_LOG_LEVEL", "1")
    main(run)
