"""Run by tests/test_tensorflow_keras.py::test_keras_fit_callbacks_save_load.

scaleout.tensorflow.keras on real ranks: DistributedOptimizer with model.fit equals one
process with the whole batch (SGD with momentum, Adam, AdamW with a schedule), the callbacks,
saving and loading, compression, and the jit_compile error.

argv[1]: a directory shared by the ranks, for the saved model."""

import os
import sys

import keras
import numpy as np
from _harness import check, check_close, expect_error, main
from tf_common import so, tf

import scaleout.tensorflow.keras as hvd

B, STEPS, EPOCHS, FEATURES = 4, 3, 2, 5


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    )


def data(n):
    rng = np.random.default_rng(11)
    rows = STEPS * n * B
    return (
        rng.normal(size=(rows, FEATURES)).astype(np.float32),
        rng.integers(0, 3, rows).astype(np.int32),
    )


def shard(array, r, n):
    """Rank r's rows: its B-row part of every (n * B)-row global batch, in step order."""
    return array.reshape(STEPS, n, B, *array.shape[1:])[:, r].reshape(-1, *array.shape[1:])


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def fit_equivalence(r, n, make_optimizer, label, compression=hvd.Compression.none, tol=1e-5):
    x, y = data(n)
    model = make_model(seed=r)
    model.compile(
        optimizer=hvd.DistributedOptimizer(make_optimizer(), compression=compression), loss=LOSS
    )
    start = hvd.broadcast_object(model.get_weights(), root_rank=0)
    # BroadcastGlobalVariablesCallback broadcasts at the end of the first batch (Horovod's
    # timing), so the first step starts from root's weights only if they are set before fit().
    model.set_weights(start)
    model.fit(
        shard(x, r, n),
        shard(y, r, n),
        batch_size=B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    reference = make_model(seed=0)
    reference.set_weights(start)
    reference.compile(optimizer=make_optimizer(), loss=LOSS)
    reference.fit(x, y, batch_size=n * B, epochs=EPOCHS, shuffle=False, verbose=0)
    for i, (got, want) in enumerate(zip(model.get_weights(), reference.get_weights())):
        check_close(
            got, want, f"{label}: weight {i} equals the single-process run", rtol=tol, atol=tol
        )
    check(int(model.optimizer.iterations) == STEPS * EPOCHS, f"{label}: step count")
    weights = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    check(all(w == weights[0] for w in weights), f"{label}: same weights on every rank")
    moved = [np.abs(w - w0).max() for w, w0 in zip(model.get_weights(), start)]
    check(min(moved) > 1e-4, f"{label}: training moved the weights ({moved})")
    return model


def test_fit_equals_single_process(r, n):
    fit_equivalence(r, n, lambda: keras.optimizers.SGD(0.1, momentum=0.9), "SGD momentum")
    fit_equivalence(r, n, lambda: keras.optimizers.Adam(0.01), "Adam", tol=1e-4)

    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=2, decay_rate=0.5)

    fit_equivalence(
        r,
        n,
        lambda: keras.optimizers.AdamW(schedule(), weight_decay=0.1),
        "AdamW with a schedule",
        tol=1e-4,
    )
    fit_equivalence(
        r,
        n,
        lambda: keras.optimizers.SGD(0.1),
        "SGD, fp16 compression",
        compression=hvd.Compression.fp16,
        tol=2e-3,
    )


