"""Run by tests/test_process_sets.py::test_torch_on_process_sets.

Process sets through scaleout.torch, at 3 or 4 ranks: every collective and its gradient on a
set, DistributedOptimizer and the broadcast helpers on two disjoint sets training at once, and
on a rank outside its set.

Sets: A the even ranks, B the odd ones (disjoint; at 3 ranks B has one rank), C = [0, 1]
(overlapping both)."""

import copy

import torch
from _harness import check, check_close, expect_error, main
from mpi4py import MPI

import scaleout.torch as hvd


def collectives(mine):
    r, k, me = hvd.rank(), mine.size(), mine.rank()
    ranks = mine.ranks
    total = float(sum(q + 1 for q in ranks))
    x = torch.tensor([float(r + 1)])
    check_close(hvd.allreduce(x, op=hvd.Sum, process_set=mine), [total], "allreduce")
    check_close(hvd.allreduce(x, process_set=mine), [total / k], "allreduce Average: set size")
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Sum, process_set=mine)
    check_close(y, [total], "allreduce_")
    h = hvd.allreduce_async(x, op=hvd.Sum, name="async", process_set=mine)
    check_close(hvd.synchronize(h), [total], "allreduce_async")
    a, b = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=mine)
    check_close(torch.cat([a, b]), [total, 2 * total], "grouped_allreduce")

    rows = torch.full((r + 1, 2), float(r))
    want = torch.cat([torch.full((q + 1, 2), float(q)) for q in ranks])
    check_close(hvd.allgather(rows, process_set=mine), want, "allgather in the set's order")
    g1, g2 = hvd.grouped_allgather([rows, rows + 1], process_set=mine)
    check_close(torch.cat([g1, g2]), torch.cat([want, want + 1]), "grouped_allgather")

    root = ranks[-1]
    check_close(
        hvd.broadcast(torch.tensor([r * 10.0]), root, process_set=mine),
        [root * 10.0],
        "broadcast from a job rank",
    )
    z = torch.tensor([r * 1.0])
    hvd.broadcast_(z, root, process_set=mine)
    check_close(z, [root * 1.0], "broadcast_")

    # alltoall: j + 1 rows to the set's j-th rank, each row holding (sender, receiver index).
    splits = torch.tensor([j + 1 for j in range(k)])
    send = torch.cat([torch.tensor([[float(r), float(j)]] * (j + 1)) for j in range(k)])
    out, received = hvd.alltoall(send, splits=splits, process_set=mine)
    check(received.tolist() == [me + 1] * k, f"alltoall received splits {received.tolist()}")
    want = torch.cat([torch.tensor([[float(q), float(me)]] * (me + 1)) for q in ranks])
    check_close(out, want, "alltoall rows")

    parts = hvd.reducescatter(torch.ones(k, 2) * (r + 1), op=hvd.Sum, process_set=mine)
    check_close(parts, torch.full((1, 2), total), "reducescatter")
    p1, p2 = hvd.grouped_reducescatter(
        [torch.ones(k) * (r + 1), torch.ones(k)], op=hvd.Sum, process_set=mine
    )
    check_close(torch.cat([p1, p2]), [total, float(k)], "grouped_reducescatter")

    sparse = torch.sparse_coo_tensor([[r]], [1.0], (8,), check_invariants=True)
    dense = hvd.sparse_allreduce_async(sparse, "sparse", hvd.Average, process_set=mine)()
    want = torch.zeros(8)
    want[ranks] = 1.0 / k
    check_close(dense.to_dense(), want, "sparse_allreduce_async: Average over the set")
    hvd.barrier(process_set=mine)

    # join inside the set: the first member runs out of data, the others go on without it.
    if me == 0:
        last = hvd.join(process_set=mine)
    else:
        got = hvd.allreduce(
            torch.tensor([float(r + 1)]), op=hvd.Sum, name="after_join", process_set=mine
        )
        check_close(got, [total - (ranks[0] + 1)], "a joined member contributes zeros")
        last = hvd.join(process_set=mine)
    check(last in (ranks[1:] or ranks), f"join returns the job's rank that joined last: {last}")


