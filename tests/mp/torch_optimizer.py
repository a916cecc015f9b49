"""Run by tests/test_torch.py::test_distributed_optimizer_broadcasts_and_join.

DistributedOptimizer, the broadcast helpers and join() on real ranks."""

import copy
import gc
import io
import time
import warnings

import torch
import torch.nn as nn
from _harness import check, check_close, expect_error, main

import scaleout.torch as hvd

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.side = nn.Linear(4, 2)  # used only when asked: an unused-parameter case

    def forward(self, x, use_side=True):
        y = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return y + self.side(x) if use_side else y


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def data(r, step=0, rows=5):
    g = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(rows, 4, generator=g)


def local_grads(net, x, **kw):
    """Gradients of this rank's loss on a hook-free copy of the model."""
    plain = copy.deepcopy(net)
    plain.zero_grad()
    plain(x, **kw).pow(2).sum().backward()
    return {
        k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
        for k, p in plain.named_parameters()
    }


def averaged(grads, tag, op=hvd.Average):
    return {k: hvd.allreduce(g, op=op, name=f"ref.{tag}.{k}") for k, g in grads.items()}


def same_on_all_ranks(tensor, what):
    rows = hvd.allgather(tensor.detach().reshape(1, -1), name=f"same.{what}")
    check(bool((rows == rows[0]).all()), f"{what} equal on every rank")


def test_construction_errors():
    net = make_net()
    sgd = lambda: torch.optim.SGD(net.parameters(), lr=0.1)  # noqa: E731
    named = list(net.named_parameters())
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), named_parameters=named + named[:1]),
        "duplicate names",
        "fc1.weight",
        what="duplicate names",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), named_parameters=named[:-2]),
        "misses 2 parameter",
        what="missing names",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[p for _, p in named]),
        "(name, parameter) pairs",
        what="parameters without names",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Max),
        "op=Average, op=Sum or op=Adasum",
        what="op=Max",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2),
        "needs op=Average",
        what="predivide with Sum",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0),
        ">= 1",
        what="backward_passes_per_step=0",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(net),
        "torch.optim",
        what="not an optimizer",
    )
    opt = hvd.DistributedOptimizer(sgd(), named_parameters=net.named_parameters())
    check(
        isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD",
        "the wrapper is an instance of the wrapped optimizer's class",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(opt),
        "already",
        what="wrapping twice",
    )
    # A dropped DistributedOptimizer's hooks go with it: a new one over the same model works.
    del opt
    gc.collect()
    opt = hvd.DistributedOptimizer(
        sgd(), named_parameters=net.named_parameters(), num_groups=2
    )  # a Horovod hint, accepted
    net(data(0)).pow(2).sum().backward()
    opt.step()
    same_on_all_ranks(net.fc1.weight, "weights after re-wrapping")


def test_overlap_and_average(r, n):
    net = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters()
    )
    x = data(r).requires_grad_()
    want = averaged(local_grads(net, x.detach()), "overlap")
    started_before_input_grad = []
    x.register_hook(lambda g: started_before_input_grad.append(len(opt._so_handles)))
    net(x).pow(2).sum().backward()
    # The input's gradient is among the last things backward computes; by then the reductions
    # of the later layers were already under way.
    check(
        started_before_input_grad[0] >= 6,
        f"reductions started during backward: {started_before_input_grad[0]} of 8 params",
    )
    deadline = time.time() + 30
    while not all(hvd.poll(q.handle) for q in opt._so_handles.values()) and time.time() < deadline:
        time.sleep(0.001)
    # zero copy into p.grad: the averages are in place before step() or synchronize()
    for k, p in net.named_parameters():
        check_close(p.grad.numpy(), want[k].numpy(), f"{k}: averaged before step()")
    before = {k: p.detach().clone() for k, p in net.named_parameters()}
    opt.step()
    for k, p in net.named_parameters():
        check_close(p.detach().numpy(), (before[k] - 0.1 * want[k]).numpy(), f"{k}: SGD step")
    same_on_all_ranks(net.fc1.weight, "fc1.weight after a step")


