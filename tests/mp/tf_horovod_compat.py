"""Run by tests/test_tensorflow_horovod.py::test_tensorflow_behaves_as_horovods.

scaleout.tensorflow behaves as Horovod 0.28.1's horovod.tensorflow, checked as its users
would: the tf.errors classes their except clauses name (eagerly, in tf.function and in a TF1
session), TF1 graphs with many collectives in one session.run, the TF1 DistributedOptimizer and
BroadcastGlobalVariablesHook, broadcast_ and broadcast_variables(inplace), grouped allgather and
reducescatter, local sources and the tape's options, SyncBatchNormalization, the *_op queries,
and Horovod's arguments (device_*, ignore_name_scope, process_set, objects' session)."""

import warnings

import keras
import numpy as np
from _harness import check, check_close, expect_error, main_tests
from tf_common import so, tf

import scaleout.tensorflow as hvd
import scaleout.tensorflow.keras as hvd_keras


def both_modes(fn):
    return [("eager", fn), ("tf.function", tf.function(fn))]


def test_errors_are_the_tf_errors_horovod_raises(r, n):
    for mode, f in both_modes(lambda x: hvd.allreduce(x, name="mismatch")):
        x = tf.ones([2 + (r == n - 1)])
        expect_error(
            tf.errors.FailedPreconditionError,
            lambda: f(x),
            "mismatch",
            what=f"{mode}: a shape mismatch is a FailedPreconditionError",
        )
        try:
            f(x)
        except tf.errors.FailedPreconditionError as e:
            check(
                isinstance(e, hvd.MismatchError) and isinstance(e, RuntimeError),
                f"{mode}: ... and a scaleout MismatchError ({type(e).__mro__})",
            )
    for mode, f in both_modes(lambda x: hvd.allreduce(x)):
        expect_error(
            tf.errors.InvalidArgumentError,
            lambda: f(tf.ones(2, tf.complex64)),
            "complex64",
            what=f"{mode}: an unsupported dtype is an InvalidArgumentError",
        )
    # Each rank's own name stays in flight until every rank has submitted every name, which they
    # do only after the barrier, so the second submission below is a duplicate on every rank,
    # whatever the timing.
    pending = so.allreduce_async(np.ones(2), name=f"in.flight.{r}")
    expect_error(
        tf.errors.InvalidArgumentError,
        lambda: hvd.allreduce(tf.ones(2), name=f"in.flight.{r}"),
        "in.flight",
        what="a name already in flight is an InvalidArgumentError",
    )
    so.barrier()
    others = [so.allreduce_async(np.ones(2), name=f"in.flight.{k}") for k in range(n) if k != r]
    for h in [pending, *others]:
        so.synchronize(h)
    try:
        hvd.allreduce(tf.ones(2), name="x", device_dense="/gpu:0")
    except Exception as e:  # noqa: BLE001
        check(
            isinstance(e, tf.errors.InvalidArgumentError) and "GPU" in str(e),
            f"device_dense='/gpu:0' is an InvalidArgumentError naming GPUs: {e!r}",
        )
    else:
        check(False, "device_dense='/gpu:0' raised nothing")
    check_close(
        hvd.allreduce(tf.ones(2), device_dense="/cpu:0", op=hvd.Sum),
        [n, n],
        "device_dense='/cpu:0' is accepted",
    )
    check(issubclass(hvd.HorovodInternalError, RuntimeError), "HorovodInternalError exists")
    # process_set= takes a registered ProcessSet (tests/mp/tf_process_sets.py uses real ones).
    expect_error(
        tf.errors.InvalidArgumentError,
        lambda: hvd.allreduce(tf.ones(2), process_set=object()),
        "must be a ProcessSet",
        what="process_set=object()",
    )
    check(
        all(
            hasattr(hvd.elastic, name)
            for name in ("run", "TensorFlowKerasState", "TensorFlowState", "ObjectState")
        )
        and all(
            hasattr(hvd_keras.elastic, name)
            for name in (
                "run",
                "KerasState",
                "CommitStateCallback",
                "UpdateBatchStateCallback",
                "UpdateEpochStateCallback",
            )
        ),
        "hvd.elastic has Horovod's names",
    )


def graph_collectives(r, n):
    """Many collectives of mixed kinds and dtypes, every rank building them in the same order."""
    outs, wants = [], []
    for i in range(6):
        outs.append(hvd.allreduce(tf.fill([3 + i], float(r + i)), op=hvd.Sum, name=f"v1.ar{i}"))
        wants.append(np.full(3 + i, sum(k + i for k in range(n)), np.float32))
        outs.append(hvd.allgather(tf.fill([r + 1, 2], np.int32(r)), name=f"v1.ag{i}"))
        wants.append(np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)]))
        outs.append(hvd.broadcast(tf.fill([2], tf.cast(r, tf.float64)), i % n, name=f"v1.bc{i}"))
        wants.append(np.full(2, float(i % n)))
        outs.append(hvd.alltoall(tf.range(n, dtype=tf.int64) + 10 * r, name=f"v1.a2a{i}"))
        wants.append(np.array([10 * k + r for k in range(n)], np.int64))
    return outs, wants


