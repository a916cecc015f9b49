"""Run by tests/test_torch.py::test_tensor_collectives_errors_and_gradients.

scaleout.torch collectives on real ranks: every op and form, dtypes, memory handling, errors,
and the gradients of the differentiable ops against their analytic values."""

import numpy as np
import torch
from _harness import check, check_close, expect_error, main

import scaleout.torch as hvd

torch.set_num_threads(1)

DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]


def f64(t):
    return t.detach().to(torch.float64).numpy()


def local(r, shape=(3, 4)):
    """Rank r's input: small integers, so sums and products are exact in every dtype."""
    g = torch.Generator().manual_seed(100 + r)
    return torch.randint(0, 3, shape, generator=g)


def weights(r, shape):
    return torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape) * 0.1 + r


def test_allreduce(r, n):
    inputs = [local(k) for k in range(n)]
    for dtype in DTYPES:
        op = hvd.Max if dtype == torch.bool else hvd.Sum
        got = hvd.allreduce(inputs[r].to(dtype), op=op, name=f"ar.{dtype}")
        want = torch.stack(inputs).to(torch.float64)
        want = want.amax(0) if op == hvd.Max else want.sum(0)
        check(got.dtype == dtype, f"allreduce keeps {dtype}")
        check_close(f64(got), want.to(dtype).to(torch.float64).numpy(), f"allreduce {dtype}")
    x = torch.full((5,), float(r + 1))
    stack = torch.stack([torch.full((5,), float(k + 1)) for k in range(n)])
    for op, want in [
        (hvd.Average, stack.mean(0)),
        (hvd.Min, stack.amin(0)),
        (hvd.Max, stack.amax(0)),
        (hvd.Product, stack.prod(0)),
    ]:
        check_close(hvd.allreduce(x, op=op, name=f"op.{op}").numpy(), want.numpy(), f"op {op}")
    check_close(hvd.allreduce(x).numpy(), stack.mean(0).numpy(), "default op is Average")
    check_close(
        hvd.allreduce(x, average=False, name="avgF").numpy(),
        stack.sum(0).numpy(),
        "average=False sums",
    )
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="scale")
    check_close(got.numpy(), stack.sum(0).numpy() * 0.5, "scale factors")
    check(
        hvd.allreduce(torch.tensor(float(r)), op=hvd.Max, name="0d").shape == (), "0-d keeps shape"
    )
    check(hvd.allreduce(torch.zeros(0, 3), name="empty").shape == (0, 3), "empty tensor")

    # In place on a contiguous tensor: the core writes into the tensor's own memory, so the
    # result is there as soon as the handle is done, before synchronize() copies anything.
    t = torch.full((1000,), float(r + 1))
    ptr, version = t.data_ptr(), t._version
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="zero_copy")
    while not hvd.poll(h):
        pass
    check(bool((t == n * (n + 1) / 2).all()), "in-place result lands in the tensor's memory")
    check(hvd.synchronize(h) is t and t.data_ptr() == ptr, "allreduce_ returns the same tensor")
    check(t._version > version, "in-place write bumps the autograd version counter")
    # Non-contiguous: reduced through a copy, written back, neighbours untouched.
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1)
    view = base[:, ::2]
    check(not view.is_contiguous(), "view is non-contiguous")
    out = hvd.allreduce_(view, op=hvd.Sum, name="noncontig")
    ref = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    check(out is view, "allreduce_ on a view returns the view")
    check_close(view.numpy(), ref[:, ::2].numpy() * n * (n + 1) / 2, "non-contiguous in place")
    check_close(base[:, 1::2].numpy(), ref[:, 1::2].numpy() * (r + 1), "neighbours untouched")
    fresh = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1)
    check_close(
        hvd.allreduce(fresh.t(), op=hvd.Sum, name="transposed").numpy(),
        ref.t().numpy() * n * (n + 1) / 2,
        "transposed input out of place",
    )
    # async out of place
    h = hvd.allreduce_async(x, name="async", op=hvd.Sum)
    check(isinstance(h, hvd.Handle), "allreduce_async returns a Handle")
    check_close(hvd.synchronize(h).numpy(), stack.sum(0).numpy(), "allreduce_async")
    check_close(x.numpy(), np.full(5, r + 1.0), "out-of-place leaves the input")

    # grouped, all four forms
    a, b = torch.full((3,), float(r)), torch.full((2, 2), 1.0)
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Sum, name="grp")
    check_close(ga.numpy(), np.full(3, n * (n - 1) / 2), "grouped_allreduce first")
    check_close(gb.numpy(), np.full((2, 2), float(n)), "grouped_allreduce second")
    outs = hvd.synchronize(hvd.grouped_allreduce_async([a, b], name="grp_async"))
    check_close(outs[0].numpy(), np.full(3, (n - 1) / 2), "grouped_allreduce_async averages")
    hvd.synchronize(hvd.grouped_allreduce_async_([a, b], op=hvd.Sum, name="grp_async_"))
    check_close(b.numpy(), np.full((2, 2), float(n)), "grouped_allreduce_async_ in place")
    hvd.grouped_allreduce_([a], op=hvd.Max, name="grp_")
    check_close(a.numpy(), np.full(3, n * (n - 1) / 2), "grouped_allreduce_ in place")


