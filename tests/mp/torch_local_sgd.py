"""Run by tests/test_local_sgd.py::test_local_sgd_rounds_outer_step_resume_and_bad_arguments
(with SCALEOUT_FUSION_THRESHOLD=0: every gradient reduced alone, so bulk-synchronous steps round
alike whatever the timing, beyond 2 ranks too).

LocalSGDOptimizer (Note [Local SGD]): period 1 and the warm-up are DistributedOptimizer bit for
bit; between rounds the ranks' models differ (each rank trains on its own data), right after
each round they are equal, parameters and BatchNorm buffers, and equal to the average of what
the ranks had; DiLoCo's outer step against the same arithmetic made by hand; a run saved and
resumed mid-period equals the one that was not, through TorchState's commits too; stats()
counts the rounds; bad arguments."""

import torch
import torch.nn as nn
from _harness import check, expect_error, main

import scaleout.torch as hvd

torch.set_num_threads(1)


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def batch(step):
    """This rank's own data: every rank trains on something else."""
    g = torch.Generator().manual_seed(1000 * hvd.rank() + step)
    return torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)


def train(net, opt, steps, first=0, after=None):
    for step in range(first, first + steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if after is not None:
            after(step)


def state(net):
    """The model's parameters and floating-point buffers, flattened."""
    return torch.cat(
        [t.detach().reshape(-1) for t in net.state_dict().values() if t.is_floating_point()]
    )


def same_everywhere(t) -> bool:
    copies = hvd.allgather_object(t.clone())
    return all(torch.equal(copies[0], c) for c in copies)


def check_bulk_steps():
    """period=1 (no outer optimizer) is DistributedOptimizer; so are the warm-up steps."""
    for period, warmup, steps in ((1, 0, 6), (4, 3, 3)):
        a, b = model(), model()
        plain = hvd.DistributedOptimizer(
            torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9),
            named_parameters=a.named_parameters(),
        )
        local = hvd.LocalSGDOptimizer(
            torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9),
            b,
            period=period,
            warmup_steps=warmup,
            average_buffers=False,
        )
        train(a, plain, steps)
        train(b, local, steps)
        params = lambda n: torch.cat([p.detach().reshape(-1) for p in n.parameters()])  # noqa: E731
        check(
            torch.equal(params(a), params(b)),
            f"period {period}, warm-up {warmup}: {steps} steps equal DistributedOptimizer's",
        )
        check(same_everywhere(params(b)), f"period {period}: the same model on every rank")


def check_rounds():
    """Between rounds the models differ; right after each the parameters and BatchNorm buffers
    are equal everywhere and are the average of what the ranks had."""
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), net, period=3, warmup_steps=2
    )
    before = hvd.stats()["local_sgd"]["all"]
    seen = {"rounds": 0, "apart": 0}
    inner_step = opt._so_wrapped_step

    def spy(closure=None):
        """Each rank's model just before the schedule's averaging, after the local step."""
        result = inner_step(closure)
        spy.last = state(net)
        return result

    opt._so_wrapped_step = spy

    def after(step):
        local = step + 1 - 2  # local steps made (2 warm-up steps)
        mine = state(net)
        if local > 0 and local % 3 == 0:
            seen["rounds"] += 1
            check(same_everywhere(mine), f"step {step}: equal everywhere after the round")
            copies = hvd.allgather_object(spy.last)
            mean = torch.stack(copies).mean(0)
            check(
                torch.allclose(mine, mean, rtol=1e-5, atol=1e-6),
                f"step {step}: the round's result is the ranks' average",
            )
        elif local > 0 and hvd.size() > 1:
            seen["apart"] += not same_everywhere(mine)

    train(net, opt, 2 + 9, after=after)
    check(seen["rounds"] == 3, f"3 rounds in 9 local steps, saw {seen['rounds']}")
    if hvd.size() > 1:
        check(seen["apart"] == 6, f"the models differ between rounds: {seen['apart']} of 6")
    after_stats = hvd.stats()["local_sgd"]["all"]
    check(after_stats["rounds"] - before["rounds"] == 3, f"stats counts 3 rounds: {after_stats}")
    nbytes = sum(t.numel() * 4 for t in net.state_dict().values() if t.is_floating_point())
    check(
        after_stats["bytes"] - before["bytes"] == 3 * nbytes,
        f"stats counts the averaged bytes: {after_stats}, {nbytes} per round",
    )
    # average() now, between rounds
    train(net, opt, 1, first=100)
    opt.average()
    check(same_everywhere(state(net)), "average() leaves the same model everywhere")
    # Buffers left alone when asked: running statistics differ, parameters agree.
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05),
        net.named_parameters(),
        period=2,
        average_buffers=False,
    )
    train(net, opt, 2)
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    check(same_everywhere(params), "average_buffers=False: parameters still averaged")
    if hvd.size() > 1:
        check(not same_everywhere(net[1].running_mean), "average_buffers=False: buffers differ")


