"""Run by tests/test_tensorflow.py::test_ops_eager_and_in_tf_function_with_gradients_and_errors.

scaleout.tensorflow collectives on real ranks: every op eagerly and inside tf.function, their
gradients, broadcast_variables, IndexedSlices, compression, and the errors users get."""

import numpy as np
from _harness import check, check_close, expect_error, main_tests
from tf_common import expect_graph_error, so, tf  # noqa: F401  (sets TensorFlow up first)

import scaleout.tensorflow as hvd
from scaleout.tensorflow._arguments import check_device

DTYPES = [
    tf.uint8,
    tf.int8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
]


def both_modes(fn):
    """fn(*args) eagerly and as a tf.function (autograph on, as users write them)."""
    return [("eager", fn), ("graph", tf.function(fn))]


def test_allreduce_every_dtype_and_op(r, n):
    ranks = np.arange(n)
    for mode, f in both_modes(lambda x, op: hvd.allreduce(x, op=op)):
        for dtype in DTYPES:
            if dtype == tf.bool:
                got = f(tf.constant([r == 0, True]), so.Max)
                check(
                    got.dtype == tf.bool and got.numpy().tolist() == [True, True],
                    f"{mode} allreduce bool",
                )
                continue
            x = tf.cast(tf.constant([[1, 2], [3, 1]]) * (r + 1), dtype)
            base = np.array([[1, 2], [3, 1]], np.float64)
            for op, want in (
                (so.Sum, base * ranks.sum() + base * n),
                (so.Max, base * n),
                (so.Min, base),
                (so.Product, base**n * np.prod(ranks + 1.0)),
            ):
                if op == so.Product and dtype in (tf.int8, tf.uint8, tf.float16, tf.bfloat16):
                    continue  # overflows / too coarse for the check
                got = f(x, op)
                check(
                    got.dtype == dtype and got.shape == (2, 2), f"{mode} {dtype.name} keeps dtype"
                )
                check_close(
                    tf.cast(got, tf.float64),
                    want,
                    f"{mode} allreduce {dtype.name} op {op}",
                    rtol=1e-2,
                )
        avg = f(tf.constant([float(r), 1.0]), so.Average)
        check_close(avg, [(n - 1) / 2, 1.0], f"{mode} Average (the default op)")
    # defaults, scale factors, Variables, name reuse across calls
    v = tf.Variable([1.0, 2.0])
    check_close(hvd.allreduce(v), [1.0, 2.0], "allreduce of a tf.Variable")
    check_close(
        hvd.allreduce(tf.ones(3), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
        np.full(3, n / 2),
        "scale factors",
    )
    check_close(hvd.allreduce(tf.constant(float(r)), op=hvd.Max), n - 1, "0-d tensor")
    check_close(hvd.allreduce(tf.ones(2), average=False), [n, n], "deprecated average=False")

    @tf.function
    def steps(x):
        return hvd.allreduce(x, op=hvd.Sum, name="steady") + hvd.allreduce(x, op=hvd.Sum)

    for step in range(3):  # the same names every step: the response cache path
        check_close(steps(tf.fill([4], float(step))), np.full(4, 2.0 * step * n), f"step {step}")
    check_close(steps(tf.ones([2, 3])), np.full((2, 3), 2.0 * n), "retraced with a new shape")


def test_compression(r, n):
    # 1/7: float16 sums of it miss n/7 by 2.4e-4 at 2, 3 and 4 ranks (three float16 thirds add
    # up to exactly 1.0, so 1/3 could not tell at 3)
    x = tf.constant([1.0 / 7, 1000.0 + r], tf.float32)
    for mode, f in both_modes(
        lambda x: hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    ):
        got = f(x)
        check(got.dtype == tf.float32, f"{mode} fp16 compression returns float32")
        check_close(
            got, [n / 7, 1000.0 * n + n * (n - 1) / 2], f"{mode} fp16 compression", rtol=1e-3
        )
        check(not np.allclose(got.numpy()[0], n / 7, rtol=1e-6, atol=0), f"{mode} went as float16")
    i = hvd.allreduce(tf.constant([r], tf.int64), op=hvd.Sum, compression=hvd.Compression.fp16)
    check(
        i.dtype == tf.int64 and int(i[0]) == n * (n - 1) // 2, "compression leaves integers alone"
    )


def test_grouped_allreduce(r, n):
    for mode, f in both_modes(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum)):
        a, b = f(tf.fill([3], float(r)), tf.fill([2, 2], r))
        check_close(a, np.full(3, n * (n - 1) / 2), f"{mode} grouped float")
        check(b.dtype == tf.int32 and int(b[0, 0]) == n * (n - 1) // 2, f"{mode} grouped int")


def test_allgather_broadcast_alltoall_reducescatter(r, n):
    for mode, f in both_modes(lambda x: hvd.allgather(x)):
        got = f(tf.fill([r + 1, 2], r))
        want = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
        check(got.shape == want.shape and np.array_equal(got, want), f"{mode} allgather")
        check(
            f(tf.constant(float(r))).numpy().tolist() == list(range(n)), f"{mode} allgather of 0-d"
        )
    for mode, f in both_modes(lambda x, root: hvd.broadcast(x, root)):
        for root in range(n):
            got = f(tf.fill([2, 2], tf.cast(r, tf.float64)), root)
            check(
                np.array_equal(got, np.full((2, 2), float(root))), f"{mode} broadcast from {root}"
            )
    for mode, f in both_modes(lambda x: hvd.alltoall(x)):
        got = f(tf.range(n) + 10 * r)
        check(got.numpy().tolist() == [10 * k + r for k in range(n)], f"{mode} alltoall")
    for mode, f in both_modes(lambda x, s: hvd.alltoall(x, splits=s)):
        rows = np.concatenate([np.full(k + 1, 100 * r + k) for k in range(n)])
        got, received = f(tf.constant(rows), tf.constant([k + 1 for k in range(n)]))
        check(received.numpy().tolist() == [r + 1] * n, f"{mode} alltoall received splits")
        check(
            got.numpy().tolist() == sum(([100 * k + r] * (r + 1) for k in range(n)), []),
            f"{mode} alltoall with splits",
        )
    rows = 2 * n + 1
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    base = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    for mode, f in both_modes(lambda x: hvd.reducescatter(x, op=hvd.Sum)):
        got = f(tf.constant(base + r))
        check_close(
            got, (base * n + n * (n - 1) / 2)[start : start + counts[r]], f"{mode} reducescatter"
        )


def test_gradients(r, n):
    def grads(fn, x):
        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = fn(x)
        return tape.gradient(loss, x)

    # Total loss = sum over ranks. allreduce Sum: d/dx_r sum_k sum(w_k * allreduce(x)) = sum_k w_k.
    w = tf.constant([1.0, 2.0]) * (r + 1)
    want_sum = np.array([1.0, 2.0]) * n * (n + 1) / 2
    for mode, f in both_modes(
        lambda x: grads(lambda v: tf.reduce_sum(w * hvd.allreduce(v, op=hvd.Sum)), x)
    ):
        check_close(f(tf.ones(2)), want_sum, f"{mode} allreduce Sum gradient")
    for mode, f in both_modes(lambda x: grads(lambda v: tf.reduce_sum(w * hvd.allreduce(v)), x)):
        check_close(f(tf.ones(2)), want_sum / n, f"{mode} allreduce Average gradient")
    g = grads(
        lambda v: tf.add_n(
            [tf.reduce_sum(t) for t in hvd.grouped_allreduce([v, 2 * v], op=hvd.Sum)]
        ),
        tf.ones(3),
    )
    check_close(g, np.full(3, 3.0 * n), "grouped_allreduce gradient")
    # allgather (Horovod's definition): each rank gets its own rows of the averaged gradient
    for mode, f in both_modes(
        lambda x: grads(
            lambda v: tf.reduce_sum(
                hvd.allgather(v)
                * tf.cast(tf.range(n * (n + 1) // 2)[:, None] + 1, tf.float32)
                * float(r + 1)
            ),
            x,
        )
    ):
        got = f(tf.ones([r + 1, 2]))
        first = r * (r + 1) // 2
        want = np.repeat((np.arange(first, first + r + 1) + 1.0)[:, None], 2, 1) * (n + 1) / 2
        check_close(got, want, f"{mode} allgather gradient")
    # broadcast (Horovod's definition): the root gets the averaged gradient, the others zeros
    for mode, f in both_modes(
        lambda x: grads(lambda v: tf.reduce_sum(hvd.broadcast(v, n - 1) * float(r + 1)), x)
    ):
        want = np.full(2, (n + 1) / 2) if r == n - 1 else np.zeros(2)
        check_close(f(tf.ones(2)), want, f"{mode} broadcast gradient")
    # alltoall: gradients travel back the same way
    got = grads(
        lambda v: tf.reduce_sum(hvd.alltoall(v) * tf.cast(tf.range(n), tf.float32) * float(r + 1)),
        tf.ones(n),
    )
    check_close(got, [float((k + 1) * r) for k in range(n)], "alltoall gradient")
    # reducescatter Sum (Horovod's definition): the gathered slices' gradients, times size()
    rows = n
    got = grads(
        lambda v: tf.reduce_sum(hvd.reducescatter(v, op=hvd.Sum) * float(r + 1)), tf.ones([rows, 2])
    )
    check_close(got, np.repeat(np.arange(1.0, n + 1)[:, None], 2, 1) * n, "reducescatter gradient")
    expect_error(
        NotImplementedError,
        lambda: grads(lambda v: tf.reduce_sum(hvd.allreduce(v, op=hvd.Max)), tf.ones(2)),
        "Max",
        what="no gradient for Max",
    )


def test_indexed_slices(r, n):
    slices = tf.IndexedSlices(
        tf.fill([2, 3], float(r + 1)),
        tf.constant([r, n], tf.int64),
        tf.constant([n + 1, 3], tf.int64),
    )
    for mode, f in both_modes(lambda: hvd.allreduce(slices)):
        got = f()
        check(isinstance(got, tf.IndexedSlices), f"{mode} allreduce keeps IndexedSlices")
        dense = tf.convert_to_tensor(got).numpy()
        want = (
            sum(
                tf.convert_to_tensor(
                    tf.IndexedSlices(
                        tf.fill([2, 3], float(k + 1)),
                        tf.constant([k, n], tf.int64),
                        tf.constant([n + 1, 3], tf.int64),
                    )
                ).numpy()
                for k in range(n)
            )
            / n
        )
        check_close(dense, want, f"{mode} IndexedSlices average equals the dense average")
    # As Horovod, compression leaves a tf.IndexedSlices' values alone (1 + 2**-20 has no float16)
    fine = tf.IndexedSlices(tf.fill([1, 1], 1.0 + 2.0**-20), tf.constant([r]), tf.constant([n, 1]))
    s = hvd.allreduce(fine, op=hvd.Sum, compression=hvd.Compression.fp16)
    check(
        s.values.dtype == tf.float32 and s.values.numpy().ravel().tolist() == [1.0 + 2.0**-20] * n,
        "IndexedSlices Sum with fp16 compression: values gathered uncompressed",
    )
    # Horovod's refusals (NotImplementedError), in both modes, before anything runs
    refused = [
        (lambda: hvd.allreduce(slices, op=hvd.Max), "Only Sum and Average ops are supported"),
        (lambda: hvd.allreduce(slices, op=hvd.Adasum), "pass sparse_as_dense=True"),
        (lambda: hvd.allreduce(slices, prescale_factor=2.0), "Pre/postscale_factor"),
        (lambda: hvd.allreduce(slices, op=hvd.Sum, postscale_factor=0.5), "Pre/postscale_factor"),
        (
            lambda: hvd.grouped_allreduce([tf.ones(2), slices], prescale_factor=2.0),
            "Pre/postscale_factor are not supported with tf.IndexedSlices",
        ),
    ]
    for i, (call, words) in enumerate(refused):
        for mode, f in both_modes(call):
            expect_error(NotImplementedError, f, words, what=f"{mode} IndexedSlices refusal {i}")
    check(hvd.allreduce(tf.ones(1), name="after.refusals").numpy().tolist() == [1.0], "after")
    # Integer values averaged as Horovod divides them (TensorFlow's truediv), alone and grouped
    # with a dense tensor, in both modes.
    for dtype, want_dtype in ((tf.uint8, tf.float32), (tf.int32, tf.float64)):
        ints = tf.IndexedSlices(
            tf.fill([1, 2], tf.cast(r + 1, dtype)), tf.constant([r]), tf.constant([n, 2])
        )
        dense = tf.fill([2], float(r + 1))
        for mode, f in both_modes(lambda: hvd.grouped_allreduce([ints, dense], op=hvd.Average)):
            got_slices, got_dense = f()
            check(got_slices.values.dtype == want_dtype, f"{mode} {dtype.name} average's dtype")
            want = np.array([[k + 1.0] * 2 for k in range(n)]) / n
            check_close(tf.convert_to_tensor(got_slices).numpy(), want, f"{mode} {dtype.name}")
            check_close(got_dense, [(n + 1) / 2] * 2, f"{mode} the dense one beside it")
        alone = hvd.allreduce(ints, op=hvd.Average)
        check_close(tf.convert_to_tensor(alone).numpy(), want, f"{dtype.name} alone")


def test_broadcast_variables_objects_join(r, n):
    a, b = (tf.Variable(tf.fill([3], float(r))), tf.Variable(tf.fill([2], r + 10)))
    hvd.broadcast_variables([a, b], root_rank=n - 1)
    check(
        a.numpy().tolist() == [n - 1.0] * 3 and b.numpy().tolist() == [n + 9] * 2,
        "broadcast_variables eager",
    )
    c = tf.Variable(tf.fill([2, 2], float(r)))

    @tf.function
    def bcast():
        hvd.broadcast_variables([c], root_rank=0)
        return c.read_value()

    check(np.array_equal(bcast(), np.zeros((2, 2))), "broadcast_variables inside tf.function")
    check(hvd.broadcast_object({"r": r}, root_rank=1) == {"r": 1}, "broadcast_object")
    check(hvd.allgather_object(r) == list(range(n)), "allgather_object")
    hvd.barrier()
    tf.function(lambda: hvd.barrier())()
    # join: the last rank joins at once; the others still reduce (it contributes zeros)
    if r != n - 1:
        check_close(
            hvd.allreduce(tf.ones(2), op=hvd.Sum, name="with_joined"),
            [n - 1.0] * 2,
            "allreduce while a rank has joined",
        )
    last = hvd.join()
    check(last.dtype == tf.int32 and 0 <= int(last) < n, "join returns a rank")
    check(hvd.allgather_object(int(last)) == [int(last)] * n, "every rank gets the same last rank")


def test_errors(r, n):
    # mismatches: every rank gets the error, naming the tensor and the ranks
    expect_error(
        hvd.MismatchError,
        lambda: hvd.allreduce(tf.ones([2 + (r == n - 1)]), name="grads.w"),
        "grads.w",
        "shape",
        f"rank {n - 1} has [3]",
        what="eager shape mismatch",
    )
    expect_error(
        hvd.MismatchError,
        lambda: hvd.allreduce(tf.ones(2, tf.float64 if r == 0 else tf.float32), name="dt"),
        "dtype",
        "float64",
        what="eager dtype mismatch",
    )

    @tf.function
    def graph_reduce(x):
        return hvd.allreduce(x, name="graph.mm")

    _, msg = expect_graph_error(
        lambda: graph_reduce(tf.ones([2 + (r == n - 1)])),
        "MismatchError",
        "graph.mm",
        f"rank {n - 1} has [3]",
        what="graph shape mismatch",
    )
    expect_graph_error(
        lambda: graph_reduce(tf.ones([2], tf.float64 if r == 0 else tf.float32)),
        "MismatchError",
        "dtype",
        what="graph dtype mismatch",
    )
    check_close(graph_reduce(tf.ones(2)), [1.0, 1.0], "graph op works after errors")
    expect_error(
        hvd.MismatchError,
        lambda: hvd.allgather(tf.ones([1, 2 + (r == 0)]), name="ag"),
        "ag",
        what="allgather trailing-dim mismatch",
    )
    # local errors
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.allreduce(tf.ones(2, tf.complex64)),
        "complex64",
        what="unsupported dtype",
    )
    # No GPU here: the check an eager tensor's device string goes through.
    expect_error(
        hvd.InvalidArgumentError,
        lambda: check_device("/job:localhost/replica:0/task:0/device:GPU:0", "allreduce"),
        "GPU tensors are not supported yet",
        what="eager GPU tensor",
    )

    @tf.function
    def on_gpu(x):
        with tf.device("/GPU:0"):
            y = x * 2.0
        return hvd.allreduce(y)

    expect_graph_error(
        lambda: on_gpu(tf.ones(2)), "GPU tensors are not supported yet", what="graph GPU tensor"
    )

    @tf.function(jit_compile=True)
    def xla(x):
        return hvd.allreduce(x)

    expect_graph_error(lambda: xla(tf.ones(2)), "XLA", "jit_compile=False", what="jit_compile=True")
    check_close(hvd.allreduce(tf.ones(2), op=hvd.Sum), [n, n], "still working")


if __name__ == "__main__":
    main_tests(globals())