def test_compression(r, n):
    x = torch.full((6,), 0.1 * (r + 1))
    want = 0.1 * (n + 1) / 2
    for comp, tol in [
        (hvd.Compression.none, 1e-6),
        (hvd.Compression.fp16, 1e-3),
        (hvd.Compression.bf16, 1e-2),
    ]:
        got = hvd.allreduce(x, name=f"comp.{comp.__name__}", compression=comp)
        check(got.dtype == torch.float32, f"{comp.__name__}: result back in float32")
        check_close(got.numpy(), np.full(6, want), f"{comp.__name__} value", rtol=tol, atol=tol)
    wire, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.float64))
    check(wire.dtype == torch.float16 and ctx == torch.float64, "fp16 casts float64 for the wire")
    ints = torch.arange(4)
    check(hvd.Compression.bf16.compress(ints)[0] is ints, "integers pass compression untouched")
    got = hvd.allreduce(ints, op=hvd.Sum, compression=hvd.Compression.fp16, name="comp.int")
    check(got.dtype == torch.int64 and got.tolist() == [0, n, 2 * n, 3 * n], "int through fp16")


def test_gather_broadcast_alltoall_reducescatter(r, n):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        x = torch.full((r + 1, 3), r % 2 if dtype == torch.bool else r).to(dtype)
        got = hvd.allgather(x, name=f"ag.{dtype}")
        want = torch.cat(
            [torch.full((k + 1, 3), k % 2 if dtype == torch.bool else k) for k in range(n)]
        ).to(dtype)
        check(got.dtype == dtype and torch.equal(got, want), f"allgather {dtype}: {got.shape}")
    check(hvd.allgather(torch.tensor(r), name="ag0d").tolist() == list(range(n)), "0-d allgather")
    got = hvd.synchronize(hvd.allgather_async(torch.ones(2, 2).t(), name="ag_async"))
    check(got.shape == (2 * n, 2), "allgather_async of a transposed tensor")

    root = n - 1
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * r
    want = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * root
    check(torch.equal(hvd.broadcast(x, root, name="bc"), want), "broadcast")
    check(
        torch.equal(x, torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * r),
        "broadcast leaves the input",
    )
    check(
        torch.equal(hvd.synchronize(hvd.broadcast_async(x, root, name="bca")), want),
        "broadcast_async",
    )
    y = x.clone()
    check(hvd.broadcast_(y, root, name="bc_") is y and torch.equal(y, want), "broadcast_")
    z = x.clone().t()
    hvd.synchronize(hvd.broadcast_async_(z, root, name="bca_"))
    check(torch.equal(z, want.t()), "broadcast_async_ on a non-contiguous tensor")
    bf = torch.full((4,), float(r), dtype=torch.bfloat16)
    check(
        torch.equal(hvd.broadcast(bf, 0, name="bcbf"), torch.zeros(4, dtype=torch.bfloat16)),
        "bfloat16 broadcast",
    )

    # alltoall, equal parts: rank r sends rows [2j, 2j+1] to rank j
    x = (torch.arange(2 * n, dtype=torch.float32) + 100 * r).reshape(2 * n, 1).repeat(1, 2)
    got = hvd.alltoall(x, name="a2a")
    want = torch.cat(
        [
            (torch.tensor([2 * r, 2 * r + 1.0]) + 100 * j).reshape(2, 1).repeat(1, 2)
            for j in range(n)
        ]
    )
    check(torch.equal(got, want), f"alltoall equal splits: {got[:, 0].tolist()}")
    # with splits: j+1 rows to rank j, so rank r receives r+1 rows from everyone
    splits = [j + 1 for j in range(n)]
    rows = sum(splits)
    x = (torch.arange(rows, dtype=torch.int32) + 100 * r).reshape(rows, 1)
    got, received = hvd.alltoall(x, splits=torch.tensor(splits), name="a2a_splits")
    start = r * (r + 1) // 2
    want = torch.cat(
        [torch.arange(start, start + r + 1, dtype=torch.int32) + 100 * j for j in range(n)]
    ).reshape(-1, 1)
    check(torch.equal(got, want), f"alltoall with splits: {got[:, 0].tolist()}")
    check(received.tolist() == [r + 1] * n, f"received splits {received.tolist()}")
    got, received = hvd.synchronize(hvd.alltoall_async(x, splits=splits, name="a2a_async"))
    check(torch.equal(got, want), "alltoall_async with splits")

    # reducescatter: n+1 rows, so rank 0 gets two rows and the others one
    x = torch.arange(2 * (n + 1), dtype=torch.float32).reshape(n + 1, 2) * (r + 1)
    full = torch.arange(2 * (n + 1), dtype=torch.float32).reshape(n + 1, 2) * n * (n + 1) / 2
    lo = 0 if r == 0 else r + 1
    hi = 2 if r == 0 else r + 2
    got = hvd.reducescatter(x, op=hvd.Sum, name="rs")
    check_close(got.numpy(), full[lo:hi].numpy(), "reducescatter Sum")
    got = hvd.synchronize(hvd.reducescatter_async(x, name="rs_async"))
    check_close(got.numpy(), full[lo:hi].numpy() / n, "reducescatter_async default Average")

    hvd.barrier()
    objs = hvd.allgather_object({"rank": r, "t": torch.tensor([r])})
    check([o["rank"] for o in objs] == list(range(n)), "allgather_object")
    obj = hvd.broadcast_object({"lr": 0.1 * (r + 1)} if r == root else None, root_rank=root)
    check(obj == {"lr": 0.1 * (root + 1)}, "broadcast_object")