def check_outer():
    """DiLoCo: at each round the anchor moves by SGD(momentum, nesterov) on anchor - average."""
    lr, outer_lr, mu = 0.05, 0.7, 0.9
    net = model()
    outer = torch.optim.SGD(net.parameters(), lr=outer_lr, momentum=mu, nesterov=True)
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=lr),
        net,
        period=2,
        outer_optimizer=outer,
        average_buffers=False,
    )
    params = lambda: torch.cat([p.detach().reshape(-1) for p in net.parameters()])  # noqa: E731
    anchor = params().double()
    velocity = torch.zeros_like(anchor)
    inner_step = opt._so_wrapped_step
    last = {}

    def spy(closure=None):
        result = inner_step(closure)
        last["local"] = params().double()
        return result

    opt._so_wrapped_step = spy
    for step in range(6):
        train(net, opt, 1, first=step)
        if (step + 1) % 2 == 0:
            mean = torch.stack(hvd.allgather_object(last["local"])).mean(0)
            grad = anchor - mean
            velocity = mu * velocity + grad
            anchor = anchor - outer_lr * (grad + mu * velocity)
            check(
                torch.allclose(params().double(), anchor, rtol=1e-5, atol=1e-6),
                f"step {step}: the outer step from the anchor",
            )
            check(same_everywhere(params()), f"step {step}: equal everywhere after the outer step")


def check_anchor_after_average_in_warm_up():
    """average() during the warm-up averages alone: the outer optimizer's anchor is still the
    model at the warm-up's end."""
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05),
        net,
        period=2,
        warmup_steps=3,
        outer_optimizer=torch.optim.SGD(net.parameters(), lr=0.7, momentum=0.9),
    )
    train(net, opt, 1)
    opt.average()
    train(net, opt, 2, first=1)
    end = [p.detach().clone() for p in net.parameters()]
    anchor = [opt._so_anchor[p] for p in net.parameters()]
    check(all(torch.equal(a, e) for a, e in zip(anchor, end)), "the anchor: the warm-up's end")


def resumed(make, steps, at):
    """A run of `steps` steps from make()'s (model, optimizer), and the same run saved after
    `at` steps and resumed in a new pair: (the first's model, the second's, the optimizer's
    saved state_dict, the step count the resumed optimizer had right after loading it)."""
    net, opt = make()
    train(net, opt, steps)
    want = state(net)
    net, opt = make()
    train(net, opt, at)
    saved = (net.state_dict(), opt.state_dict())
    net, opt = make()
    net.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    restored = opt.state_dict()["scaleout_local_sgd"]["step"]
    train(net, opt, steps - at, first=at)
    return want, state(net), saved[1], restored


def check_resume():
    """Saved after step 4 of period 3 (mid-period), loaded into a new model and optimizer: the
    next steps give what the run that went on gave, with an outer optimizer's state too."""

    def make():
        net = model()
        outer = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.5)
        opt = hvd.LocalSGDOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
            net,
            period=3,
            warmup_steps=1,
            outer_optimizer=outer,
        )
        return net, opt

    want, got, _, restored = resumed(make, 10, 5)
    check(restored == 5, "the step count is restored")
    check(torch.equal(got, want), "resumed mid-period: the same model as the run that went on")


