"""Run by tests/test_collectives.py::test_every_collective_op_and_dtype,
tests/test_collectives.py::test_without_room_for_shared_memory_allreduces_go_through_mpi.

Every collective, op and dtype on real ranks, checked against numpy on each rank.

Argument: the allreduce data path the run must be using ("shm" or "mpi")."""

import sys

import numpy as np
from _harness import check, check_close, main_tests

import scaleout as so

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]


def bfloat16():
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


def local_input(rank, dtype, shape=(3, 5)):
    """Each rank's input, computable by every rank: small values so products do not overflow."""
    rng = np.random.default_rng(1000 + rank)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    vals = rng.integers(1, 4, size=shape)
    if dtype not in ("uint8",):
        vals = vals * np.where(rng.integers(0, 2, size=shape) == 0, -1, 1)
    return vals.astype(dtype)


def expected(op, inputs, dtype):
    stack = np.stack([x.astype(np.float64) for x in inputs])
    if dtype == "bool":
        stack = stack.astype(bool)
        return {
            so.Sum: stack.any(0),
            so.Max: stack.any(0),
            so.Min: stack.all(0),
            so.Product: stack.all(0),
        }[op]
    out = {
        so.Sum: stack.sum(0),
        so.Average: stack.sum(0) / len(inputs),
        so.Min: stack.min(0),
        so.Max: stack.max(0),
        so.Product: stack.prod(0),
    }[op]
    if np.issubdtype(np.dtype(dtype), np.integer):
        out = np.trunc(out)
    return out.astype(dtype)


def test_allreduce_all_ops_and_dtypes(r, n):
    ops = [so.Sum, so.Average, so.Min, so.Max, so.Product]
    for dtype in DTYPES:
        inputs = [local_input(k, dtype) for k in range(n)]
        for op in ops:
            if dtype == "bool" and op == so.Average:
                continue
            got = so.allreduce(inputs[r], op=op, name=f"ar.{dtype}.{op}")
            check(got.dtype == np.dtype(dtype), f"allreduce {dtype} op {op} keeps dtype")
            check_close(got, expected(op, inputs, dtype), f"allreduce {dtype} op {op}", rtol=1e-3)
    # async + in place + scale factors
    x = np.full(7, float(r + 1), np.float32)
    h = so.allreduce_async_(x, op=so.Sum, prescale_factor=2.0, postscale_factor=0.5, name="ip")
    check(so.synchronize(h) is x, "allreduce_ returns the tensor itself")
    check_close(x, np.full(7, n * (n + 1) / 2, np.float32), "in-place allreduce with scale factors")
    # non-contiguous in place
    m = np.arange(20, dtype=np.float64).reshape(4, 5) * (r + 1)
    view = m[:, 1::2]
    so.allreduce_(view, op=so.Sum, name="noncontig")
    base = np.arange(20, dtype=np.float64).reshape(4, 5)
    check_close(view, base[:, 1::2] * n * (n + 1) / 2, "non-contiguous in-place allreduce")
    check_close(m[:, 0], base[:, 0] * (r + 1), "untouched columns stay")
    # default op is Average; the deprecated average=False means Sum
    check_close(
        so.allreduce(np.array([float(r)]), name="avg"), [np.mean(range(n))], "default Average"
    )
    check_close(so.allreduce(np.array([1.0]), average=False, name="avg2"), [n], "average=False")
    # scalars and empty tensors
    check_close(so.allreduce(np.float64(r), op=so.Max, name="scalar"), n - 1, "0-d allreduce")
    check(
        so.allreduce(np.zeros((0, 3), np.float32), name="empty").shape == (0, 3), "empty allreduce"
    )


def test_half_precision_accumulates_in_float32(r, n):
    # 1 + many tiny values: in a float16 chain the tiny ones vanish, in float32 they add up.
    x = np.full(4, 1e-3, np.float16) if r else np.full(4, 1.0, np.float16)
    got = so.allreduce(x, op=so.Sum, name="f16prec")
    want = np.float16(np.float32(1.0) + np.float32(np.float16(1e-3)) * (n - 1))
    check_close(got, np.full(4, want), "float16 sum rounded once", rtol=0, atol=0)
    # Many elements (several staging rounds), Average with a prescale: on every path each
    # element is prescaled, summed in float32 and rounded once with the post factor (Note
    # [Halves on the wire]); multiples of 1/64 keep the float32 sums exact, so the result is
    # fixed to the bit.
    count = 1_000_003

    def values(q):
        return ((np.arange(count) * 37 + q * 101) % 1025 - 512).astype(np.float32) / 64

    got = so.allreduce(
        values(r).astype(np.float16), op=so.Average, prescale_factor=0.5, name="f16avg"
    )
    total = sum(values(q).astype(np.float16).astype(np.float32) * np.float32(0.5) for q in range(n))
    want = (total * np.float32(1.0 / n)).astype(np.float16)
    check(
        got.dtype == np.float16 and np.array_equal(got.view(np.uint16), want.view(np.uint16)),
        f"float16 Average rounded once ({np.count_nonzero(got != want)} elements differ)",
    )
    bf = bfloat16()
    if bf is not None:
        y = (np.arange(6) + r).astype(bf)
        got = so.allreduce(y, op=so.Sum, name="bf16")
        check(got.dtype == bf, "bfloat16 stays bfloat16")
        check_close(got.astype(np.float32), sum(np.arange(6) + k for k in range(n)), "bfloat16 sum")


