"""Run by tests/test_tensorflow_process_sets.py::test_tensorflow_on_process_sets.

Process sets through scaleout.tensorflow and scaleout.tensorflow.keras, at 3 or 4 ranks:
every collective on a set, eagerly and in tf.function, with its gradient on the set; the query
ops and object helpers; a rank outside the set; DistributedGradientTape and the TF1 optimizer
on a set; Keras DistributedOptimizer training on two disjoint sets at once.

Sets (registered at init): A = [0, 2]; B = [1, ..., n - 1] (overlaps A at rank 2, which uses
both, A first); C = the ranks not in A ([1] at 3 ranks, [1, 3] at 4), disjoint from A.
Expected values are computed with numpy from the set's ranks; roots are the job's ranks."""

import keras
import numpy as np
from _harness import check, check_close, expect_error, main
from tf_common import so, tf  # noqa: F401  (sets TensorFlow up first)

import scaleout.tensorflow as hvd
import scaleout.tensorflow.keras as hvd_keras


def both_modes(fn):
    """fn eagerly and as a tf.function."""
    return [("eager", fn), ("graph", tf.function(fn))]


def on_each_set(test):
    """Runs test(r, ps, label) for each of A and B this rank is in, A first (rank 2 is in
    both, so every rank meets the sets in the same order)."""

    def run(r, n):
        for label, ps in (("A", A), ("B", B)):
            if r in ps.ranks:
                test(r, ps, f"set {label} {ps.ranks}")

    run.__name__ = test.__name__
    return run