def test_apply_gradients_custom_loop(r, n):
    v = tf.Variable([0.0, 0.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    check(
        hvd.is_distributed(opt) and isinstance(opt, keras.optimizers.SGD),
        "a distributed optimizer is still an SGD",
    )
    base = keras.optimizers.SGD(1.0)
    check(not hvd.is_distributed(base), "the optimizer passed in is left alone")
    opt.apply_gradients([(tf.constant([float(r), 1.0]), v)])
    check_close(v, [-(n - 1) / 2, -1.0], "apply_gradients averages eagerly")
    tf.function(lambda: opt.apply_gradients([(tf.constant([float(r), 1.0]), v)]))()
    check_close(v, [-(n - 1.0), -2.0], "apply_gradients averages inside tf.function")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(opt), "already", what="wrap twice")
    expect_error(
        TypeError,
        lambda: hvd.DistributedOptimizer(object()),
        "Keras 3 optimizer",
        what="not an optimizer",
    )


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs, self.batch_lr = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lr.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def test_callbacks(r, n):
    x, y = data(n)
    xr, yr = shard(x, r, n), shard(y, r, n)
    # MetricAverageCallback: History holds the average over ranks of what each rank measured
    model = make_model(seed=r)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)),
        loss=LOSS,
        metrics=["accuracy"],
    )
    raw = Recorder()
    history = model.fit(
        xr,
        yr,
        batch_size=B,
        epochs=EPOCHS,
        verbose=0,
        shuffle=False,
        validation_data=(xr[:4], yr[:4]),
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            raw,
            hvd.callbacks.MetricAverageCallback(),
        ],
    )
    everyone = hvd.allgather_object(raw.epoch_logs)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        for epoch in range(EPOCHS):
            want = np.mean([logs[epoch][key] for logs in everyone])
            check_close(history.history[key][epoch], want, f"MetricAverageCallback {key} {epoch}")
    check(len({logs[0]["loss"] for logs in everyone}) == n, "ranks measured different losses")

    # LearningRateWarmupCallback: initial_lr / size up to initial_lr, batch by batch, one batch
    # ahead as Horovod's (the last batch of the warmup runs at initial_lr)
    steps_per_epoch = STEPS
    model = make_model(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss=LOSS)
    lr = Recorder()
    history = model.fit(
        xr,
        yr,
        batch_size=B,
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), lr],
    )
    want = []
    for epoch in range(3):
        for batch in range(steps_per_epoch):
            e = epoch + (batch + 1) / steps_per_epoch
            want.append(0.4 / n * (1 + e * (n - 1) / 2) if epoch < 2 else 0.4)
    check_close(lr.batch_lr, want, "warmup learning rates per batch")
    check_close(want[2 * steps_per_epoch - 1], 0.4, "the warmup's last batch runs at initial_lr")
    check_close(
        history.history["lr"],
        [want[steps_per_epoch - 1], 0.4, 0.4],
        "warmup: learning rate logged per epoch, full rate after the warmup",
    )

    # LearningRateScheduleCallback: staircase multiplier from start_epoch on
    model = make_model(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.5)), loss=LOSS)
    lr = Recorder()
    model.fit(
        xr,
        yr,
        batch_size=B,
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=0.5, multiplier=lambda epoch: 0.1**epoch, start_epoch=1
            ),
            lr,
        ],
    )
    check_close(
        lr.batch_lr,
        [0.5] * STEPS + [0.05] * STEPS + [0.005] * STEPS,
        "staircase schedule from epoch 1",
    )
    model = make_model(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.5)), loss=LOSS)
    lr = Recorder()
    model.fit(
        xr,
        yr,
        batch_size=B,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=1.0, multiplier=lambda e: 1.0 - e / 4, staircase=False, end_epoch=1
            ),
            lr,
        ],
    )
    check_close(
        lr.batch_lr,
        [1.0 - (b / STEPS) / 4 for b in range(STEPS)] + [1.0 - ((STEPS - 1) / STEPS) / 4] * STEPS,
        "smooth schedule until end_epoch",
    )


def test_save_and_load(r, n, directory):
    x, y = data(n)
    path = os.path.join(directory, "model.keras")
    model = make_model(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=LOSS)
    model.fit(shard(x, r, n), shard(y, r, n), batch_size=B, epochs=1, verbose=0, shuffle=False)
    if r == 0:
        model.save(path)
    hvd.barrier()
    loaded = hvd.load_model(path)
    check(
        hvd.is_distributed(loaded.optimizer)
        and isinstance(loaded.optimizer, keras.optimizers.Adam),
        "load_model gives a distributed Adam",
    )
    check(int(loaded.optimizer.iterations) == STEPS, "optimizer state restored")
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        check_close(a, b, f"optimizer variable {a.path} restored")
    loaded.fit(shard(x, r, n), shard(y, r, n), batch_size=B, epochs=1, verbose=0, shuffle=False)
    model.fit(shard(x, r, n), shard(y, r, n), batch_size=B, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        check_close(a, b, "the loaded model trains on exactly like the original", rtol=1e-6)
    weights = hvd.allgather_object([w.tobytes() for w in loaded.get_weights()])
    check(all(w == weights[0] for w in weights), "loaded models stay in sync")
    plain = keras.models.load_model(path)
    check(not hvd.is_distributed(plain.optimizer), "plain keras load_model: a plain optimizer")
    hvd.barrier()


def test_jit_compile_is_refused(r, n):
    x, y = data(n)
    model = make_model(seed=0)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS, jit_compile=True
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: model.fit(x[:B], y[:B], batch_size=B, epochs=1, verbose=0),
        "XLA",
        "jit_compile=False",
        what="model.compile(jit_compile=True)",
    )


def run():
    r, n = so.rank(), so.size()
    test_fit_equals_single_process(r, n)
    test_apply_gradients_custom_loop(r, n)
    test_callbacks(r, n)
    test_save_and_load(r, n, sys.argv[1])
    test_jit_compile_is_refused(r, n)


if __name__ == "__main__":
    main(run)