def test_errors(r, n):
    for device in ("cuda", "cuda:1"):
        expect_error(
            hvd.InvalidArgumentError,
            lambda: hvd._tensors.check_device(torch.device(device)),
            "GPU tensors are not supported yet",
            what=f"{device} tensor",
        )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(torch.empty(2, device="meta")),
        "device 'meta'",
        what="meta tensor",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
        "complex64",
        "not supported",
        what="complex dtype",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(np.ones(2)),
        "torch.Tensor",
        what="numpy array to the torch API",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(torch.eye(2).to_sparse()),
        "sparse",
        what="sparse tensor",
    )
    # the same name with a different shape: an error on every rank, never a hang
    msg = expect_error(
        hvd.MismatchError,
        lambda: hvd.allreduce(torch.ones(2 + (r == n - 1)), name="mismatch"),
        "mismatch",
        what="shape mismatch",
    )
    check("shape" in msg.lower(), f"mismatch message names the field: {msg!r}")
    # the job goes on after the error
    check_close(
        hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").numpy(),
        [n],
        "allreduce after a mismatch",
    )
    # Min has no gradient
    x = torch.ones(2, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Min, name="min_grad")
    check_close(y.detach().numpy(), [1, 1], "Min forward on a tensor requiring grad")
    expect_error(
        hvd.InvalidArgumentError,
        lambda: y.sum().backward(),
        "Average and Sum",
        what="backward through Min",
    )