def collectives(r, ps, label):
    ranks, k, me = ps.ranks, len(ps.ranks), ps.ranks.index(r)
    total = float(sum(q + 1 for q in ranks))
    for mode, f in both_modes(lambda x, op: hvd.allreduce(x, op=op, process_set=ps)):
        x = tf.constant([r + 1.0, 2.0 * (r + 1)])
        check_close(f(x, hvd.Sum), [total, 2 * total], f"{label} {mode}: allreduce Sum")
        check_close(
            f(x, hvd.Average),
            [total / k, 2 * total / k],
            f"{label} {mode}: allreduce Average divides by the set's size",
        )
    for mode, f in both_modes(
        lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, process_set=ps)
    ):
        a, b = f(tf.fill([3], r + 1.0), tf.fill([2, 2], r + 1))
        check_close(a, np.full(3, total), f"{label} {mode}: grouped_allreduce float")
        check(
            b.dtype == tf.int32 and np.all(b.numpy() == total),
            f"{label} {mode}: grouped_allreduce int",
        )

    want = np.concatenate([np.full((q + 1, 2), q) for q in ranks])
    for mode, f in both_modes(lambda x: hvd.allgather(x, process_set=ps)):
        got = f(tf.fill([r + 1, 2], r))
        check(
            got.shape == want.shape and np.array_equal(got, want),
            f"{label} {mode}: allgather in the set's order: {got.numpy().ravel()}",
        )
        check(f(tf.constant(float(r))).numpy().tolist() == ranks, f"{label} {mode}: 0-d allgather")
    for mode, f in both_modes(lambda x, y: hvd.grouped_allgather([x, y], process_set=ps)):
        g1, g2 = f(tf.fill([r + 1, 2], r), tf.fill([1], float(r)))
        check(
            np.array_equal(g1, want) and g2.numpy().tolist() == ranks,
            f"{label} {mode}: grouped_allgather",
        )

    root = ranks[-1]  # the job's rank of the set's last member
    for mode, f in both_modes(lambda x: hvd.broadcast(x, root, process_set=ps)):
        check_close(
            f(tf.constant([r * 10.0])),
            [root * 10.0],
            f"{label} {mode}: broadcast from the job's rank {root}",
        )
    v = tf.Variable([float(r), 1.0])
    check_close(
        hvd.broadcast_(v, ranks[0], process_set=ps),
        [ranks[0], 1.0],
        f"{label}: broadcast_ returns the value",
    )
    check_close(v, [ranks[0], 1.0], f"{label}: broadcast_ assigns")
    u, w = tf.Variable(float(r)), tf.Variable([r, r], dtype=tf.int64)
    hvd.broadcast_variables([u, w], root, process_set=ps)
    check(float(u) == root and w.numpy().tolist() == [root, root], f"{label}: broadcast_variables")

    # alltoall: j + 1 rows to the set's j-th rank, each row (sender, receiver's place).
    send = np.concatenate([np.array([[r, j]] * (j + 1), np.float32) for j in range(k)])
    got_rows = np.concatenate([np.array([[q, me]] * (me + 1), np.float32) for q in ranks])
    for mode, f in both_modes(lambda x, s: hvd.alltoall(x, splits=s, process_set=ps)):
        out, received = f(tf.constant(send), tf.constant(list(range(1, k + 1))))
        check(
            received.numpy().tolist() == [me + 1] * k,
            f"{label} {mode}: alltoall received splits {received.numpy().tolist()}",
        )
        check_close(out, got_rows, f"{label} {mode}: alltoall rows")
    for mode, f in both_modes(lambda x: hvd.alltoall(x, process_set=ps)):
        check_close(
            f(tf.constant(np.arange(k) + 100.0 * r)),
            [100.0 * q + me for q in ranks],
            f"{label} {mode}: alltoall with equal splits over the set's size",
        )

    # k + 1 rows: the set's first rank gets two, the others one.
    mine_rows = 2 if me == 0 else 1
    for mode, f in both_modes(lambda x, op: hvd.reducescatter(x, op=op, process_set=ps)):
        x = tf.ones([k + 1, 2]) * (r + 1.0)
        check_close(
            f(x, hvd.Sum),
            np.full((mine_rows, 2), total),
            f"{label} {mode}: reducescatter Sum, rows by the set's place",
        )
        check_close(
            f(x, hvd.Average),
            np.full((mine_rows, 2), total / k),
            f"{label} {mode}: reducescatter Average",
        )
    p1, p2 = hvd.grouped_reducescatter(
        [tf.ones([k]) * (r + 1.0), tf.ones([k, 3])], op=hvd.Sum, process_set=ps
    )
    check_close(p1, [total], f"{label}: grouped_reducescatter")
    check_close(p2, np.full((1, 3), k), f"{label}: grouped_reducescatter 2")

    # tf.IndexedSlices: values and indices gathered over the set; Average by its size.
    slices = tf.IndexedSlices(tf.constant([[r + 1.0]]), tf.constant([r]), tf.constant([8, 1]))
    got = hvd.allreduce(slices, process_set=ps)
    check(got.indices.numpy().tolist() == ranks, f"{label}: IndexedSlices indices")
    check_close(got.values, [[(q + 1) / k] for q in ranks], f"{label}: IndexedSlices Average")

    # A tf.compat.v1 graph run by a session: a reduction and a broadcast of variables on the set.
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1.Variable([float(r)], use_resource=True)
        summed = hvd.allreduce(tf.constant([r + 1.0]), op=hvd.Sum, process_set=ps)
        bcast = hvd.broadcast_variables([v1], root, process_set=ps)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            check_close(session.run(summed), [total], f"{label}: allreduce in a TF1 session")
            session.run(bcast)
            check_close(session.run(v1), [root], f"{label}: broadcast_variables in a session")

    hvd.barrier(process_set=ps)
    tf.function(lambda: hvd.barrier(process_set=ps))()
    check(
        hvd.allgather_object(r * 3, process_set=ps) == [q * 3 for q in ranks],
        f"{label}: allgather_object",
    )
    check(
        hvd.broadcast_object({"from": r}, root_rank=root, process_set=ps) == {"from": root},
        f"{label}: broadcast_object",
    )
    fn = hvd.broadcast_object_fn(root_rank=ranks[0], process_set=ps)
    check(fn([r]) == [ranks[0]], f"{label}: broadcast_object_fn")