def test_fusion_many_tensors(r, n):
    tensors = [
        np.full(s, float(r + i), np.float32) for i, s in enumerate([1, 10, 1000, 3, 50000] * 8)
    ]
    handles = [so.allreduce_async(t, op=so.Sum, name=f"fuse.{i}") for i, t in enumerate(tensors)]
    for i, (t, h) in enumerate(zip(tensors, handles)):
        check_close(
            so.synchronize(h), np.full(t.shape, sum(k + i for k in range(n))), f"fused tensor {i}"
        )
    outs = so.grouped_allreduce([np.full(3, r, np.int64), np.full(2, 2 * r, np.int64)], op=so.Sum)
    s = n * (n - 1) // 2
    check_close(outs[0], [s] * 3, "grouped 0")
    check_close(outs[1], [2 * s] * 2, "grouped 1")
    # mixed dtypes submitted together are fused per dtype
    hs = [
        so.allreduce_async(np.full(5, r, dt), op=so.Sum, name=f"mix.{i}")
        for i, dt in enumerate(["float32", "float64", "int32", "float16"] * 3)
    ]
    for h in hs:
        check_close(so.synchronize(h), np.full(5, n * (n - 1) / 2), "mixed-dtype fusion")


def test_data_path(r, n):
    want = "1" if sys.argv[1] == "shm" else "0"
    check(so.config()["SCALEOUT_SHM"] == want, f"allreduces go through {sys.argv[1]}")


def test_large_and_fused_tensors_across_rounds_and_slices(r, n):
    # Sizes that do not divide into 64-byte lines, ranks or rounds; exact integer-valued sums.
    sizes = [1, 17, 1000, 4097, 33333, 70001]
    for dtype, op in [
        ("float32", so.Sum),
        ("float64", so.Average),
        ("int64", so.Max),
        ("int32", so.Min),
        ("float16", so.Sum),
        ("uint8", so.Product),
    ]:
        inputs = [
            [(np.arange(s) % 7 + k + (1 if dtype == "uint8" else 0)).astype(dtype) for s in sizes]
            for k in range(n)
        ]
        if dtype == "uint8":  # products of small values only
            inputs = [[(x % 2 + 1).astype(dtype) for x in per_rank] for per_rank in inputs]
        handles = [
            so.allreduce_async(x, op=op, name=f"big.{dtype}.{i}") for i, x in enumerate(inputs[r])
        ]
        for i, h in enumerate(handles):
            want = expected(op, [inputs[k][i] for k in range(n)], dtype)
            check_close(so.synchronize(h), want, f"{dtype} op {op} tensor of {sizes[i]}", rtol=0)
    # One large tensor alone, in place, with scale factors.
    x = np.arange(300_001, dtype=np.float64) * (r + 1)
    so.allreduce_(x, op=so.Sum, prescale_factor=0.5, postscale_factor=4.0, name="big.alone")
    check_close(
        x, np.arange(300_001) * 2.0 * n * (n + 1) / 2, "large in-place allreduce", rtol=1e-12
    )
    # A rank that joined contributes zeros, across rounds too.
    if r != n - 1:
        got = so.allreduce(np.ones(50_000, np.float32), op=so.Sum, name="big.joined")
        check_close(got, np.full(50_000, n - 1), "allreduce while the last rank has joined", rtol=0)
    last = so.join()
    check(
        last != n - 1 and so.allgather_object(last) == [last] * n,
        "every rank hears the same last rank to join, not the one that joined first",
    )


def test_different_submission_order(r, n):
    names = [f"order.{i}" for i in range(12)]
    order = names if r % 2 == 0 else list(reversed(names))
    handles = {
        nm: so.allreduce_async(np.full(3, float(i), np.float32), op=so.Sum, name=nm)
        for i, nm in ((names.index(nm), nm) for nm in order)
    }
    for nm, h in handles.items():
        check_close(so.synchronize(h), np.full(3, names.index(nm) * n), f"out-of-order {nm}")