def test_unused_parameters(r, n):
    net = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters()
    )
    use_side = r != 0  # rank 0 never touches `side`
    x = data(r, 1)
    want = averaged(local_grads(net, x, use_side=use_side), "unused")
    opt.zero_grad()
    net(x, use_side=use_side).pow(2).sum().backward()
    check((net.side.weight.grad is None) == (r == 0), "side has no local gradient on rank 0")
    opt.step()  # must not hang: rank 0 contributes zeros for `side`
    for k, p in net.named_parameters():
        check_close(p.grad.numpy(), want[k].numpy(), f"{k}: average with an unused parameter")
    same_on_all_ranks(net.side.weight, "side.weight after an unused step")


def test_backward_passes_per_step(r, n):
    net = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1),
        named_parameters=net.named_parameters(),
        backward_passes_per_step=2,
    )
    xs = [data(r, 10), data(r, 11)]
    g0, g1 = local_grads(net, xs[0]), local_grads(net, xs[1])
    want = averaged({k: g0[k] + g1[k] for k in g0}, "bpps")
    opt.zero_grad()
    net(xs[0]).pow(2).sum().backward()
    check(len(opt._so_handles) == 0, "no reduction after the first of two passes")
    net(xs[1]).pow(2).sum().backward()
    check(len(opt._so_handles) == 8, "every gradient reduced after the second pass")
    opt.synchronize()
    for k, p in net.named_parameters():
        check_close(
            p.grad.numpy(), want[k].numpy(), f"{k}: two passes summed, then averaged", rtol=1e-5
        )
    with opt.skip_synchronize():
        opt.step()
    # The counts start over after a step.
    opt.zero_grad()
    net(xs[0]).pow(2).sum().backward()
    net(xs[1]).pow(2).sum().backward()
    # A third pass would add into gradients being reduced: an error (this step's gradients are
    # then unusable; the program has a bug to fix).
    expect_error(
        hvd.ScaleoutError,
        lambda: net(xs[0]).pow(2).sum().backward(),
        "more than backward_passes_per_step=2",
        what="a third pass before step()",
    )
    opt.synchronize()


def test_synchronize_clip_skip_zero_grad(r, n):
    net = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.5), named_parameters=net.named_parameters()
    )
    x = data(r, 3) * 10
    want = averaged(local_grads(net, x), "clip")
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    expect_error(hvd.ScaleoutError, opt.zero_grad, "pending", what="zero_grad while pending")

    def step_inside_skip():
        with opt.skip_synchronize():
            opt.step()

    expect_error(
        hvd.ScaleoutError,
        step_inside_skip,
        "synchronize() first",
        what="skip_synchronize while pending",
    )
    opt.synchronize()
    for k, p in net.named_parameters():
        check_close(p.grad.numpy(), want[k].numpy(), f"{k}: averaged by synchronize()")
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=0.01)
    check(float(norm) > 0.01, "the gradients were large enough to clip")
    clipped = {k: p.grad.clone() for k, p in net.named_parameters()}
    before = {k: p.detach().clone() for k, p in net.named_parameters()}
    with opt.skip_synchronize():
        opt.step()
    for k, p in net.named_parameters():
        check_close(
            p.detach().numpy(),
            (before[k] - 0.5 * clipped[k]).numpy(),
            f"{k}: step used the clipped gradient",
        )
    # A step() without skip after synchronize() warns and reduces again, as Horovod's does
    # (a second Average of averaged gradients leaves them as they are).
    opt.zero_grad()
    net(x).pow(2).sum().backward()
    opt.synchronize()
    grads = {k: p.grad.clone() for k, p in net.named_parameters()}
    before = {k: p.detach().clone() for k, p in net.named_parameters()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in caught]
    check(
        len(texts) == 1
        and "optimizer.step() called without optimizer.skip_synchronize() "
        "context after optimizer.synchronize()"
        in texts[0],
        f"step() after synchronize() warns as Horovod's ({texts})",
    )
    check_close(
        net.fc1.weight.detach().numpy(),
        (before["fc1.weight"] - 0.5 * grads["fc1.weight"]).numpy(),
        "step() after synchronize(): averaged again, the same gradients",
    )
    opt.zero_grad()  # nothing pending: fine

    # step(closure)
    def closure():
        opt.zero_grad()
        loss = net(x).pow(2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    check(isinstance(loss, torch.Tensor), "step(closure) returns the closure's loss")
    same_on_all_ranks(net.fc3.weight, "fc3.weight after step(closure)")


def test_ops_and_compression(r, n):
    base = make_net()
    x = data(r, 4)
    local = local_grads(base, x)
    avg = averaged(local, "ops")
    total = averaged(local, "ops_sum", op=hvd.Sum)
    cases = [
        ("Sum", dict(op=hvd.Sum), total, 1e-6),
        ("predivide", dict(gradient_predivide_factor=2.0), avg, 1e-6),
        ("fp16", dict(compression=hvd.Compression.fp16), avg, 2e-2),
        ("bf16", dict(compression=hvd.Compression.bf16), avg, 5e-2),
    ]
    for label, kwargs, want, tol in cases:
        net = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1),
            named_parameters=net.named_parameters(),
            **kwargs,
        )
        net(x).pow(2).sum().backward()
        opt.synchronize()
        for k, p in net.named_parameters():
            check(p.grad.dtype == torch.float64, f"{label}: {k} grad keeps its dtype")
            check_close(p.grad.numpy(), want[k].numpy(), f"{label}: {k}", rtol=tol, atol=tol)
        with opt.skip_synchronize():
            opt.step()


