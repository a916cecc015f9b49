"""Run by tests/test_topk.py::test_tensorflow_tape_and_keras.

Compression.topk with TensorFlow (Note [Top-k sparsification]): DistributedGradientTape in a
tf.function gives the mean of every rank's top-k, keeping its residuals in the TopK object across
tapes; the Keras DistributedOptimizer with momentum correction and every step dense is momentum
SGD itself, its residuals and velocities are optimizer variables (broadcast by the callback,
saved and loaded with the model); sparse model.fit keeps ranks identical; errors.

argv[1]: a directory shared by the ranks, for the saved model."""

import os
import sys

import keras
import numpy as np
from _harness import check, check_close, expect_error, main
from tf_common import so, tf

import scaleout.tensorflow as hvd
import scaleout.tensorflow.keras as hk


def make_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(10, activation="tanh"), keras.layers.Dense(3)]
    )


def data(seed, rows=32):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(rows, 6)).astype(np.float32),
        rng.integers(0, 3, rows).astype(np.int32),
    )


def everyone(x):
    return hvd.allgather(tf.reshape(tf.convert_to_tensor(x), [1, -1])).numpy()


def top(x, k):
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def loss_of(model, x, y):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
    )


def run():
    r, n = so.rank(), so.size()
    # 1. The tape: the mean of every rank's top-k of gradient + residual, over two tapes.
    model = make_model()
    compression = hvd.Compression.topk(0.2)

    @tf.function
    def reduced(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        local = tape.gradient(loss, model.trainable_variables)
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        return local, tape.gradient(loss, model.trainable_variables)

    residuals = [np.zeros(int(np.prod(v.shape)), np.float32) for v in model.trainable_variables]
    for step in range(2):
        local, got = reduced(*data(10 * r + step))
        for i, (g, out) in enumerate(zip(local, got)):
            acc = residuals[i] + g.numpy().reshape(-1)
            k = int(np.ceil(0.2 * acc.size))
            check_close(
                out.numpy().reshape(-1),
                sum(top(a, k) for a in everyone(acc)) / n,
                f"tape step {step} gradient {i}: mean of the top-k",
                rtol=1e-5,
            )
            residuals[i] = acc - top(acc, k)
    check(int(compression.tf_state.step.numpy()) == 2, "the tape's state counts two steps")

    # 2. Keras: momentum correction, every step dense, is momentum SGD (the plain optimizer).
    x, y = data(100 + r, rows=24)
    trained = []
    for compress in (
        hk.Compression.none,
        hk.Compression.topk(0.01, momentum_correction=True, warmup_steps=1000),
    ):
        model = make_model()
        opt = hk.DistributedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9), compression=compress
        )
        model.compile(
            optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        trained.append(model.get_weights())
    for a, b in zip(*trained):
        check_close(b, a, "Keras: momentum moved into the compression", rtol=1e-5, atol=1e-6)

    # 3. Sparse model.fit: ranks stay identical; the state is optimizer variables, broadcast by
    #    the callback, saved with the model and loaded back by load_model.
    model = make_model(seed=r)  # different on each rank until the callback broadcasts
    opt = hk.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9),
        compression=hk.Compression.topk(0.1, momentum_correction=True),
    )
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    for w in model.get_weights():
        rows = everyone(w)
        check(all(np.array_equal(rows[0], row) for row in rows), "fit: the same model everywhere")
    names = [v.name for v in opt.variables]
    residual_vars = [v for v in opt.variables if "topk_residual" in v.name]
    check(
        len(residual_vars) == 4 and sum("topk_velocity" in s for s in names) == 4,
        f"residuals and velocities are optimizer variables: {names}",
    )
    check(any(np.abs(v.numpy()).sum() > 0 for v in residual_vars), "residuals hold something")
    # the callback broadcast the model and the optimizer's slots, not the per-rank residuals
    rows = everyone(residual_vars[0].numpy())
    check(
        n == 1 or not all(np.array_equal(rows[0], row) for row in rows),
        "each rank keeps its own residual",
    )
    path = os.path.join(sys.argv[1], "topk.keras")
    if r == 0:
        model.save(path)
    hvd.barrier()
    # Training resumed from the file goes exactly as training that never stopped (whose
    # optimizer state is made rank 0's, as the file's, by broadcasting its variables): the
    # residuals and velocities came back with the model.
    hvd.broadcast_variables(opt.variables, root_rank=0)
    loaded = hk.load_model(path, compression=hk.Compression.topk(0.1, momentum_correction=True))
    for m in (model, loaded):
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        check_close(b, a, "resumed from the saved model == never stopped", rtol=1e-6, atol=1e-7)
    hvd.barrier()

    # 4. A TF1 optimizer in a graph run by a Session: one dense warmup step, then top-k; the
    #    step count moves after the exchange (no automatic order in a graph).
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(np.zeros(50, np.float32))
        fed = tf.compat.v1.placeholder(tf.float32, [50])
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1.0),
            compression=hvd.Compression.topk(0.1, warmup_steps=1),
        )
        ((reduced, _),) = opt.compute_gradients(tf.reduce_sum(w * fed), var_list=[w])
        init = [
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
        ]
        fed_values = [
            np.random.default_rng(10 * r + step).standard_normal(50).astype(np.float32)
            for step in range(3)
        ]
        with tf.compat.v1.Session() as session:
            session.run(init)
            results = [session.run(reduced, {fed: g}) for g in fed_values]
    residual = np.zeros(50, np.float32)
    for step, (g, got) in enumerate(zip(fed_values, results)):
        acc = everyone(residual + g)
        if step == 0:
            want = acc.mean(0)
            residual[:] = 0
        else:
            want = sum(top(a, 5) for a in acc) / n
            residual = residual + g - top(residual + g, 5)
        check_close(got, want, f"TF1 graph step {step}", rtol=1e-5, atol=1e-6)

    # 5. Errors.
    expect_error(
        ValueError,
        lambda: hvd.DistributedGradientTape(
            tf.GradientTape(), compression=hvd.Compression.topk(0.1, momentum_correction=True)
        ),
        "momentum_correction=0.9",
        what="momentum correction on a tape needs the number",
    )
    expect_error(
        ValueError,
        lambda: hk.DistributedOptimizer(
            keras.optimizers.Adam(), compression=hk.Compression.topk(0.1, momentum_correction=True)
        ),
        "keras.optimizers.SGD",
        what="momentum correction with Adam",
    )
    expect_error(
        ValueError,
        lambda: hk.DistributedOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.9),
            compression=hk.Compression.topk(0.1, momentum_correction=0.9),
        ),
        "momentum_correction=True",
        what="a number with an optimizer",
    )
    expect_error(
        ValueError,
        lambda: hvd.allreduce(tf.ones(3), compression=hvd.Compression.topk(0.1)),
        "DistributedGradientTape",
        what="top-k on a single allreduce",
    )


main(run)