def test_allgather(r, n):
    for dtype in DTYPES:
        x = np.full((r + 1, 2), r, dtype=dtype if dtype != "bool" else "bool")
        got = so.allgather(x, name=f"ag.{dtype}")
        want = np.concatenate([np.full((k + 1, 2), k, dtype=x.dtype) for k in range(n)])
        check(got.dtype == x.dtype and got.shape == want.shape, f"allgather {dtype} shape")
        check(np.array_equal(got, want), f"allgather {dtype} values")
    hs = [so.allgather_async(np.full((r + i, 3), i, np.float32), name=f"agf.{i}") for i in range(6)]
    for i, h in enumerate(hs):
        want = np.concatenate([np.full((k + i, 3), i, np.float32) for k in range(n)])
        check(np.array_equal(so.synchronize(h), want), f"fused allgather {i}")
    check(
        np.array_equal(
            so.allgather(np.zeros((0, 4)) if r == 0 else np.ones((1, 4))), np.ones((n - 1, 4))
        ),
        "allgather with an empty contribution",
    )


def test_broadcast(r, n):
    for root in range(n):
        x = np.full((2, 3), r, np.float64)
        got = so.broadcast(x, root, name=f"bc.{root}")
        check(np.array_equal(got, np.full((2, 3), root)), f"broadcast root {root}")
        check(np.array_equal(x, np.full((2, 3), r)), "broadcast leaves the input alone")
        y = np.full(4, r, np.int16)
        so.broadcast_(y, root, name=f"bc_.{root}")
        check(np.array_equal(y, np.full(4, root)), f"in-place broadcast root {root}")


def test_alltoall(r, n):
    x = np.repeat(np.arange(n, dtype=np.float32)[:, None] + 10 * r, 2, axis=1)  # row k goes to k
    got = so.alltoall(x, name="a2a")
    check(
        np.array_equal(got, np.array([[10 * k + r] * 2 for k in range(n)], np.float32)),
        "alltoall equal splits",
    )
    splits = [k + 1 for k in range(n)]  # rank k gets k+1 rows from everyone
    rows = np.concatenate([np.full(k + 1, 100 * r + k, np.int32) for k in range(n)])
    got, received = so.alltoall(rows, splits=splits, name="a2av")
    check(list(received) == [r + 1] * n, f"received splits {list(received)}")
    want = np.concatenate([np.full(r + 1, 100 * k + r, np.int32) for k in range(n)])
    check(np.array_equal(got, want), "alltoall with splits")

    # Uneven and large: sender j sends (j + 2k) % 3 * 700 rows of 3 float64s to rank k (some
    # pairs nothing, others many staging rounds), each row numbering (sender, receiver, row).
    def count(j, k):
        return (j + 2 * k) % 3 * 700

    mine = np.concatenate(
        [
            np.stack(
                [np.full(count(r, k), r), np.full(count(r, k), k), np.arange(count(r, k))], axis=1
            )
            for k in range(n)
        ]
    )
    got, received = so.alltoall(
        mine.astype(np.float64), splits=[count(r, k) for k in range(n)], name="a2a.large"
    )
    check(list(received) == [count(j, r) for j in range(n)], f"large: received {list(received)}")
    want = np.concatenate(
        [
            np.stack(
                [np.full(count(j, r), j), np.full(count(j, r), r), np.arange(count(j, r))], axis=1
            )
            for j in range(n)
        ]
    )
    check(got.shape == want.shape and np.array_equal(got, want), "large uneven alltoall")


def test_reducescatter(r, n):
    rows = 2 * n + 1
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + r
    got = so.reducescatter(x, op=so.Sum, name="rs")
    total = sum(np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + k for k in range(n))
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    check_close(got, total[start : start + counts[r]], "reducescatter Sum")
    got = so.reducescatter(x.astype(np.float16), name="rs16")
    check_close(
        got, (total / n)[start : start + counts[r]], "reducescatter Average float16", rtol=1e-2
    )


def test_objects_and_barrier(r, n):
    obj = so.broadcast_object({"rank": r, "list": list(range(r + 3))}, root_rank=n - 1)
    check(obj == {"rank": n - 1, "list": list(range(n + 2))}, "broadcast_object")
    check(so.allgather_object(("r", r)) == [("r", k) for k in range(n)], "allgather_object")
    so.barrier()
    check(so.local_size() == n and so.local_rank() == r, "local rank on one host")
    check(so.cross_size() == 1 and so.cross_rank() == 0, "cross rank on one host")


if __name__ == "__main__":
    main_tests(globals())