def check_staleness():
    """Bounded staleness: a round is taken S steps after it started, as average + own progress
    since the snapshot; with one rank slowed, the others wait exactly at that step of every
    round and the slowed one never; a run saved with a round in flight resumes bit for bit."""
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), net, period=3, staleness=2
    )
    params = lambda: torch.cat([p.detach().reshape(-1) for p in net.parameters()])  # noqa: E731
    seen = {}
    start_round, take_round = opt._so_start_round, opt._so_take_round

    def started():
        start_round()
        # every rank is at the same step here (nothing is slowed): the ranks' snapshots
        seen["snapshots"] = hvd.allgather_object(params())
        seen["mine"] = params()

    def taken():
        before = params()
        take_round()
        mean = torch.stack(seen["snapshots"]).mean(0)
        check(
            torch.allclose(params(), mean + (before - seen["mine"]), rtol=1e-5, atol=1e-6),
            "a stale round is taken as average + own progress since the snapshot",
        )
        seen["taken"] = seen.get("taken", []) + [opt._so_local.step]

    opt._so_start_round, opt._so_take_round = started, taken
    train(net, opt, 12)
    check(
        seen.get("taken") == [5, 8, 11], f"rounds taken 2 steps after 3, 6, 9: {seen.get('taken')}"
    )
    opt.average()
    check(same_everywhere(state(net)), "average() takes the round in flight, then averages")

    # Resume with a round in flight (saved after step 7: the round of step 6 is taken at 8).
    def make():
        net = model()
        return net, hvd.LocalSGDOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), net, period=3, staleness=2
        )

    want, got, saved, _ = resumed(make, 12, 7)
    check(saved["scaleout_local_sgd"]["round"] is not None, "the round in flight is saved")
    check(torch.equal(got, want), "resumed with a round in flight: the same model")

    # One rank slowed (its steps do much more arithmetic): the others wait at the bound.
    slow = hvd.size() - 1
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), net, period=4, staleness=2
    )
    waits = []
    heavy = torch.randn(400, 400)

    def after(step):
        if hvd.rank() == slow:
            for _ in range(40):
                heavy.mm(heavy)
        count = hvd.stats()["local_sgd"]["all"]["waits"]
        if count != after.count:
            waits.append(step + 1)
        after.count = count

    after.count = hvd.stats()["local_sgd"]["all"]["waits"]
    train(net, opt, 16, after=after)
    if hvd.rank() == slow:
        check(waits == [], f"the slowed rank never waits: waited after steps {waits}")
    else:
        check(waits == [6, 10, 14], f"waits exactly 2 steps after each round: {waits}")
    opt.average()
    check(same_everywhere(state(net)), "after the straggler run, average() agrees everywhere")

    err = hvd.InvalidArgumentError
    sgd = lambda: torch.optim.SGD(net.parameters(), lr=0.1)  # noqa: E731
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net, period=2, staleness=3),
        "more than period",
        what="staleness > period",
    )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net, period=2, staleness=-1),
        "staleness",
        what="staleness=-1",
    )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(
            sgd(),
            net,
            period=2,
            staleness=1,
            outer_optimizer=torch.optim.SGD(net.parameters(), lr=1),
        ),
        "outer optimizer is not supported",
        what="staleness with an outer optimizer",
    )