def test_tf1_session_runs_many_collectives_at_once(r, n):
    # Several blocking collectives evaluated by one session.run: every rank runs them in
    # construction order (Note [TF1 graph order]), so none waits for one the others have not
    # started, whatever order the executor's threads pick.
    graph = tf.Graph()
    with graph.as_default():
        outs, wants = graph_collectives(r, n)
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            for attempt in range(3):
                got = session.run(outs)
                for i, (g, w) in enumerate(zip(got, wants)):
                    check(
                        g.dtype == w.dtype and np.array_equal(g, w),
                        f"session.run {attempt}: output {i} {g} != {w}",
                    )
            bad = hvd.allreduce(tf.ones([2 + (r == 0)]), name="v1.mismatch")
            expect_error(
                tf.errors.FailedPreconditionError,
                lambda: session.run(bad),
                "v1.mismatch",
                what="TF1 session: a mismatch is FailedPreconditionError",
            )
            check(np.array_equal(session.run(outs[0]), wants[0]), "the session works after it")


def test_tf1_distributed_optimizer_and_hook(r, n):
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(r), 1.0]))
        loss = tf.reduce_sum(w * float(r + 1))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        check(isinstance(opt, tf.compat.v1.train.Optimizer), "a TF1 optimizer stays a TF1 one")
        train = opt.minimize(loss)
        hook = hvd.BroadcastGlobalVariablesHook(0)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            check_close(session.run(w), [0.0, 1.0], "the hook broadcast root's variables")
            session.run(train)
            check_close(
                session.run(w),
                [0.0 - (n + 1) / 2, 1.0 - (n + 1) / 2],
                "minimize() applied the averaged gradient",
            )
    graph = tf.Graph()  # the monitored session finalized the first one
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(r), 1.0]))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(hvd.broadcast_global_variables(n - 1))
            check_close(session.run(w), [float(n - 1), 1.0], "broadcast_global_variables")
    expect_error(
        RuntimeError,
        lambda: hvd.broadcast_global_variables(0),
        "eager",
        what="broadcast_global_variables eagerly (Horovod: RuntimeError)",
    )
    keras_opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    check(
        isinstance(keras_opt, keras.optimizers.SGD) and hvd_keras.is_distributed(keras_opt),
        "a Keras optimizer gets the Keras wrapper",
    )
    v = tf.Variable([0.0])
    keras_opt.apply_gradients([(tf.constant([float(r)]), v)])
    check_close(v, [-(n - 1) / 2], "the Keras wrapper averages")
    expect_error(
        ValueError, lambda: hvd.DistributedOptimizer(object()), "optimizer", what="not an optimizer"
    )


def test_tf1_backward_passes_per_step(r, n):
    mean = (n + 1) / 2  # the average over ranks of the gradient r + 1
    for average in (False, True):
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.get_variable("w", initializer=tf.constant([0.0]))
            step = tf.compat.v1.train.get_or_create_global_step()
            loss = tf.reduce_sum(w * float(r + 1))
            opt = hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(1.0),
                backward_passes_per_step=2,
                average_aggregated_gradients=average,
            )
            train = opt.minimize(loss, global_step=step)
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(
                    [
                        tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.local_variables_initializer(),
                    ]
                )
                session.run(train)
                check_close(session.run(w), [0.0], f"average={average}: no update after 1 pass")
                check(session.run(step) == 1, "global_step counts the pass")
                session.run(train)
                want = -mean * (1 if average else 2)
                check_close(
                    session.run(w),
                    [want],
                    f"average={average}: one update of the "
                    f"{'mean' if average else 'sum'} of 2 passes, averaged over ranks",
                )
                session.run(train)
                session.run(train)
                check_close(session.run(w), [2 * want], f"average={average}: after 4 passes")
                check(session.run(step) == 4, "global_step == passes")
    # eagerly, a TF1 optimizer aggregates too
    v = tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2
    )
    loss = lambda: tf.reduce_sum(v * float(r + 1))  # noqa: E731
    opt.minimize(loss, var_list=[v])
    check_close(v, [0.0], "eager: no update after 1 pass")
    opt.minimize(loss, var_list=[v])
    check_close(v, [-2 * mean], "eager: update after 2 passes")