def test_state_dict_and_scheduler(r, n):
    net = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=0.01), named_parameters=net.named_parameters()
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            opt.zero_grad()
            net(data(r, 20 + step)).pow(2).sum().backward()
            opt.step()
            sched.step()
    check(
        not [w for w in caught if "lr_scheduler" in str(w.message)],
        f"no scheduler warnings: {[str(w.message) for w in caught]}",
    )
    check_close(opt.param_groups[0]["lr"], 0.0025, "StepLR halved the lr twice")
    checkpoint = io.BytesIO()
    torch.save(opt.state_dict(), checkpoint)
    checkpoint.seek(0)
    state = torch.load(checkpoint)
    check(float(state["state"][0]["step"]) == 4.0, "Adam counted 4 steps")
    net2 = make_net(seed=5)
    opt2 = hvd.DistributedOptimizer(
        torch.optim.Adam(net2.parameters(), lr=0.01), named_parameters=net2.named_parameters()
    )
    opt2.load_state_dict(state)
    hook_calls = []
    opt2.register_step_pre_hook(lambda *a: hook_calls.append(1))
    check_close(opt2.param_groups[0]["lr"], 0.0025, "load_state_dict restores the lr")
    check_close(
        opt2.state[net2.fc1.weight]["exp_avg"].numpy(),
        opt.state[net.fc1.weight]["exp_avg"].numpy(),
        "load_state_dict restores moments",
    )
    net2.load_state_dict(net.state_dict())
    for o, m in ((opt, net), (opt2, net2)):
        o.zero_grad()
        m(data(r, 30)).pow(2).sum().backward()
        o.step()
    check_close(
        net2.fc1.weight.detach().numpy(),
        net.fc1.weight.detach().numpy(),
        "a restored optimizer continues identically",
    )
    check(len(hook_calls) == 1, f"step pre-hooks run once per step ({len(hook_calls)})")


class CountingSGD(torch.optim.SGD):
    """Keeps a plain-int step count in its state, as some optimizers do."""

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["count"] = self.state[p].get("count", 0) + 1
        return super().step(closure)