def gradients(r, ps, label):
    """Each differentiable collective's gradient on the set, against numpy: loss on rank q is
    (q + 1) * sum(output * weight), so the output gradient on q is (q + 1) * weight."""
    ranks, k, me = ps.ranks, len(ps.ranks), ps.ranks.index(r)
    c = np.array([q + 1.0 for q in ranks])  # the output-gradient factor of each set rank
    mine = r + 1.0

    def grad_of(forward, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = forward(x)
            if isinstance(out, (tuple, list)):
                out = out[0]
            loss = mine * tf.reduce_sum(
                out * tf.reshape(tf.range(tf.size(out), dtype=out.dtype), tf.shape(out))
            )
        return tape.gradient(loss, x)

    for mode in ("eager", "graph"):

        def run(forward, x):
            return (grad_of if mode == "eager" else tf.function(grad_of))(forward, x)

        # allreduce: the same allreduce of the output gradients (op and set).
        x = tf.constant([1.0, 1.0, 1.0])
        weight = np.arange(3.0)
        check_close(
            run(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps), x),
            c.sum() * weight,
            f"{label} {mode}: allreduce Sum gradient",
        )
        check_close(
            run(lambda t: hvd.allreduce(t, process_set=ps), x),
            c.mean() * weight,
            f"{label} {mode}: allreduce Average gradient over the set",
        )

        def grouped(t):
            g1, g2 = hvd.grouped_allreduce([t, tf.concat([t, t], 0)], op=hvd.Sum, process_set=ps)
            return tf.concat([g1, g2], 0)

        check_close(
            run(grouped, tf.constant([1.0])),
            [c.sum() * (1 + 2)],
            f"{label} {mode}: grouped_allreduce gradient (weights 0, 1, 2)",
        )

        # allgather: this rank's rows (offset by the set's earlier ranks) of the averaged grad.
        rows = np.array([q + 1 for q in ranks])
        gathered_weight = np.arange(rows.sum() * 2, dtype=np.float64).reshape(-1, 2)
        offset = rows[:me].sum()
        check_close(
            run(lambda t: hvd.allgather(t, process_set=ps), tf.ones([r + 1, 2])),
            c.mean() * gathered_weight[offset : offset + r + 1],
            f"{label} {mode}: allgather gradient, rows at the set's offset",
        )
        check_close(
            run(lambda t: hvd.grouped_allgather([t], process_set=ps)[0], tf.ones([r + 1, 2])),
            c.mean() * gathered_weight[offset : offset + r + 1],
            f"{label} {mode}: grouped_allgather gradient",
        )

        # broadcast: the root (a job rank) gets the averaged gradient, the others zeros.
        root = ranks[-1]
        want = c.mean() * np.arange(2.0) if r == root else np.zeros(2)
        check_close(
            run(lambda t: hvd.broadcast(t, root, process_set=ps), tf.ones([2])),
            want,
            f"{label} {mode}: broadcast gradient",
        )

        # reducescatter: the allgather of the output gradients, times the set's size for Sum.
        part_rows = [2 if j == 0 else 1 for j in range(k)]
        pieces = [c[j] * np.arange(part_rows[j] * 2.0).reshape(-1, 2) for j in range(k)]
        gathered = np.concatenate(pieces)
        x = tf.ones([k + 1, 2])
        check_close(
            run(lambda t: hvd.reducescatter(t, op=hvd.Sum, process_set=ps), x),
            k * gathered,
            f"{label} {mode}: reducescatter Sum gradient (x set size)",
        )
        check_close(
            run(lambda t: hvd.reducescatter(t, op=hvd.Average, process_set=ps), x),
            gathered,
            f"{label} {mode}: reducescatter Average gradient",
        )
        check_close(
            run(lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum, process_set=ps)[0], x),
            k * gathered,
            f"{label} {mode}: grouped_reducescatter gradient",
        )

        # alltoall: each received row's gradient goes back to its sender. Rank r sends j + 1
        # rows to the set's j-th rank, which places them at row offset sum(q's rows before r).
        send = tf.ones([k * (k + 1) // 2, 1])
        splits = tf.constant(list(range(1, k + 1)))
        want = []
        for j, dest in enumerate(ranks):
            start = me * (j + 1)  # rows from the senders before r, j + 1 each
            want += [(dest + 1.0) * (start + i) for i in range(j + 1)]
        check_close(
            run(lambda t: hvd.alltoall(t, splits=splits, process_set=ps), send),
            np.array(want).reshape(-1, 1),
            f"{label} {mode}: alltoall gradient",
        )


def outside_the_set(r, n):
    """A rank that is not in a set is refused at once, eagerly and in a graph, by every
    collective; bad process_set arguments are refused on every rank."""
    for label, ps in (("A", A), ("B", B)):
        if r in ps.ranks:
            continue
        what = f"rank {r} is not in process set {ps.process_set_id}"
        calls = {
            "allreduce": lambda: hvd.allreduce(tf.ones(2), process_set=ps),
            "grouped_allreduce": lambda: hvd.grouped_allreduce([tf.ones(2)], process_set=ps),
            "allgather": lambda: hvd.allgather(tf.ones(2), process_set=ps),
            "broadcast": lambda: hvd.broadcast(tf.ones(2), ps.ranks[0], process_set=ps),
            "broadcast_variables": lambda: hvd.broadcast_variables(
                [tf.Variable(1.0)], ps.ranks[0], process_set=ps
            ),
            "alltoall": lambda: hvd.alltoall(tf.ones([len(ps.ranks)]), process_set=ps),
            "reducescatter": lambda: hvd.reducescatter(tf.ones([4]), process_set=ps),
            "barrier": lambda: hvd.barrier(process_set=ps),
            "allgather_object": lambda: hvd.allgather_object(1, process_set=ps),
        }
        for name, call in calls.items():
            expect_error(
                tf.errors.InvalidArgumentError,
                call,
                what,
                what=f"{name} on set {label} from rank {r}, outside it",
            )
        expect_error(
            tf.errors.InvalidArgumentError,
            lambda: tf.function(lambda: hvd.allreduce(tf.ones(2), process_set=ps))(),
            what,
            what=f"allreduce in a tf.function on set {label} from rank {r}",
        )
        with tf.GradientTape() as tape:
            v = tf.Variable(1.0)
            loss = v * 2.0
        tape = hvd.DistributedGradientTape(tape, process_set=ps)
        expect_error(
            tf.errors.InvalidArgumentError,
            lambda: tape.gradient(loss, [v]),
            what,
            what=f"DistributedGradientTape on set {label} from rank {r}",
        )
    # A root outside the set, a non-ProcessSet, a set that is not registered: every rank.
    member_of = A if r in A.ranks else B
    outsider = next(q for q in range(n) if q not in member_of.ranks)
    expect_error(
        tf.errors.InvalidArgumentError,
        lambda: hvd.broadcast(tf.ones(1), outsider, process_set=member_of),
        f"root rank {outsider} is not in process set {member_of.process_set_id}",
        what="a root outside the set",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd.allreduce(tf.ones(2), process_set=object()),
        "must be a ProcessSet",
        what="process_set=object()",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd.allgather(tf.ones(2), process_set=so.ProcessSet([0])),
        "is not registered",
        what="an unregistered set",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=[0, 1]),
        "must be a ProcessSet",
        what="DistributedGradientTape(process_set=list)",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=object()),
        "must be a ProcessSet",
        what="Keras DistributedOptimizer(process_set=object())",
    )
    so.barrier()