def test_broadcast_in_place(r, n):
    a, b = tf.Variable(tf.fill([3], float(r))), tf.Variable(tf.fill([2], r + 10))
    values = hvd.broadcast_([a, b], root_rank=n - 1)
    check(
        a.numpy().tolist() == [n - 1.0] * 3 and b.numpy().tolist() == [n + 9] * 2,
        "broadcast_ assigns in place",
    )
    check(
        len(values) == 2 and values[0].numpy().tolist() == [n - 1.0] * 3,
        "broadcast_ returns the new values",
    )
    single = tf.Variable([float(r)])
    check(hvd.broadcast_(single, 0).numpy().tolist() == [0.0], "broadcast_ of one variable")
    c = tf.Variable(tf.fill([2], float(r)))
    out = hvd.broadcast_variables([c], root_rank=0, inplace=True)
    check(
        c.numpy().tolist() == [0.0, 0.0] and out[0].numpy().tolist() == [0.0, 0.0],
        "broadcast_variables(inplace=True)",
    )
    check(hvd.broadcast_variables([c], 0) is None, "broadcast_variables eagerly returns None")
    expect_error(
        ValueError,
        lambda: hvd.broadcast_([tf.constant(1.0)], 0),
        "tf.Variable",
        what="broadcast_ of a tensor",
    )