def gradients(mine):
    r, k, me = hvd.rank(), mine.size(), mine.rank()
    ranks = mine.ranks

    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, process_set=mine).sum().backward()
    check_close(x.grad, [k] * 3, "allreduce Sum gradient: the set's size")

    # allgather: this rank's rows of the averaged output gradient, at its offset in the set.
    x = torch.ones(r + 1, 2, requires_grad=True)
    out = hvd.allgather(x, process_set=mine)
    w = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape)
    (out * w).sum().backward()
    offset = sum(q + 1 for q in ranks[:me])
    check_close(x.grad, w[offset : offset + r + 1], "allgather gradient at the set's offset")

    x = torch.ones(k, 2, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum, process_set=mine).sum().backward()
    check_close(x.grad, torch.full((k, 2), float(k)), "reducescatter Sum gradient")

    x = torch.ones(2, requires_grad=True)
    (hvd.broadcast(x, ranks[0], process_set=mine) * (r + 1)).sum().backward()
    mean = sum(q + 1 for q in ranks) / k
    check_close(x.grad, [mean if r == ranks[0] else 0.0] * 2, "broadcast gradient")

    x = torch.arange(k, dtype=torch.float32).reshape(k, 1).requires_grad_()
    out, _ = hvd.alltoall(x, splits=[1] * k, process_set=mine)
    (out * (r + 1)).sum().backward()
    check_close(x.grad, [[q + 1.0] for q in ranks], "alltoall gradient goes back the same way")


def data(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 1, generator=g)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def train_on_set(mine, steps=4):
    """Each set trains its own model (the two disjoint sets at once): the same parameters on
    every rank of the set, equal to one process averaging the set's ranks' losses."""
    r = hvd.rank()
    model = make_model(seed=r)  # differs by rank until the set's broadcast
    reference = make_model(seed=mine.ranks[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), process_set=mine)
    hvd.broadcast_parameters(model.state_dict(), root_rank=mine.ranks[0], process_set=mine)
    hvd.broadcast_optimizer_state(opt, root_rank=mine.ranks[0], process_set=mine)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        x, y = data(r, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(
            torch.nn.functional.mse_loss(reference(*data(q, step)[:1]), data(q, step)[1])
            for q in mine.ranks
        ) / len(mine.ranks)
        loss.backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        check_close(
            p.detach(), q.detach(), f"set {mine.ranks}: {name} after training", rtol=1e-5, atol=1e-6
        )


def outside_the_set(C):
    """Horovod's rule: on a rank outside the optimizer's set, step() uses the local gradients."""
    r = hvd.rank()
    model = make_model(seed=7)
    local = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        process_set=C,
    )
    local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
    x, y = data(r, 0)
    for m, o in ((model, opt), (local, local_opt)):
        o.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
    same = all(torch.equal(p, q) for p, q in zip(model.parameters(), local.parameters()))
    check(
        same == (not C.included()),
        f"rank {r} {'in' if C.included() else 'outside'} C: "
        f"local step {'expected' if not C.included() else 'not expected'}",
    )


def body():
    A, B, C = SETS
    r = hvd.rank()
    mine, other = (A, B) if r in A.ranks else (B, A)
    collectives(mine)
    gradients(mine)
    train_on_set(mine)
    outside_the_set(C)
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(torch.ones(1), process_set=other),
        f"rank {r} is not in process set {other.process_set_id}",
        what="not a member",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(make_model(0).parameters(), lr=0.1), process_set=hvd.ProcessSet([0])
        ),
        "is not registered",
        what="an unregistered set",
    )
    hvd.barrier()


if __name__ == "__main__":
    size = MPI.COMM_WORLD.size
    SETS = [
        hvd.ProcessSet(range(0, size, 2)),
        hvd.ProcessSet(range(1, size, 2)),
        hvd.ProcessSet([0, 1]),
    ]
    main(body, process_sets=SETS)