def query_ops(r, n):
    """size_op and process_set_included_op take a set's id (Horovod's signature), eagerly and
    in a TF1 graph run by a session; the others take none."""
    for ps in (A, B, C):
        k = len(ps.ranks)
        check(int(hvd.size_op(process_set_id=ps.process_set_id)) == k, f"size_op of {ps.ranks}")
        check(
            int(hvd.process_set_included_op(ps.process_set_id)) == int(r in ps.ranks),
            f"process_set_included_op of {ps.ranks}",
        )
    check(int(hvd.size_op()) == n and int(hvd.process_set_included_op()) == 1, "global set")
    check(int(hvd.process_set_included_op(99)) == -3, "an unknown id: Horovod's code -3")
    expect_error(
        tf.errors.InvalidArgumentError,
        lambda: hvd.size_op(99),
        "no process set",
        what="size_op of an unknown id",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd.size_op(A),
        "integer id",
        what="size_op given the ProcessSet itself",
    )
    graph = tf.Graph()
    with graph.as_default():
        ops = [
            hvd.size_op(A.process_set_id),
            hvd.process_set_included_op(A.process_set_id),
            hvd.size_op(B.process_set_id),
            hvd.rank_op(),
        ]
        with tf.compat.v1.Session(graph=graph) as session:
            check(
                session.run(ops) == [2, int(r in A.ranks), len(B.ranks), r],
                "query ops evaluated in a session",
            )