def test_grouped_allgather_and_reducescatter(r, n):
    for mode, f in both_modes(lambda a, b: hvd.grouped_allgather([a, b])):
        a, b = f(tf.fill([r + 1], r), tf.fill([1, 2], float(r)))
        check(
            a.numpy().tolist() == sum(([k] * (k + 1) for k in range(n)), []),
            f"{mode}: grouped_allgather first",
        )
        check(
            b.numpy().tolist() == [[float(k)] * 2 for k in range(n)],
            f"{mode}: grouped_allgather second",
        )
    for mode, f in both_modes(lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum)):
        a, b = f(tf.fill([n, 2], float(r)), tf.fill([2 * n], r))
        check_close(a, np.full((1, 2), n * (n - 1) / 2), f"{mode}: grouped_reducescatter first")
        check(b.numpy().tolist() == [n * (n - 1) // 2] * 2, f"{mode}: grouped_reducescatter int")
    check(hvd.grouped_allgather([]) == [] and hvd.grouped_reducescatter([]) == [], "empty lists")


def test_local_sources_and_tape_options(r, n):
    shared = tf.Variable([1.0], name="shared")
    local = tf.Variable([1.0], name="local")
    with tf.GradientTape() as tape:
        loss = float(r + 1) * (shared[0] + local[0])
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    check_close(g_shared, [(n + 1) / 2], "a shared source's gradient is averaged")
    check_close(
        g_local,
        [(r + 1) / n],
        "a local source's gradient is own / size (scale_local_gradients, Horovod's default)",
    )

    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    other = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    x = tf.constant([[float(r + 1)]])
    with tf.GradientTape(persistent=True) as tape:
        y = tf.reduce_sum(layer(x) + other(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=layer, scale_local_gradients=False)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(y, [layer.kernel, other.kernel])
    check(len(local_pairs) == 1 and local_pairs[0][0] is layer.kernel, "local pairs")
    check_close(local_pairs[0][1], [[float(r + 1)]], "local layer: own gradient, unscaled")
    check_close(global_pairs[0][1], [[(n + 1) / 2]], "other layer: averaged gradient")
    expect_error(
        ValueError,
        lambda: hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=["x"]),
        "layers",
        what="local_layers of non-layers",
    )

    # use_generic_names: ranks whose variables are named differently still agree
    v = tf.Variable([1.0], name=f"rank{r}_weight")
    with tf.GradientTape() as tape:
        loss = float(r) * v[0]
    grads = hvd.DistributedGradientTape(tape).gradient(loss, [v], use_generic_names=True)
    check_close(grads[0], [(n - 1) / 2], "use_generic_names=True")

    expect_error(
        ValueError,
        lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=-1),
        "groups",
        what="groups=-1",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.DistributedGradientTape(tf.GradientTape(), num_groups=2)
    check(
        any(issubclass(w.category, DeprecationWarning) for w in caught),
        "num_groups is deprecated, as in Horovod",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedGradientTape(
            tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0
        ),
        "op",
        what="gradient_predivide_factor with op Sum",
    )


def test_ignore_name_scope(r, n):
    @tf.function
    def scoped(x):
        with tf.name_scope(f"rank_{r}_scope"):  # a different scope on every rank
            return hvd.allreduce(x, op=hvd.Sum, name="scoped.sum", ignore_name_scope=True)

    check_close(scoped(tf.ones(2)), [n, n], "ignore_name_scope=True: ranks agree on the name")


def test_sync_batch_normalization(r, n):
    rows = [k + 2 for k in range(n)]  # ranks hold batches of different sizes
    rng = np.random.default_rng(0)
    everyone = [rng.normal(loc=k, size=(rows[k], 3)).astype(np.float32) for k in range(n)]
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    out = layer(everyone[r], training=True)
    full = np.concatenate(everyone)
    mean, var = full.mean(0), full.var(0)
    check_close(
        out,
        (everyone[r] - mean) / np.sqrt(var + layer.epsilon),
        "training output is normalized with the global batch's statistics",
        rtol=1e-4,
        atol=1e-4,
    )
    check_close(layer.moving_mean, 0.5 * mean, "moving mean from the global mean", rtol=1e-4)
    check_close(
        layer.moving_variance, 0.5 + 0.5 * var, "moving variance from the global one", rtol=1e-4
    )
    check(layer.name.startswith("sync_batch_normalization"), f"Horovod's name: {layer.name}")
    expect_error(
        ValueError, lambda: hvd.SyncBatchNormalization(fused=True), "fused", what="fused=True"
    )
    x = tf.constant(everyone[r])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(layer(x, training=True) * tf.range(1.0, 4.0))
    g = tape.gradient(y, x)
    check(g is not None and g.shape == x.shape, "gradients flow through the allreduce")


def test_query_ops(r, n):
    check(int(hvd.size_op()) == n and int(hvd.rank_op()) == r, "size_op/rank_op eagerly")
    check(int(hvd.local_rank_op()) == hvd.local_rank(), "local_rank_op is the local rank")
    check(int(hvd.local_size_op()) == hvd.local_size(), "local_size_op")
    check(int(hvd.process_set_included_op()) == 1, "process_set_included_op")
    graph = tf.Graph()
    with graph.as_default():
        ops = [hvd.size_op(), hvd.rank_op(), hvd.local_rank_op(), hvd.local_size_op()]
        with tf.compat.v1.Session(graph=graph) as session:
            check(
                session.run(ops) == [n, r, hvd.local_rank(), hvd.local_size()],
                "the ops evaluated in a session",
            )


def test_object_helpers_take_horovods_arguments(r, n):
    check(
        hvd.broadcast_object({"r": r}, 0, None, "obj.bcast") == {"r": 0},
        "broadcast_object(obj, root_rank, session, name)",
    )
    check(hvd.broadcast_object_fn(root_rank=n - 1)(r) == n - 1, "broadcast_object_fn")
    check(
        hvd.allgather_object(r, None, "obj.gather") == list(range(n)),
        "allgather_object(obj, session, name)",
    )


def test_uint16_in_every_collective(r, n):
    for mode, f in both_modes(
        lambda x: (
            hvd.allreduce(x, op=hvd.Sum),
            hvd.allgather(x),
            hvd.broadcast(x, 0),
            hvd.alltoall(x),
            hvd.reducescatter(x, op=hvd.Sum),
        )
    ):
        x = tf.fill([n], tf.cast(r + 1, tf.uint16))
        summed, gathered, broadcast, exchanged, scattered = f(x)
        check(
            all(t.dtype == tf.uint16 for t in (summed, gathered, broadcast, exchanged, scattered)),
            f"{mode}: uint16 stays uint16",
        )
        total = n * (n + 1) // 2
        check(
            summed.numpy().tolist() == [total] * n
            and scattered.numpy().tolist() == [total]
            and broadcast.numpy().tolist() == [1] * n
            and exchanged.numpy().tolist() == [k + 1 for k in range(n)]
            and gathered.numpy().tolist() == sum(([k + 1] * n for k in range(n)), []),
            f"{mode}: uint16 values",
        )


def test_allgather_and_broadcast_after_a_join_are_precondition_errors(r, n):
    if r == n - 1:
        hvd.join()
        return
    for mode, f in both_modes(lambda x: hvd.allgather(x, name="after.join.gather")):
        expect_error(
            tf.errors.FailedPreconditionError,
            lambda: f(tf.ones([1, 2])),
            "not supported with join()",
            what=f"{mode}: allgather after a join",
        )
    expect_error(
        tf.errors.FailedPreconditionError,
        lambda: hvd.broadcast(tf.ones(2), 0, name="after.join.bcast"),
        "joined",
        what="broadcast after a join",
    )
    check_close(
        hvd.allreduce(tf.ones(2), op=hvd.Sum, name="after.join.sum"),
        [n - 1] * 2,
        "allreduce still runs (the joined rank contributes zeros)",
    )
    hvd.join()


if __name__ == "__main__":
    main_tests(globals())