def check_edges():
    """A rank outside the process set steps alone; a parameter group added later (with the outer
    optimizer's first); synchronize() on local steps reduces nothing; numpy integers."""
    import numpy as np

    n = hvd.size()
    inside = list(range(n - 1))  # the last rank is outside
    ps = hvd.add_process_set(inside)
    net = model()
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), net, period=np.int64(2), process_set=ps
    )
    train(net, opt, 4)
    opt.average()
    copies = hvd.allgather_object(state(net))
    check(
        all(torch.equal(copies[0], copies[r]) for r in inside),
        "the set's ranks agree after its rounds",
    )
    if n > 1:
        check(not torch.equal(copies[0], copies[-1]), "the rank outside the set trained alone")
    hvd.remove_process_set(ps)

    # add_param_group: the outer optimizer's first, else an error
    net, extra = model(), nn.Linear(2, 2)
    both = nn.ModuleDict({"net": net, "extra": extra})  # named: the group added later too
    outer = torch.optim.SGD(net.parameters(), lr=1.0)
    opt = hvd.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), both, period=2, outer_optimizer=outer
    )
    train(net, opt, 2)
    expect_error(
        hvd.InvalidArgumentError,
        lambda: opt.add_param_group({"params": list(extra.parameters())}),
        "add them to it first",
        what="a group the outer optimizer lacks",
    )
    outer.add_param_group({"params": list(extra.parameters())})
    opt.add_param_group({"params": list(extra.parameters())})
    for step in range(2, 4):
        x, y = batch(step)
        opt.zero_grad()
        (nn.functional.cross_entropy(net(x), y) + extra(x[:, :2]).sum()).backward()
        opt.step()
    check(
        same_everywhere(torch.cat([p.detach().reshape(-1) for p in extra.parameters()])),
        "an added group is averaged with the rest",
    )

    # synchronize() on a local step: nothing reduced
    net = model()
    opt = hvd.LocalSGDOptimizer(torch.optim.SGD(net.parameters(), lr=0.05), net, period=4)
    x, y = batch(0)
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    sent = hvd.stats()["collectives"].get("allreduce", {}).get("calls", 0)
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    calls = hvd.stats()["collectives"].get("allreduce", {}).get("calls", 0) - sent
    check(calls == 0, f"synchronize() on a local step reduced nothing ({calls} allreduces)")
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.LocalSGDOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), net, period=1, staleness=1
        ),
        "period=1",
        what="staleness with period 1",
    )


def check_bad_arguments():
    net = model()
    sgd = lambda: torch.optim.SGD(net.parameters(), lr=0.1)  # noqa: E731
    err = hvd.InvalidArgumentError
    for bad in (0, -1, 1.5, True, None):
        expect_error(
            err,
            lambda: hvd.LocalSGDOptimizer(sgd(), net, period=bad),
            "period",
            what=f"period={bad!r}",
        )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net, period=2, warmup_steps=-1),
        "warmup_steps",
        what="warmup_steps=-1",
    )
    other = nn.Linear(2, 2)
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(
            sgd(), net, period=2, outer_optimizer=torch.optim.SGD(other.parameters(), lr=1.0)
        ),
        "same parameters",
        what="an outer optimizer over other parameters",
    )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net.named_parameters(), period=2),
        "pass the model itself",
        what="buffers to average but no model",
    )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(
            hvd.DistributedOptimizer(sgd(), named_parameters=net.named_parameters()), net, period=2
        ),
        "already a DistributedOptimizer",
        what="wrapping a DistributedOptimizer",
    )
    expect_error(
        err,
        lambda: hvd.DistributedOptimizer(
            hvd.LocalSGDOptimizer(sgd(), net, period=2), named_parameters=net.named_parameters()
        ),
        "already a LocalSGDOptimizer",
        what="wrapping a LocalSGDOptimizer",
    )
    # One machine: no hierarchical allreduce, so hierarchical=True cannot be had.
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net, period=2, hierarchical=True),
        "hierarchical=True needs",
        what="hierarchical=True on one machine",
    )
    expect_error(
        err,
        lambda: hvd.LocalSGDOptimizer(sgd(), net, period=2, hierarchical=1),
        "hierarchical must be",
        what="hierarchical=1",
    )