def gradient_tape(r, ps, label):
    """DistributedGradientTape(process_set=ps): averaged over the set (dense, sparse, Sum,
    predivide, a local source divided by the set's size), eagerly and in tf.function; and the
    TF1 optimizer on the set."""
    ranks, k = ps.ranks, len(ps.ranks)
    used, local, table = tf.Variable([1.0, 2.0]), tf.Variable([1.0]), tf.Variable(tf.ones([8, 2]))
    scale = r + 1.0
    mean_scale = np.mean([q + 1.0 for q in ranks])
    ids = tf.constant([r, 7])

    def loss_fn():
        return scale * (
            tf.reduce_sum(used * used) + tf.reduce_sum(tf.gather(table, ids)) + tf.reduce_sum(local)
        )

    want_table = np.zeros([8, 2])
    for q in ranks:
        for i in (q, 7):
            want_table[i] += (q + 1.0) / k
    for mode in ("eager", "graph"):

        def step(**kwargs):
            with tf.GradientTape() as tape:
                loss = loss_fn()
            tape = hvd.DistributedGradientTape(tape, process_set=ps, **kwargs)
            tape.register_local_source(local)
            return tape.gradient(loss, [used, table, local])

        f = step if mode == "eager" else tf.function(step)
        g_used, g_table, g_local = f()
        check_close(g_used, np.array([2.0, 4.0]) * mean_scale, f"{label} {mode}: tape averages")
        check(isinstance(g_table, tf.IndexedSlices), f"{label} {mode}: sparse stays sparse")
        check_close(tf.convert_to_tensor(g_table), want_table, f"{label} {mode}: sparse averaged")
        check_close(g_local, [scale / k], f"{label} {mode}: local source / the set's size")
        check_close(
            f(op=hvd.Sum)[0], np.array([2.0, 4.0]) * mean_scale * k, f"{label} {mode}: tape op=Sum"
        )
        check_close(  # (with the sparse gradient dense: IndexedSlices take no factor)
            f(gradient_predivide_factor=2.0, sparse_as_dense=True)[0],
            np.array([2.0, 4.0]) * mean_scale,
            f"{label} {mode}: tape gradient_predivide_factor",
        )
        check_close(
            tf.convert_to_tensor(f(sparse_as_dense=True)[1]),
            want_table,
            f"{label} {mode}: tape sparse_as_dense",
        )

    # A TF1 optimizer (eagerly): compute_gradients averages over the set.
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), process_set=ps)
    w = tf.Variable([1.0, 1.0])
    pairs = opt.compute_gradients(lambda: scale * tf.reduce_sum(w * w), [w])
    check_close(pairs[0][0], [2.0 * mean_scale] * 2, f"{label}: TF1 optimizer averages")
    opt.apply_gradients(pairs)
    check_close(w, [1.0 - mean_scale] * 2, f"{label}: TF1 optimizer step")


FEATURES, ROWS, STEPS, LR = 3, 4, 3, 0.1


def keras_data(r):
    rng = np.random.default_rng(100 + r)
    return (
        rng.normal(size=(ROWS, FEATURES)).astype(np.float32),
        rng.normal(size=(ROWS, 1)).astype(np.float32),
    )


