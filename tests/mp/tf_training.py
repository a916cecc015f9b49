"""Run by tests/test_tensorflow.py::test_gradient_tape_and_custom_loop_equals_single_process.

DistributedGradientTape on real ranks: None and IndexedSlices gradients, options, and
synchronous-SGD equivalence of a custom training loop (n ranks with batch b == one process with
batch n * b, computed on every rank as the reference)."""

import keras
import numpy as np
from _harness import check, check_close, expect_error, main_tests
from tf_common import tf  # noqa: F401  (sets TensorFlow up first)

import scaleout.tensorflow as hvd

B, STEPS, FEATURES, VOCAB = 4, 5, 6, 12


def test_tape_options(r, n):
    used, unused = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    table = tf.Variable(tf.ones([VOCAB, 2]))
    ids = tf.constant([r % VOCAB, 7])
    scale = float(r + 1)
    mean_scale = (n + 1) / 2

    def loss_fn():
        return scale * (tf.reduce_sum(used * used) + tf.reduce_sum(tf.gather(table, ids)))

    for mode in ("eager", "graph"):

        def step(**kwargs):
            with tf.GradientTape() as tape:
                loss = loss_fn()
            tape = hvd.DistributedGradientTape(tape, **kwargs)
            return tape.gradient(loss, {"used": used, "unused": unused, "table": table})

        f = step if mode == "eager" else tf.function(step)
        g = f()
        check(
            set(g) == {"used", "unused", "table"} and g["unused"] is None,
            f"{mode}: structure kept, None gradient stays None",
        )
        check_close(
            g["used"], np.array([2.0, 4.0]) * mean_scale, f"{mode}: dense gradient averaged"
        )
        check(
            isinstance(g["table"], tf.IndexedSlices), f"{mode}: sparse gradient stays IndexedSlices"
        )
        want_table = np.zeros([VOCAB, 2])
        for k in range(n):
            for i in (k % VOCAB, 7):
                want_table[i] += (k + 1) / n
        check_close(
            tf.convert_to_tensor(g["table"]), want_table, f"{mode}: sparse gradient averaged"
        )
        dense = f(sparse_as_dense=True)["table"]
        check(isinstance(dense, tf.Tensor), f"{mode}: sparse_as_dense gives a dense gradient")
        check_close(dense, want_table, f"{mode}: sparse_as_dense value")
        check_close(f(op=hvd.Sum)["used"], np.array([2.0, 4.0]) * n * mean_scale, f"{mode}: op=Sum")
        # As Horovod: a predivide factor is refused where a gradient is sparse (its
        # IndexedSlices take no scale factors), and works on the same gradient made dense.
        expect_error(
            NotImplementedError,
            lambda: f(gradient_predivide_factor=2.0),
            "sparse gradient of",
            "Pre/postscale_factor are not supported with tf.IndexedSlices",
            what=f"{mode}: gradient_predivide_factor with a sparse gradient",
        )
        check_close(
            f(gradient_predivide_factor=2.0, sparse_as_dense=True)["used"],
            np.array([2.0, 4.0]) * mean_scale,
            f"{mode}: gradient_predivide_factor",
        )
        check_close(
            f(compression=hvd.Compression.fp16)["used"],
            np.array([2.0, 4.0]) * mean_scale,
            f"{mode}: fp16 compression",
            rtol=1e-3,
        )
    # unconnected gradients as zeros are reduced too; the tape works as a context manager
    with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = loss_fn()
    g = tape.gradient(loss, [used, unused], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    check_close(g[1], [0.0], "unconnected gradient as zeros")
    check_close(tape.gradient(loss, used), np.array([2.0, 4.0]) * mean_scale, "persistent: again")
    expect_error(
        TypeError,
        lambda: hvd.DistributedGradientTape(object()),
        "GradientTape",
        what="wrapping something else",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.DistributedGradientTape(
            tf.GradientTape(), op=hvd.Max, gradient_predivide_factor=2.0
        ),
        "predivide",
        what="predivide needs Average",
    )


def make_model(seed):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((2,), dtype="int32")
    dense_in = keras.Input((FEATURES,))
    emb = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 3)(tokens))
    h = keras.layers.Dense(16, activation="tanh")(keras.layers.Concatenate()([emb, dense_in]))
    return keras.Model([tokens, dense_in], keras.layers.Dense(3)(h))


def data(n):
    rng = np.random.default_rng(7)
    rows = STEPS * n * B
    return (
        rng.integers(0, VOCAB, (rows, 2)).astype(np.int32),
        rng.normal(size=(rows, FEATURES)).astype(np.float32),
        rng.integers(0, 3, rows).astype(np.int32),
    )


def test_custom_loop_equivalence(r, n):
    tokens, feats, labels = data(n)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train(model, optimizer, batches, distributed):
        @tf.function
        def step(t, x, y):
            with tf.GradientTape() as tape:
                loss = loss_obj(y, model([t, x], training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for t, x, y in batches:
            step(t, x, y)

    model = make_model(seed=r)  # a different start on every rank...
    hvd.broadcast_variables(model.variables, root_rank=0)  # ...until rank 0's is broadcast
    reference = make_model(seed=0)
    reference.set_weights(model.get_weights())
    initial = model.get_weights()

    mine = [slice((i * n + r) * B, (i * n + r + 1) * B) for i in range(STEPS)]
    train(
        model,
        keras.optimizers.SGD(0.1, momentum=0.9),
        [(tokens[s], feats[s], labels[s]) for s in mine],
        distributed=True,
    )
    full = [slice(i * n * B, (i + 1) * n * B) for i in range(STEPS)]
    train(
        reference,
        keras.optimizers.SGD(0.1, momentum=0.9),
        [(tokens[s], feats[s], labels[s]) for s in full],
        distributed=False,
    )
    for i, (got, want) in enumerate(zip(model.get_weights(), reference.get_weights())):
        check_close(
            got, want, f"custom loop weight {i} equals the single-process run", rtol=1e-5, atol=1e-6
        )
    check(
        all(np.abs(w - w0).max() > 1e-3 for w, w0 in zip(model.get_weights(), initial)),
        "training moved every weight",
    )
    weights = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    check(all(w == weights[0] for w in weights), "every rank holds the same weights, bit for bit")


if __name__ == "__main__":
    main_tests(globals())