def check_elastic_state():
    """TorchState commits LocalSGDOptimizer's state with the model's: restore() goes back to
    the commit (the step count, a round in flight) and the run goes on as the one that was not
    interrupted; a commit's bytes resume a new model and optimizer the same way; sync() gives
    every rank rank 0's model and schedule."""
    from scaleout.torch.elastic import TorchState

    def make():
        net = model()
        return net, hvd.LocalSGDOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), net, period=3, staleness=2
        )

    net, opt = make()
    elastic = TorchState(net, opt)
    train(net, opt, 7)  # the round started after step 6 is in flight
    elastic.commit()
    payload = bytearray(b"".join(bytes(piece) for piece in elastic.serialized()))
    train(net, opt, 5, first=7)
    want = state(net)
    elastic.restore()
    check(opt._so_local.step == 7, f"restore(): the step count of the commit: {opt._so_local.step}")
    train(net, opt, 5, first=7)
    check(torch.equal(state(net), want), "restore(): the run goes on as the one that went on")

    net, opt = make()
    TorchState(net, opt).load_serialized(payload)
    train(net, opt, 5, first=7)
    check(torch.equal(state(net), want), "a commit's bytes: the same model in a new optimizer")

    train(net, opt, 1, first=12)  # the ranks apart (a local step)
    elastic = TorchState(net, opt)
    elastic.sync()
    check(same_everywhere(state(net)), "sync(): rank 0's model everywhere")
    steps = hvd.allgather_object(opt._so_local.step)
    check(steps == [13] * hvd.size(), f"sync(): rank 0's step count everywhere: {steps}")


def scaled_run(net, opt, steps, scaler=None, overflow=None, plain_local_steps=False):
    """`steps` steps as a GradScaler user writes them (Horovod's pattern: synchronize(),
    unscale_(), step() inside skip_synchronize(); a plain scaler.step() on local steps with
    `plain_local_steps`); at step `overflow`, the last rank's loss is made inf: (whether its
    step changed its model, the step counts after each step, whether the parameters were equal
    after each step)."""
    changed, counts, same = None, [], []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        if step == overflow and hvd.rank() == hvd.size() - 1:
            loss = loss * float("inf")
        before = state(net)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            if not (plain_local_steps and not opt._so_local.bulk()):
                opt.synchronize()
                scaler.unscale_(opt)
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
        if step == overflow:
            changed = not torch.equal(before, state(net))
        counts.append(opt._so_local.step)
        # the parameters (warm-up steps leave BatchNorm's statistics each rank's own)
        same.append(same_everywhere(torch.cat([p.detach().reshape(-1) for p in net.parameters()])))
    return changed, counts, same


def check_grad_scaler():
    """Note [Local SGD and GradScaler]: a local step GradScaler skips on one rank alone (its
    loss inf) is still counted, so every rank averages at the same steps; without an overflow
    the scaled run equals the unscaled one bit for bit (warm-up steps in Horovod's pattern)."""

    def make():
        net = model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        return net, hvd.LocalSGDOptimizer(sgd, net, period=3, warmup_steps=2)

    net, opt = make()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    changed, counts, same = scaled_run(net, opt, 8, scaler, overflow=3)
    check(counts == list(range(1, 9)), f"every step counted, the skipped one too: {counts}")
    skipped_here = hvd.rank() == hvd.size() - 1
    check(changed == (not skipped_here), f"the overflowing rank alone skipped: changed={changed}")
    want = [True, True, False, False, True, False, False, True]
    if hvd.size() > 1:
        check(same == want, f"equal at the warm-up and the rounds only: {same}")

    net, opt = make()
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch(0)
    scaler.scale(nn.functional.cross_entropy(net(x), y)).backward()
    expect_error(
        hvd.ScaleoutError,
        lambda: scaler.step(opt),
        "call optimizer.synchronize() and scaler.unscale_(optimizer)",
        what="a warm-up step under GradScaler without Horovod's pattern",
    )
    opt.synchronize()

    a, opt_a = make()
    b, opt_b = make()
    scaled_run(a, opt_a, 8, torch.amp.GradScaler("cpu", init_scale=2.0**10), None, True)
    scaled_run(b, opt_b, 8)
    check(torch.equal(state(a), state(b)), "GradScaler without an overflow: the unscaled run")


def run():
    check_bulk_steps()
    check_rounds()
    check_outer()
    check_anchor_after_average_in_warm_up()
    check_resume()
    check_staleness()
    check_elastic_state()
    check_grad_scaler()
    check_edges()
    check_bad_arguments()


if __name__ == "__main__":
    main(run)
