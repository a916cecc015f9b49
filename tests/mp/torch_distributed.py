"""Run by tests/test_torch_distributed.py::test_collectives_and_ddp_through_the_backend and
tests/test_torch_distributed.py::test_a_size_or_rank_other_than_the_jobs_is_refused.

The "scaleout" torch.distributed backend (Note [torch.distributed backend]). argv[1] "run",
under scaleoutrun, init_process_group("scaleout") with no arguments: every collective of this
step against values every rank computes, for each op and dtype, reduce, gather, scatter and
PREMUL_SUM, blocking and async (wait() and get_future()), the object collectives, send/recv,
groups of some ranks (new_group: the collectives, send/recv, two groups at once, DDP over
one), what is not supported yet raising, torch's functional collectives and DTensor's
full_tensor() and redistribute(), DDP (SGD with momentum, then Adam; float64, three steps; its
fp16 hook, no_sync, find_unused_parameters and join), FSDP2 (fully_shard, SGD with momentum;
its full state dict too) and FSDP1 (flat and original parameters) equal to one process on the
global batch; names that come round (async work beyond them, the fast lane, a shape that
differs between ranks). argv[1] "bad-size" / "bad-rank":
init_process_group with a size or rank other than the job's must raise ValueError naming it
(under mpiexec, with the test's MASTER_ADDR and MASTER_PORT)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from _harness import check, check_close, expect_error, finish
from torch_common import model, train_beside_one_process

import scaleout.torch as hvd

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16]
OPS = {
    dist.ReduceOp.SUM: lambda vals: sum(vals),
    dist.ReduceOp.MIN: min,
    dist.ReduceOp.MAX: max,
    dist.ReduceOp.PRODUCT: lambda vals: torch.tensor(vals, dtype=torch.float64).prod().item(),
    dist.ReduceOp.AVG: lambda vals: sum(vals) / len(vals),
}


def collectives(r: int, n: int) -> None:
    values = [float(i + 2) for i in range(n)]  # rank i contributes i + 2
    for dtype in DTYPES:
        for op, reduce in OPS.items():
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            t = torch.full((7,), values[r], dtype=dtype)
            dist.all_reduce(t, op=op)
            check_close(t.double(), torch.full((7,), float(reduce(values))), f"{op} {dtype}", 1e-2)
        t = torch.full((3, 2), float(r), dtype=dtype)
        dist.broadcast(t, src=n - 1)
        check_close(t.double(), torch.full((3, 2), float(n - 1)), f"broadcast {dtype}")
        outs = [torch.empty(2, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, torch.full((2,), float(r), dtype=dtype))
        check_close(
            torch.stack(outs).double()[:, 0], torch.arange(n).double(), f"all_gather {dtype}"
        )
        out = torch.empty(2 * n, dtype=dtype)
        dist.all_gather_into_tensor(out, torch.full((2,), float(r), dtype=dtype))
        want = torch.arange(n).double().repeat_interleave(2)
        check_close(out.double(), want, f"all_gather_into_tensor {dtype}")
        mine = torch.empty(2, dtype=dtype)
        dist.reduce_scatter_tensor(mine, torch.arange(2 * n, dtype=dtype))
        want = torch.tensor([n * 2.0 * r, n * (2.0 * r + 1)])
        check_close(mine.double(), want, f"reduce_scatter_tensor {dtype}")
        # element j goes to rank j: rank i receives r * n + i from each rank r
        got = torch.empty(n, dtype=dtype)
        dist.all_to_all_single(got, torch.arange(r * n, r * n + n, dtype=dtype))
        want = torch.arange(n).double() * n + r
        check_close(got.double(), want, f"all_to_all_single {dtype}")
    # given splits: rank r sends j + 1 rows of value 10 * r + j to rank j
    send = torch.cat([torch.full((j + 1,), 10.0 * r + j) for j in range(n)])
    got = torch.empty(n * (r + 1))
    dist.all_to_all_single(got, send, [r + 1] * n, [j + 1 for j in range(n)])
    want = torch.cat([torch.full((r + 1,), 10.0 * i + r) for i in range(n)])
    check_close(got, want, "all_to_all_single with splits")
    # reduce_scatter_tensor of a 2-D input, MAX: rank r gets rows [2r, 2r + 2)
    rows = torch.arange(2 * n * 3, dtype=torch.float64).reshape(2 * n, 3) + r
    mine = torch.empty(2, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(mine, rows, op=dist.ReduceOp.MAX)
    check_close(mine, torch.arange(6 * r, 6 * r + 6).double().reshape(2, 3) + n - 1, "rs 2-D")
    # reduce: the sum on the root only; the others' tensors as they were
    for dtype in (torch.float32, torch.int64):
        t = torch.full((4,), float(r + 1), dtype=dtype)
        dist.reduce(t, dst=n - 1)
        want = n * (n + 1) / 2 if r == n - 1 else float(r + 1)
        check_close(t.double(), torch.full((4,), want), f"reduce {dtype} on rank {r}")
    # gather to rank 0, scatter from the last rank
    gathered = [torch.empty(2, 3) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2, 3), float(r)), gathered, dst=0)
    if r == 0:
        check_close(torch.stack(gathered)[:, 0, 0], torch.arange(n).double(), "gather")
    parts = [torch.full((2, 2), 10.0 + i) for i in range(n)] if r == n - 1 else None
    got = torch.empty(2, 2)
    dist.scatter(got, parts, src=n - 1)
    check_close(got, torch.full((2, 2), 10.0 + r), "scatter")
    # PREMUL_SUM: each rank's input times the factor, summed (a Python number or a tensor)
    for factor in (0.5, torch.tensor([0.25])):
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        scale = float(factor) if not isinstance(factor, torch.Tensor) else factor.item()
        check_close(t, torch.full((3,), scale * n * (n + 1) / 2), f"PREMUL_SUM {factor}")
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, torch.ones(2 * n), op=dist._make_nccl_premul_sum(2.0))
    check_close(mine, torch.full((2,), 2.0 * n), "reduce_scatter_tensor PREMUL_SUM")
    # a world-sized group of the backend beside the default one
    group = dist.new_group(backend="scaleout")
    t = torch.ones(3)
    dist.all_reduce(t, group=group)
    check_close(t, torch.full((3,), float(n)), "all_reduce on new_group(backend='scaleout')")
    # async: wait(), and a future's callback as DDP's comm hooks use it
    t = torch.full((4,), 1.0)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check_close(t, torch.full((4,), float(n)), "async all_reduce wait()")
    t = torch.full((4,), 1.0)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    check_close(fut.wait(), torch.full((4,), 10.0 * n), "get_future().then()")

    # A callback that starts and waits for another collective, as PowerSGD's hook does.
    def inner(_):
        u = torch.ones(2)
        dist.all_reduce(u, async_op=True).get_future().wait()
        return u

    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(inner)
    check_close(fut.wait(), torch.full((2,), float(n)), "a collective waited for in a callback")
    dist.barrier()
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": r})
    check(objects == [{"rank": i} for i in range(n)], f"all_gather_object: {objects}")
    box = [f"from {n - 1}" if r == n - 1 else None]
    dist.broadcast_object_list(box, src=n - 1)
    check(box == [f"from {n - 1}"], f"broadcast_object_list: {box}")
    point_to_point(r, n)
    # A tensor not on the CPU (no GPU here: the meta device stands in) is refused by name.
    expect_error(
        ValueError,
        lambda: dist.all_reduce(torch.empty(2, device="meta")),
        "the scaleout backend takes CPU tensors; got one on meta",
    )
    expect_error(
        NotImplementedError,
        lambda: dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND),
        "all_reduce with ReduceOp.BAND",
        "not supported",
    )


def names_that_come_round(r: int, n: int) -> None:
    """Names by signature (Note [torch.distributed backend]): more async all_reduces of one shape
    in flight than the names a signature takes in turn, each its own; back-to-back synchronous
    4 KiB all_reduces reach the core's fast lane (their names come round, so the response cache
    has them); a shape that differs between ranks raises on every rank, naming both, and later
    calls of both shapes pair up as before; issuing a busy name's call does not block (no
    deadlock where groups are called in different orders on different ranks)."""
    from scaleout.torch._process_group import _WINDOW

    tensors = [torch.full((5,), float(r + i)) for i in range(3 * _WINDOW + 1)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for i, work in reversed(list(enumerate(works))):
        if i % 2:
            work.wait()
        else:
            work.get_future().wait()
    for i, t in enumerate(tensors):
        want = float(sum(k + i for k in range(n)))
        check_close(t, torch.full((5,), want), f"async all_reduce {i} of one shape")
    lane = hvd.stats()["collectives"]["allreduce"]["lane_calls"]
    t = torch.empty(1024)
    for i in range(200):
        t.fill_(r + i)
        dist.all_reduce(t)
        if t[0] != sum(k + i for k in range(n)):
            check(False, f"back-to-back all_reduce {i}: {t[:3]}")
            break
    lane = hvd.stats()["collectives"]["allreduce"]["lane_calls"] - lane
    check(lane > 0, "back-to-back synchronous 4 KiB all_reduces took the fast lane")
    expect_error(
        dist.DistBackendError,
        lambda: dist.all_reduce(torch.ones(4 + r)),
        "deadlock",
        f"float32.{4 + r}.Sum",
        what="a shape that differs between ranks",
    )
    # The failed call gave its turn back on every rank: the same shapes pair up again, sync and
    # async alike.
    for shape in (4, 5):
        t = torch.full((shape,), float(r + 1))
        dist.all_reduce(t)
        check_close(t, torch.full((shape,), n * (n + 1) / 2), f"shape {shape} after the mismatch")
    tensors = [torch.full((4,), 10.0**i * (r + 1)) for i in range(3)]
    for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
        work.wait()
    for i, t in enumerate(tensors):
        want = torch.full((4,), 10.0**i * n * (n + 1) / 2)
        check_close(t, want, f"async call {i} of a shape after the mismatch")
    # A name still in flight never blocks the call that reuses it: rank 0 issues more async
    # all_reduces of one shape than their names, then a synchronous one on another group; the
    # others the other way round (each group sees one order everywhere).
    other = dist.new_group(backend="scaleout")
    tensors = [torch.full((3,), float(r + i)) for i in range(2 * _WINDOW + 1)]
    b = torch.full((2,), float(r))
    if r == 0:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        dist.all_reduce(b, group=other)
    else:
        dist.all_reduce(b, group=other)
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in works:
        work.wait()
    check_close(b, torch.full((2,), n * (n - 1) / 2), "the other group's all_reduce")
    for i, t in enumerate(tensors):
        want = float(sum(k + i for k in range(n)))
        check_close(t, torch.full((3,), want), f"async {i} issued around the other group's")


def point_to_point(r: int, n: int) -> None:
    """send/recv (straight over MPI): a ring of isend/irecv, batch_isend_irecv, every dtype,
    tags received out of order, a non-contiguous receiver; recv from any source refused."""
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(4)
    works = [dist.isend(torch.full((4,), float(r)), right), dist.irecv(got, left)]
    for work in works:
        work.wait()
    check_close(got, torch.full((4,), float(left)), "isend/irecv around the ring")
    got = torch.empty(3, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.irecv, got, left, tag=5),
        dist.P2POp(dist.isend, torch.full((3,), 10 * r), right, tag=5),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    check(got.tolist() == [10 * left] * 3, f"batch_isend_irecv: {got.tolist()}")
    if r == 0:
        for dtype in DTYPES + [torch.bool, torch.uint8, torch.complex64]:
            dist.send(torch.arange(6).reshape(2, 3).to(dtype), 1)
        dist.send(torch.full((2,), 1.0), 1, tag=1)
        dist.send(torch.full((2,), 2.0), 1, tag=2)
        dist.send(torch.arange(6.0), 1)
    elif r == 1:
        for dtype in DTYPES + [torch.bool, torch.uint8, torch.complex64]:
            t = torch.empty(2, 3, dtype=dtype)
            dist.recv(t, 0)
            want = torch.arange(6).reshape(2, 3).to(dtype)
            check(torch.equal(t, want), f"send/recv {dtype}: {t}")
        second, first = torch.empty(2), torch.empty(2)
        dist.recv(second, 0, tag=2)  # received before the one sent first: tags tell them apart
        dist.recv(first, 0, tag=1)
        check((first[0].item(), second[0].item()) == (1.0, 2.0), f"tags: {first}, {second}")
        wide = torch.zeros(3, 4)
        dist.recv(wide[:, ::2], 0)  # a view with strides: received, then copied in
        check(wide[:, ::2].flatten().tolist() == list(range(6)), f"into a view: {wide}")
        check(wide[:, 1::2].abs().sum().item() == 0, "the view's neighbours untouched")
    expect_error(NotImplementedError, lambda: dist.recv(torch.empty(1)), "recv from any source")


def groups(r: int, n: int) -> None:
    """new_group of some ranks: each group is a process set its members make (the others only
    call new_group, as torch requires); its collectives take group ranks and global sources."""
    low = list(range(n - 1))  # every rank but the last
    high = list(range(1, n))  # every rank but the first
    ends = [0, n - 1]
    made = {tuple(ranks): dist.new_group(ranks) for ranks in (low, high, ends)}
    # made only by its members (torch calls the backend on them alone in either case)
    if r in high:
        made["local"] = dist.new_group(high, use_local_synchronization=True)
    for key, group in made.items():
        ranks = high if key == "local" else list(key)
        if r not in ranks:
            check(group == dist.GroupMember.NON_GROUP_MEMBER, f"{key}: not a member here")
            continue
        m, mine = len(ranks), ranks.index(r)
        check(dist.get_rank(group) == mine and dist.get_world_size(group) == m, f"{key}: rank")
        t = torch.full((5,), float(r + 1))
        dist.all_reduce(t, group=group)
        check_close(t, torch.full((5,), float(sum(q + 1 for q in ranks))), f"{key}: all_reduce")
        t = torch.full((5,), float(r + 1))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True).wait()
        check_close(t, torch.full((5,), float(ranks[-1] + 1)), f"{key}: async all_reduce MAX")
        t = torch.full((2, 3), float(r))
        dist.broadcast(t, src=ranks[-1], group=group)  # a global rank, as torch takes it
        check_close(t, torch.full((2, 3), float(ranks[-1])), f"{key}: broadcast")
        out = torch.empty(2 * m)
        dist.all_gather_into_tensor(out, torch.full((2,), float(r)), group=group)
        want = torch.tensor(ranks, dtype=torch.float32).repeat_interleave(2)
        check_close(out, want, f"{key}: all_gather_into_tensor")
        got = torch.empty(2)
        dist.reduce_scatter_tensor(got, torch.arange(2.0 * m), group=group)
        check_close(got, torch.tensor([2.0 * mine, 2.0 * mine + 1]) * m, f"{key}: reduce_scatter")
        got = torch.empty(m)
        dist.all_to_all_single(got, torch.arange(m, dtype=torch.float32) + 10 * r, group=group)
        want = torch.tensor([10.0 * q + mine for q in ranks])
        check_close(got, want, f"{key}: all_to_all_single")
        dist.barrier(group=group)
        if m > 1:  # send/recv in the group: peers by their global ranks, as torch takes them
            if mine == 0:
                dist.send(torch.full((2,), float(r)), ranks[1], group=group)
            elif mine == 1:
                got = torch.empty(2)
                dist.recv(got, ranks[0], group=group)
                check_close(got, torch.full((2,), float(ranks[0])), f"{key}: send/recv")
        objects = [None] * m
        dist.all_gather_object(objects, r, group=group)
        check(objects == ranks, f"{key}: all_gather_object {objects}")
    # Collectives of two groups that share a rank, in flight at once.
    if n >= 3 and r in low and r in high:
        a, b = torch.ones(3), torch.ones(3)
        works = [
            dist.all_reduce(a, group=made[tuple(low)], async_op=True),
            dist.all_reduce(b, group=made[tuple(high)], async_op=True),
        ]
        for work in works:
            work.wait()
        check_close(a + b, torch.full((3,), 2.0 * (n - 1)), "two groups' work at once")
    elif n >= 3 and r in low:
        dist.all_reduce(torch.ones(3), group=made[tuple(low)])
    elif n >= 3:
        dist.all_reduce(torch.ones(3), group=made[tuple(high)])
    # DDP over a group of every rank but the first: its ranks train as one process does on
    # their global batch.
    if r in high:
        ours, ref = model(), model()
        ddp = nn.parallel.DistributedDataParallel(ours, process_group=made[tuple(high)])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        train_beside_one_process(r - 1, n - 1, ddp, opt, ref, ref_opt, seed=3)
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            check_close(p.detach(), q.detach(), f"DDP over a group: {name}", 1e-10, 1e-10)


def ddp_equals_one_process(r: int, n: int) -> None:
    for make_opt in (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=0.01),
    ):
        ours, ref = model(), model()
        ddp = nn.parallel.DistributedDataParallel(ours)
        opt, ref_opt = make_opt(ddp.parameters()), make_opt(ref.parameters())
        train_beside_one_process(r, n, ddp, opt, ref, ref_opt, seed=1)
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            check_close(p.detach(), q.detach(), f"DDP {type(opt).__name__} {name}", 1e-10, 1e-10)


def ddp_hooks_no_sync_unused_and_join(r: int, n: int) -> None:
    """DDP's fp16 compression hook (three SGD steps close to one process), no_sync
    (gradients of two micro-batches, the first kept local, equal one process on both global
    micro-batches), find_unused_parameters (a layer the forward skips stays as it was), and
    join (rank r trains 2 + r steps; every rank ends with the same parameters, no hang)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # (torch's DDP refuses bf16_compress_hook without NCCL or XCCL, whatever the backend.)
    for hook, tol in ((default_hooks.fp16_compress_hook, 1e-3),):
        ours, ref = model(torch.float32), model(torch.float32)
        ddp = nn.parallel.DistributedDataParallel(ours)
        ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        train_beside_one_process(r, n, ddp, opt, ref, ref_opt, seed=3, dtype=torch.float32)
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            check_close(p.detach(), q.detach(), f"DDP {hook.__name__} {name}", tol, tol)

    ours, ref = model(), model()
    ddp = nn.parallel.DistributedDataParallel(ours)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(4 * n, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    ys = [torch.randn(4 * n, 2, generator=g, dtype=torch.float64) for _ in range(2)]
    opt.zero_grad()
    with ddp.no_sync():
        ((ddp(xs[0][4 * r : 4 * r + 4]) - ys[0][4 * r : 4 * r + 4]) ** 2).mean().backward()
    ((ddp(xs[1][4 * r : 4 * r + 4]) - ys[1][4 * r : 4 * r + 4]) ** 2).mean().backward()
    opt.step()
    ref_opt.zero_grad()
    for x, y in zip(xs, ys):
        ((ref(x) - y) ** 2).mean().backward()
    ref_opt.step()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        check_close(p.detach(), q.detach(), f"DDP no_sync {name}", 1e-10, 1e-10)

    class Skips(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = model(), nn.Linear(8, 2).double()

        def forward(self, x):
            return self.used(x)

    ours = Skips()
    before = ours.unused.weight.detach().clone()
    ref = model()
    ddp = nn.parallel.DistributedDataParallel(ours, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    train_beside_one_process(r, n, ddp, opt, ref, ref_opt, seed=5)
    for (name, p), q in zip(ours.used.named_parameters(), ref.parameters()):
        check_close(p.detach(), q.detach(), f"DDP find_unused_parameters {name}", 1e-10, 1e-10)
    check(torch.equal(ours.unused.weight.detach(), before), "the unused layer stayed as it was")

    ours = model()
    ddp = nn.parallel.DistributedDataParallel(ours)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(6 + r)
    with ddp.join():
        for _ in range(2 + r):
            opt.zero_grad()
            ddp(torch.randn(4, 8, generator=g, dtype=torch.float64)).pow(2).mean().backward()
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    check(all(torch.equal(e, flat) for e in everyone), "DDP join: every rank's parameters equal")


def functional_collectives(r: int, n: int) -> None:
    """torch's functional collectives (what DTensor runs) through the backend, and a sharded
    DTensor made whole again (full_tensor) and replicated (redistribute)."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    world = dist.group.WORLD
    whole = n * (n + 1) / 2
    got = fc.all_reduce(torch.full((3,), float(r + 1)), "sum", world)
    check_close(got.double(), torch.full((3,), whole), "functional all_reduce")
    got = fc.all_gather_tensor(torch.full((2,), float(r)), 0, world)
    check_close(
        got.double(), torch.arange(n).double().repeat_interleave(2), "functional all_gather"
    )
    got = fc.reduce_scatter_tensor(torch.arange(2.0 * n) * (r + 1), "sum", 0, world)
    check_close(
        got.double(), torch.tensor([2.0 * r, 2.0 * r + 1]) * whole, "functional reduce_scatter"
    )
    a, b = fc.all_reduce_coalesced([torch.ones(2), torch.full((3,), float(r))], "sum", world)
    check_close(a.double(), torch.full((2,), float(n)), "functional all_reduce_coalesced [0]")
    check_close(
        b.double(), torch.full((3,), n * (n - 1) / 2), "functional all_reduce_coalesced [1]"
    )
    (got,) = fc.all_gather_into_tensor_coalesced([torch.full((2,), float(r))], world)
    want = torch.arange(n).double().repeat_interleave(2)
    check_close(got.double(), want, "functional all_gather_into_tensor_coalesced")
    got = fc.all_to_all_single(torch.arange(float(n)) + 10 * r, None, None, world)
    check_close(got.double(), torch.arange(n).double() * 10 + r, "functional all_to_all_single")
    got = fc.broadcast(torch.full((2,), float(r)), n - 1, world)
    check_close(got.double(), torch.full((2,), float(n - 1)), "functional broadcast")
    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(6.0 * n).reshape(3 * n, 2)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    check(torch.equal(sharded.to_local(), full[3 * r : 3 * r + 3]), "DTensor shard")
    check(torch.equal(sharded.full_tensor(), full), "DTensor full_tensor()")
    replicated = sharded.redistribute(mesh, [Replicate()]).to_local()
    check(torch.equal(replicated, full), "DTensor redistribute to Replicate")


def fsdp2_equals_one_process(r: int, n: int) -> None:
    """fully_shard (FSDP2) over the backend: each rank's shard after three SGD steps is the
    one-process model's rows of it (FSDP2 shards dim 0 in ceil(rows / n) blocks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # A CPU mesh: fully_shard's default is the accelerator's, where the machine has one.
    mesh = init_device_mesh("cpu", (n,))
    ours, ref = model(), model()
    for layer in ours:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(ours, mesh=mesh)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    train_beside_one_process(r, n, ours, opt, ref, ref_opt, seed=2)
    shards = ours.state_dict()
    for name, whole in ref.state_dict().items():
        rows = -(-whole.shape[0] // n)
        want = whole[r * rows : (r + 1) * rows]
        got = shards[name].to_local()[: want.shape[0]]
        check_close(got.detach(), want.detach(), f"FSDP2 {name}", 1e-10, 1e-10)
        # The full state dict of the sharded model (functional all-gathers).
        check_close(shards[name].full_tensor().detach(), whole, f"FSDP2 full {name}", 1e-10, 1e-10)


def fsdp1_equals_one_process(r: int, n: int) -> None:
    """FullyShardedDataParallel (FSDP1) on CPU over the backend, with its flat parameters and with
    the original ones: after three SGD steps the whole model (summon_full_params) is the
    one-process model."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for use_orig_params in (False, True):
        ref = model()
        ours = FSDP(model(), device_id=torch.device("cpu"), use_orig_params=use_orig_params)
        opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        train_beside_one_process(r, n, ours, opt, ref, ref_opt, seed=3)
        with FSDP.summon_full_params(ours):
            whole = dict(ours.named_parameters())
            check(sorted(whole) == sorted(dict(ref.named_parameters())), f"FSDP1 {sorted(whole)}")
            for name, want in ref.named_parameters():
                if name in whole:
                    what = f"FSDP1 {name} (use_orig_params={use_orig_params})"
                    # A copy: numpy's view of a tensor makes its storage one that FSDP cannot
                    # free when the context ends.
                    got = whole[name].detach().clone()
                    check_close(got, want.detach(), what, 1e-10, 1e-10)


def main() -> None:
    mode = sys.argv[1]
    if mode == "run":
        # Under scaleoutrun, which gives torch's variables; the backend starts scaleout itself.
        dist.init_process_group("scaleout")
        check(hvd.is_initialized(), "init_process_group started scaleout")
        r, n = hvd.rank(), hvd.size()
        check(dist.get_backend() == "scaleout", f"backend {dist.get_backend()}")
        check((dist.get_rank(), dist.get_world_size()) == (r, n), "rank and size are the job's")
        check(
            (os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE"))
            == (str(hvd.local_rank()), str(hvd.local_size())),
            "LOCAL_RANK and LOCAL_WORLD_SIZE are the job's",
        )
        collectives(r, n)
        names_that_come_round(r, n)
        groups(r, n)
        functional_collectives(r, n)
        ddp_equals_one_process(r, n)
        ddp_hooks_no_sync_unused_and_join(r, n)
        fsdp2_equals_one_process(r, n)
        fsdp1_equals_one_process(r, n)
        dist.destroy_process_group()
        finish()
        return
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if mode == "bad-size":
        # Given a store of its own: torch's env:// store would wait for n + 1 ranks itself.
        for size in (n + 1, n - 1):
            expect_error(
                ValueError,
                lambda size=size: dist.init_process_group(
                    "scaleout", rank=min(r, size - 1), world_size=size, store=dist.HashStore()
                ),
                f"world_size={size}, but the job that scaleout runs in has {n} ranks",
            )
    else:
        expect_error(
            ValueError,
            lambda: dist.init_process_group("scaleout", rank=(r + 1) % n, world_size=n),
            f"rank={(r + 1) % n}, but this process is rank {r} of the job",
        )
    finish()


if __name__ == "__main__":
    main()