def test_broadcast_helpers(r, n):
    root = n - 1
    torch.manual_seed(100 + r)  # different initial weights on every rank
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model(torch.randn(6, 3) + r)  # rank-dependent BatchNorm statistics
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    for k, v in model.state_dict().items():
        same_on_all_ranks(v.to(torch.float64), f"state_dict[{k}] after broadcast_parameters")
    check(int(model[1].num_batches_tracked) == 1, "int64 buffer broadcast")
    torch.manual_seed(200 + r)
    other = nn.Linear(3, 3)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=0, name="named")
    same_on_all_ranks(other.weight, "named_parameters broadcast")
    loss = other(torch.ones(1, 3)).sum()
    loss.backward()  # in-place broadcast of a leaf requiring grad leaves autograd working
    check(other.weight.grad is not None, "backward after broadcast_parameters")

    # SGD with momentum: state exists on root only (as after loading a checkpoint there)
    net = make_net()
    sgd = CountingSGD(net.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    if r == root:
        for step in range(2):
            sgd.zero_grad()
            net(data(r, step)).pow(2).sum().backward()
            sgd.step()
    hvd.broadcast_optimizer_state(sgd, root_rank=root)
    check_close(sgd.param_groups[0]["lr"], 0.1 * (root + 1), "lr from root")
    check(sgd.state[net.fc1.weight].get("count") == 2, "plain-int state from root")
    same_on_all_ranks(sgd.state[net.fc2.bias]["momentum_buffer"], "momentum buffer")

    # Adam whose state is empty everywhere (before its first step): as Horovod's, the state is
    # first made by a step on zero gradients (step 1, zero moments, parameters unchanged).
    adam = torch.optim.Adam(net.parameters(), lr=0.001 * (r + 1), betas=(0.8, 0.9 + 0.01 * r))
    weights = net.fc1.weight.detach().clone()
    hvd.broadcast_optimizer_state(adam, root_rank=root)
    check(adam.param_groups[0]["betas"] == (0.8, 0.9 + 0.01 * root), "betas from root")
    state = adam.state[net.fc1.weight]
    check(
        float(state["step"]) == 1.0 and not state["exp_avg"].any(),
        f"empty state initialized by a zero step ({dict(state)})",
    )
    check(torch.equal(net.fc1.weight.detach(), weights), "the zero step moves no weight")

    # Adam with a tensor step count on root only, then trained on as one
    net2 = make_net()
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(net2.parameters(), lr=0.01), named_parameters=net2.named_parameters()
    )
    if r == root:  # trained alone (the hooks of `opt` must not see these passes)
        alone = copy.deepcopy(net2)
        plain = torch.optim.Adam(alone.parameters(), lr=0.01)
        for step in range(3):
            plain.zero_grad()
            alone(data(r, step)).pow(2).sum().backward()
            plain.step()
        opt.load_state_dict(plain.state_dict())
        net2.load_state_dict(alone.state_dict())
    hvd.broadcast_parameters(net2.state_dict(), root_rank=root, name="net2")
    hvd.broadcast_optimizer_state(opt, root_rank=root, name="adam_state")
    step = opt.state[net2.fc1.weight]["step"]
    check(float(step) == 3.0, f"Adam step count from root ({step})")
    opt.zero_grad()
    net2(data(r, 9)).pow(2).sum().backward()
    opt.step()
    same_on_all_ranks(net2.fc1.weight, "weights after a step from broadcast state")
    same_on_all_ranks(opt.state[net2.fc1.weight]["exp_avg_sq"], "Adam moment after a step")


def test_join_uneven_data(r, n):
    """Rank r has 2 + r batches. A rank out of data joins; the others keep stepping, with the
    joined ranks contributing zero gradients (Average still divides by n). Checked against the
    same arithmetic done in one process."""
    net = make_net(seed=7)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.5),
        named_parameters=net.named_parameters(),
    )
    ref = make_net(seed=7)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.5)
    for step in range(2 + (n - 1)):
        # the reference: every rank's data that exists at this step
        ref_opt.zero_grad()
        active = [k for k in range(n) if step < 2 + k]
        for k in active:
            (ref(data(k, 50 + step)).pow(2).sum() / n).backward()
        ref_opt.step()
        if step < 2 + r:
            opt.zero_grad()
            net(data(r, 50 + step)).pow(2).sum().backward()
            opt.step()
    last = hvd.join()
    check(last == n - 1, f"join() returns the last rank to join ({last})")
    hvd.broadcast_parameters(net.state_dict(), root_rank=last, name="after_join")
    for k, p in net.named_parameters():
        check_close(
            p.detach().numpy(),
            dict(ref.named_parameters())[k].detach().numpy(),
            f"{k} after uneven data and join",
            rtol=1e-9,
            atol=1e-9,
        )


def run():
    r, n = hvd.rank(), hvd.size()
    test_construction_errors()
    test_overlap_and_average(r, n)
    test_unused_parameters(r, n)
    test_backward_passes_per_step(r, n)
    test_synchronize_clip_skip_zero_grad(r, n)
    test_ops_and_compression(r, n)
    test_state_dict_and_scheduler(r, n)
    test_broadcast_helpers(r, n)
    test_join_uneven_data(r, n)


if __name__ == "__main__":
    main(run)
