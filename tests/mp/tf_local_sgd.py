"""Run by tests/test_local_sgd.py::test_keras_local_sgd_callback (SCALEOUT_FUSION_THRESHOLD=0).

LocalSGDCallback (Note [Local SGD]) in model.fit: warm-up batches bulk-synchronous through the
DistributedOptimizer (the same weights on every rank), then local batches (the ranks apart) and
every third one a round (the same weights, BatchNormalization's moving statistics included,
equal to the ranks' average); a plain optimizer without warm-up; the errors."""

import keras
import numpy as np
from _harness import check, expect_error, main
from tf_common import so  # noqa: F401  (TensorFlow set up as the TF tests do)

import scaleout.tensorflow.keras as hvd

BATCH, WARMUP, PERIOD, LOCAL = 16, 2, 3, 6


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3),
        ]
    )


def data(batches):
    rng = np.random.default_rng(100 + hvd.rank())  # every rank its own data
    return (
        rng.normal(size=(batches * BATCH, 5)).astype(np.float32),
        rng.integers(0, 3, batches * BATCH).astype(np.int32),
    )


def flat(weights):
    return np.concatenate([np.ravel(w.numpy()) for w in weights])


class Probe(keras.callbacks.Callback):
    """After each batch (after LocalSGDCallback's): whether the trainable weights and the
    moving statistics are equal everywhere, and, at a round, the ranks' values before it."""

    def __init__(self):
        super().__init__()
        self.same, self.same_buffers = [], []

    def on_train_batch_end(self, batch, logs=None):
        trainable = hvd.allgather_object(flat(self.model.trainable_weights))
        buffers = hvd.allgather_object(flat(self.model.non_trainable_weights))
        self.same.append(all(np.array_equal(trainable[0], t) for t in trainable))
        self.same_buffers.append(all(np.array_equal(buffers[0], b) for b in buffers))


class Before(keras.callbacks.Callback):
    """Before LocalSGDCallback: every rank's weights just before a round."""

    def __init__(self):
        super().__init__()
        self.last = None

    def on_train_batch_end(self, batch, logs=None):
        self.last = hvd.allgather_object(flat(self.model.weights))


def compiled(optimizer):
    model = make_model()
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def fit(model, x, y, callbacks):
    """One epoch in batches of BATCH, in order."""
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)


def check_fit():
    model = compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
    x, y = data(WARMUP + LOCAL)
    local = hvd.callbacks.LocalSGDCallback(PERIOD, warmup_steps=WARMUP)
    probe, before = Probe(), Before()
    rounds = hvd.stats()["local_sgd"]["all"]["rounds"]
    averaged = []

    class Averaged(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch >= WARMUP and (batch + 1 - WARMUP) % PERIOD == 0:
                mean = np.mean(before.last, axis=0)
                averaged.append(np.allclose(flat(self.model.weights), mean, rtol=1e-5, atol=1e-6))

    fit(
        model,
        x,
        y,
        [hvd.callbacks.BroadcastGlobalVariablesCallback(0), before, local, Averaged(), probe],
    )
    want = [True] * WARMUP + [False, False, True] * (LOCAL // PERIOD)
    if hvd.size() > 1:
        check(probe.same == want, f"weights equal at warm-up and rounds only: {probe.same}")
        check(
            probe.same_buffers[WARMUP:] == [False, False, True] * (LOCAL // PERIOD),
            f"moving statistics apart between rounds, equal after: {probe.same_buffers}",
        )
    check(averaged == [True, True], f"each round is the ranks' average: {averaged}")
    got = hvd.stats()["local_sgd"]["all"]["rounds"] - rounds
    check(got == LOCAL // PERIOD, f"stats count {LOCAL // PERIOD} rounds: {got}")

    # A plain optimizer, no warm-up: rounds only.
    model = compiled(keras.optimizers.SGD(0.05))
    probe = Probe()
    fit(
        model,
        x,
        y,
        [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.LocalSGDCallback(4),
            probe,
        ],
    )
    if hvd.size() > 1:
        # the first batch ends with BroadcastGlobalVariablesCallback's broadcast (Horovod's)
        want = [True, False, False, True, False, False, False, True]
        check(probe.same == want, f"plain optimizer: {probe.same}")

    # Warm-up needs a DistributedOptimizer; bad periods.
    expect_error(
        hvd.InvalidArgumentError,
        lambda: fit(model, x, y, [hvd.callbacks.LocalSGDCallback(2, warmup_steps=1)]),
        "need the model's optimizer to be a scaleout DistributedOptimizer",
        what="warm-up with a plain optimizer",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.callbacks.LocalSGDCallback(0),
        "period",
        what="period=0",
    )


if __name__ == "__main__":
    main(check_fit)