def test_gradients(r, n):
    """Each rank's loss is sum(output * W_r); the expected input gradients follow from the
    definitions in scaleout.torch._autograd."""
    ws = lambda shape: [weights(k, shape) for k in range(n)]  # noqa: E731

    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.25)]:
        x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.allreduce(
            x, op=op, prescale_factor=pre, postscale_factor=post, name=f"g.ar.{op}.{pre}"
        )
        (y * weights(r, (3, 2))).sum().backward()
        want = torch.stack(ws((3, 2))).sum(0) * pre * post / (n if op == hvd.Average else 1)
        check_close(x.grad.numpy(), want.numpy(), f"allreduce op {op} pre {pre} gradient")

    xs = [
        torch.randn(2, dtype=torch.float64, requires_grad=True),
        torch.randn(1, 3, dtype=torch.float64, requires_grad=True),
    ]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="g.grouped")
    ((ys[0] * weights(r, (2,))).sum() + (ys[1] * weights(r, (1, 3))).sum()).backward()
    check_close(xs[0].grad.numpy(), torch.stack(ws((2,))).sum(0).numpy(), "grouped grad 0")
    check_close(xs[1].grad.numpy(), torch.stack(ws((1, 3))).sum(0).numpy(), "grouped grad 1")

    # allgather: rank r's own rows of the average of every rank's output gradient
    x = torch.randn(r + 1, 2, dtype=torch.float64, requires_grad=True)
    total = n * (n + 1) // 2
    y = hvd.allgather(x, name="g.ag")
    (y * weights(r, (total, 2))).sum().backward()
    off = r * (r + 1) // 2
    want = torch.stack(ws((total, 2))).mean(0)[off : off + r + 1]
    check_close(x.grad.numpy(), want.numpy(), "allgather gradient")

    # broadcast: the root gets the average of every rank's output gradient, the others zero
    root = n - 1
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (hvd.broadcast(x, root, name="g.bc") * weights(r, (4,))).sum().backward()
    want = torch.stack(ws((4,))).mean(0) if r == root else torch.zeros(4, dtype=torch.float64)
    check_close(x.grad.numpy(), want.numpy(), "broadcast gradient")

    # alltoall with splits j+1 to rank j: what rank r sent to j comes back as W_j's rows
    splits = [j + 1 for j in range(n)]
    x = torch.randn(sum(splits), 2, dtype=torch.float64, requires_grad=True)
    y, received = hvd.alltoall(x, splits=splits, name="g.a2a")
    (y * weights(r, tuple(y.shape))).sum().backward()
    want = torch.cat(
        [weights(j, (n * (j + 1), 2))[r * (j + 1) : (r + 1) * (j + 1)] for j in range(n)]
    )
    check_close(x.grad.numpy(), want.numpy(), "alltoall gradient")
    x2 = torch.randn(2 * n, 1, dtype=torch.float64, requires_grad=True)
    y2 = hvd.alltoall(x2, name="g.a2a_eq")
    (y2 * weights(r, (2 * n, 1))).sum().backward()
    want = torch.cat([weights(j, (2 * n, 1))[2 * r : 2 * r + 2] for j in range(n)])
    check_close(x2.grad.numpy(), want.numpy(), "alltoall (equal splits) gradient")

    # reducescatter (Horovod's definition): every rank's input gradient is the concatenation of
    # the output gradients, times size() for Sum
    for op in (hvd.Sum, hvd.Average):
        x = torch.randn(n + 1, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op, name=f"g.rs.{op}")
        rows = lambda k: 2 if k == 0 else 1  # noqa: E731
        (y * weights(r, (rows(r), 2))).sum().backward()
        want = torch.cat([weights(k, (rows(k), 2)) for k in range(n)])
        if op == hvd.Sum:
            want = want * n
        check_close(x.grad.numpy(), want.numpy(), f"reducescatter op {op} gradient")

    # torch's own numerical check on one op (each evaluation is a collective on every rank)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    ok = torch.autograd.gradcheck(
        lambda t: hvd.allreduce(t, op=hvd.Sum, name="gradcheck") * 2, (x,), eps=1e-6, atol=1e-6
    )
    check(ok, "gradcheck of allreduce")


def run():
    r, n = hvd.rank(), hvd.size()
    test_allreduce(r, n)
    test_compression(r, n)
    test_gather_broadcast_alltoall_reducescatter(r, n)
    test_errors(r, n)
    test_gradients(r, n)


if __name__ == "__main__":
    main(run)