def expected_weights(ranks, kernel, bias):
    """Full-batch SGD on a linear model with MSE, the gradient averaged over `ranks`."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    for _ in range(STEPS):
        gk, gb = np.zeros_like(kernel), np.zeros_like(bias)
        for q in ranks:
            x, y = keras_data(q)
            err = x @ kernel + bias - y  # (ROWS, 1)
            gk += 2 * x.T @ err / err.size / len(ranks)
            gb += 2 * err.sum(0) / err.size / len(ranks)
        kernel, bias = kernel - LR * gk, bias - LR * gb
    return kernel, bias


def keras_on_disjoint_sets(r, n):
    """model.fit with DistributedOptimizer(process_set=...) on A and, at the same time, on C
    (disjoint): each set ends with the weights of SGD on its own ranks' averaged gradients,
    the same on each of its ranks, and different between the sets."""
    ps = A if r in A.ranks else C
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    kernel0 = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32).reshape(FEATURES, 1)
    bias0 = np.array([0.5], np.float32)
    model.set_weights([kernel0, bias0])  # the same start on every rank
    model.compile(
        optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR), process_set=ps),
        loss="mse",
        jit_compile=False,
    )
    x, y = keras_data(r)
    model.fit(x, y, batch_size=ROWS, epochs=STEPS, shuffle=False, verbose=0)
    kernel, bias = model.get_weights()
    want_kernel, want_bias = expected_weights(ps.ranks, kernel0, bias0)
    check_close(kernel, want_kernel, f"Keras on {ps.ranks}: kernel", rtol=1e-5, atol=1e-6)
    check_close(bias, want_bias, f"Keras on {ps.ranks}: bias", rtol=1e-5, atol=1e-6)
    same = hvd.allgather_object([kernel.tobytes(), bias.tobytes()], process_set=ps)
    check(all(s == same[0] for s in same), f"Keras on {ps.ranks}: same weights on the set")
    everyone = hvd.allgather_object(kernel.tobytes())
    check(everyone[A.ranks[0]] != everyone[C.ranks[0]], "the two sets trained differently")

    # Mixed precision: a LossScaleOptimizer over the distributed one; the set's ranks agree on
    # the finite check (a Min allreduce on the set), so an overflow on one rank of the set
    # skips the step on every rank of it, and only there.
    lso = keras.optimizers.LossScaleOptimizer(
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps)
    )
    v = tf.Variable([1.0])
    scale = float(lso.initial_scale)
    lso.apply_gradients([(tf.constant([scale * (r + 1.0)]), v)])
    check_close(
        v,
        [1.0 - np.mean([q + 1.0 for q in ps.ranks])],
        f"Keras on {ps.ranks}: loss-scaled step averaged over the set",
    )
    overflow = r == A.ranks[0]
    lso.apply_gradients([(tf.constant([np.inf if overflow else 1.0]), v)])
    if ps is A:
        check_close(
            v,
            [1.0 - np.mean([q + 1.0 for q in A.ranks])],
            "an overflow on one rank of A skips the step on all of A",
        )
    else:
        check_close(
            v,
            [1.0 - np.mean([q + 1.0 for q in C.ranks]) - 1.0 / scale],
            "C still steps (the overflow was in A)",
        )
    so.barrier()


def join_on_a_set(r, ps, label):
    """The set's first rank runs out of data; the others reduce without it, then join."""
    if r == ps.ranks[0]:
        last = int(hvd.join(process_set=ps))
    else:
        got = hvd.allreduce(
            tf.constant([float(r + 1)]), op=hvd.Sum, name=f"join.{label}", process_set=ps
        )
        check_close(
            got.numpy(),
            [sum(q + 1 for q in ps.ranks[1:])],
            f"{label}: a joined rank contributes zeros",
        )
        last = int(hvd.join(process_set=ps))
    check(last in ps.ranks[1:], f"{label}: join returns the job's rank that joined last: {last}")


def run():
    r, n = so.rank(), so.size()
    for test in (
        on_each_set(collectives),
        on_each_set(gradients),
        outside_the_set,
        query_ops,
        on_each_set(gradient_tape),
        keras_on_disjoint_sets,
        on_each_set(join_on_a_set),
    ):
        test(r, n)


if __name__ == "__main__":
    from mpi4py import MPI

    n = MPI.COMM_WORLD.size
    A = so.ProcessSet([0, 2])
    B = so.ProcessSet(range(1, n))
    C = so.ProcessSet([q for q in range(n) if q not in (0, 2)])
    main(run, process_sets=[A, B, C])
