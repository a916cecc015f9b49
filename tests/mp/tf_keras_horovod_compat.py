"""Run by tests/test_tensorflow_keras_horovod.py::test_keras_behaves_as_horovods.

scaleout.tensorflow.keras behaves as Horovod 0.28.1's horovod.tensorflow.keras, checked as a
Horovod user would: the learning-rate callbacks (exponential multiplier, momentum correction,
Horovod's key in the logs), BroadcastGlobalVariablesCallback's timing and local variables, local
gradient aggregation (backward_passes_per_step), PartialDistributedOptimizer, load_model's
arguments, BestModelCheckpoint and MetricAverageCallback's device argument.

argv[1]: a directory shared by the ranks, for saved models."""

import os
import sys

import keras
import numpy as np
from _harness import check, check_close, expect_error, main_tests
from tf_common import so, tf

import scaleout.tensorflow.keras as hvd

FEATURES, B = 4, 2
DIRECTORY = sys.argv[1]


def lr_of(model) -> float:
    return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))


class Recorder(keras.callbacks.Callback):
    """Records the learning rate at the start of each batch and the kernel of the first layer
    at the start of each batch."""

    def __init__(self):
        super().__init__()
        self.lr, self.kernels, self.logs = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lr.append(lr_of(self.model))
        self.kernels.append(self.model.layers[0].kernel.numpy())

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs or {}))


def linear_model(seed=0, bias=False):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, use_bias=bias)])


def mean_output(y_true, y_pred):
    # d loss / d kernel = the mean of the inputs: with inputs of ones, a constant gradient of 1.
    return keras.ops.mean(y_pred)


def ones(rows):
    return np.ones((rows, FEATURES), np.float32), np.zeros((rows, 1), np.float32)


def test_lr_schedule_numeric_multiplier_is_exponential(r, n):
    steps = 2
    model = linear_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=mean_output)
    rec = Recorder()
    x, y = ones(steps * B)
    history = model.fit(
        x,
        y,
        batch_size=B,
        epochs=4,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=0.1, multiplier=0.5, start_epoch=1, end_epoch=3
            ),
            rec,
        ],
    )
    want = [0.1] * steps + [0.1] * steps + [0.05] * steps + [0.05] * steps
    check_close(
        rec.lr,
        want,
        "multiplier=0.5 from epoch 1: 0.1 * 0.5 ** (epoch - 1), held after end_epoch",
        rtol=1e-6,
    )
    check_close(
        history.history["lr"],
        [0.1, 0.1, 0.05, 0.05],
        "the rate in force is logged per epoch as 'lr' (Horovod's key)",
    )

    model = linear_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss=mean_output)
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=B,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=1.0, multiplier=0.5, staircase=False
            ),
            rec,
        ],
    )
    check_close(
        rec.lr,
        [0.5 ** (e + b / steps) for e in range(2) for b in range(steps)],
        "staircase=False: 0.5 ** (fractional epoch)",
    )
    expect_error(
        ValueError,
        lambda: hvd.callbacks.LearningRateScheduleCallback(None, 0.5),
        "initial_lr",
        what="initial_lr is required",
    )


def sgd_trajectory(lrs, momenta, grad=1.0, w0=0.0):
    """Keras SGD with momentum on a constant gradient: v = m v - lr g; w += v."""
    w, v, out = w0, 0.0, []
    for lr, m in zip(lrs, momenta):
        v = m * v - lr * grad
        w += v
        out.append(w)
    return out


def test_momentum_correction(r, n):
    # The rate drops tenfold at epoch 1; with momentum_correction the momentum is scaled by
    # new_lr / old_lr for that one batch (Goyal et al.), then restored.
    steps, m = 2, 0.9
    x, y = ones(steps * B)
    lrs = [1.0] * steps + [0.1] * steps
    for correction in (True, False):
        model = linear_model()
        model.layers[0].kernel.assign(np.zeros((FEATURES, 1), np.float32))
        model.compile(
            optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0, momentum=m)),
            loss=mean_output,
        )
        schedule = hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=1.0, multiplier=lambda epoch: 0.1**epoch, momentum_correction=correction
        )
        model.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False, callbacks=[schedule])
        momenta = [m] * 4
        if correction:
            momenta[steps] = m * 0.1 / 1.0
        # the gradient of mean(x @ w) with respect to each kernel entry is 1 (inputs are ones)
        want = sgd_trajectory(lrs, momenta)[-1]
        check_close(
            model.layers[0].kernel.numpy(),
            np.full((FEATURES, 1), want),
            f"momentum_correction={correction}: weights follow Horovod's rule",
            rtol=1e-5,
            atol=1e-6,
        )
        check(
            float(model.optimizer.momentum) == m,
            f"momentum_correction={correction}: momentum restored and reported as configured",
        )
        check(model.optimizer.get_config()["momentum"] == m, "config keeps the momentum")


def test_broadcast_callback_runs_at_the_end_of_the_first_batch(r, n):
    x, y = ones(3 * B)
    model = linear_model(seed=r, bias=True)
    own = model.layers[0].kernel.numpy()
    local = model.layers[0].bias
    local.assign(np.full((1,), float(r), np.float32))
    root = hvd.broadcast_object(own, root_rank=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss=mean_output)
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=B,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=local), rec],
    )
    check_close(rec.kernels[0], own, "the first batch starts from this rank's own weights")
    check_close(rec.kernels[1], root, "from the second batch on, root's weights")
    check_close(np.array(local), [float(r)], "local_variables are not broadcast")
    expect_error(
        ValueError,
        lambda: hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[np.zeros(2)]),
        "variables",
        what="local_variables of non-variables",
    )


def test_broadcast_callback_leaves_random_seed_states_per_rank(r, n):
    keras.utils.set_random_seed(100 + r)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(2),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = ones(2 * B)
    model.fit(
        x,
        y,
        batch_size=B,
        epochs=1,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    seeds = [v.numpy().tolist() for v in model.variables if "seed" in v.path]
    everyone = hvd.allgather_object((seeds, [w.tolist() for w in model.get_weights()]))
    check(all(e[1] == everyone[0][1] for e in everyone), "weights are root's everywhere")
    check(
        seeds and len({str(e[0]) for e in everyone}) == n,
        "Dropout's seed state stays per rank (masks differ across ranks)",
    )


def test_backward_passes_per_step_custom_loop(r, n):
    for average in (False, True):
        v = tf.Variable([0.0, 0.0])
        opt = hvd.DistributedOptimizer(
            keras.optimizers.SGD(1.0),
            backward_passes_per_step=2,
            average_aggregated_gradients=average,
        )
        mean_grad = np.array([(n - 1) / 2, 1.0])  # the average over ranks of [rank, 1]
        opt.apply_gradients([(tf.constant([float(r), 1.0]), v)])
        check_close(v, [0.0, 0.0], f"average={average}: no update after 1 of 2 passes")
        check(int(opt.iterations) == 1, "iterations counts every backward pass (Horovod's)")
        opt.apply_gradients([(tf.constant([float(r), 1.0]), v)])
        want = -mean_grad * (1 if average else 2)
        check_close(
            v,
            want,
            f"average={average}: one update of the {'mean' if average else 'sum'}"
            " of 2 passes, reduced across ranks",
        )
        step = tf.function(lambda: opt.apply_gradients([(tf.constant([float(r), 1.0]), v)]))
        step()
        check_close(v, want, "tf.function: no update after the 3rd pass")
        step()
        check_close(v, 2 * want, "tf.function: update after the 4th pass")
        check(int(opt.iterations) == 4, "iterations == passes")
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=0),
        "backward_passes_per_step",
        what="backward_passes_per_step=0",
    )


def test_backward_passes_per_step_in_fit_equals_a_k_times_larger_batch(r, n):
    k, updates = 2, 2
    rng = np.random.default_rng(5)
    x = rng.normal(size=(updates, k, n, B, FEATURES)).astype(np.float32)
    y = rng.normal(size=(updates, k, n, B, 1)).astype(np.float32)
    mine = (x[:, :, r].reshape(-1, FEATURES), y[:, :, r].reshape(-1, 1))
    model = linear_model(seed=3, bias=True)
    start = model.get_weights()
    model.compile(
        optimizer=hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.5),
            backward_passes_per_step=k,
            average_aggregated_gradients=True,
        ),
        loss="mse",
    )
    model.fit(*mine, batch_size=B, epochs=1, verbose=0, shuffle=False)
    reference = linear_model(seed=3, bias=True)
    reference.set_weights(start)
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    reference.fit(
        x.reshape(-1, FEATURES),
        y.reshape(-1, 1),
        batch_size=k * n * B,
        epochs=1,
        verbose=0,
        shuffle=False,
    )
    for got, want in zip(model.get_weights(), reference.get_weights()):
        check_close(
            got,
            want,
            "k passes of B rows per rank == one step of k * size * B rows",
            rtol=1e-5,
            atol=1e-6,
        )
    check(int(model.optimizer.iterations) == k * updates, "iterations counts the passes")


def test_partial_distributed_optimizer_keeps_local_layers_local(r, n):
    keras.utils.set_random_seed(0)
    shared = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    local = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    shared.build((None, 1))
    local.build((None, 1))
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=local)
    g = tf.constant([[float(r + 1)]])
    opt.apply_gradients([(g, shared.kernel), (g, local.kernel)])
    check_close(shared.kernel.numpy(), [[-(n + 1) / 2]], "shared layer: averaged gradient")
    check_close(
        local.kernel.numpy(),
        [[-(r + 1) / n]],
        "local layer: own gradient divided by size (scale_local_gradients)",
    )
    opt = hvd.PartialDistributedOptimizer(
        keras.optimizers.SGD(1.0), local_layers=[local], scale_local_gradients=False
    )
    opt.apply_gradients([(g, local.kernel)])
    check_close(
        local.kernel.numpy(),
        [[-(r + 1) / n - (r + 1)]],
        "scale_local_gradients=False: own gradient as is",
    )
    expect_error(
        ValueError,
        lambda: hvd.PartialDistributedOptimizer(
            keras.optimizers.SGD(1.0), local_layers=["not a layer"]
        ),
        "layers",
        what="local_layers of non-layers",
    )


def test_loss_scaling_skips_or_applies_on_every_rank_together(r, n):
    # compile() under mixed_float16 wraps the distributed optimizer in a LossScaleOptimizer,
    # which checks gradients before the inner apply (the reduction): the check is collective.
    v = tf.Variable([1.0])
    opt = keras.optimizers.LossScaleOptimizer(
        hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), initial_scale=4.0
    )
    bad = tf.constant([float("inf") if r == 0 else 1.0])
    opt.apply([bad], [v])  # would hang: rank 0 skips while the others reduce
    check_close(v, [1.0], "an overflow on rank 0 skips the step on every rank")
    check_close(opt.dynamic_scale, 2.0, "and halves the loss scale on every rank")
    step = tf.function(lambda g: opt.apply([g], [v]))
    step(tf.constant([4.0 * (r + 1)]) / 2.0)  # scaled by the current loss scale, 2
    check_close(v, [1.0 - (n + 1) / 2], "finite everywhere: the averaged, unscaled gradient")
    step(tf.constant([float("nan") if r == n - 1 else 1.0]))
    check_close(v, [1.0 - (n + 1) / 2], "a NaN on the last rank skips the step everywhere")


def test_optimizer_arguments_as_horovod(r, n):
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Max),
        "op",
        what="op=Max (Horovod: Average or Sum only)",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=-1),
        "groups",
        what="groups=-1",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=object()),
        "must be a ProcessSet",
        what="process_set=object()",
    )
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(1.0), groups=2, process_set=hvd.global_process_set
    )
    v = tf.Variable([1.0])
    opt.apply_gradients([(tf.constant([float(r)]), v)])
    check_close(v, [1.0 - (n - 1) / 2], "groups=2 and the global process set are accepted")


class CustomSGD(keras.optimizers.SGD):
    pass


def test_load_model_takes_horovods_arguments(r, n):
    path = os.path.join(DIRECTORY, f"custom.{r}.keras")
    model = linear_model()
    model.compile(optimizer=CustomSGD(0.1), loss="mse")
    x, y = ones(B)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    model.save(path)
    loaded = hvd.load_model(
        path,
        custom_optimizers=[CustomSGD],
        custom_objects={},
        compression=hvd.Compression.fp16,
        legacy_opts=False,
    )
    check(
        isinstance(loaded.optimizer, CustomSGD) and hvd.is_distributed(loaded.optimizer),
        "custom_optimizers: loaded as the user's class, made distributed",
    )
    kernel = loaded.layers[0].kernel
    before = kernel.numpy()
    loaded.optimizer.apply_gradients([(tf.fill(kernel.shape, float(r) + 1 / 3), kernel)])
    got = float((kernel.numpy() - before)[0, 0])
    exact = -0.1 * ((n - 1) / 2 + 1 / 3)
    via_fp16 = -0.1 * float(np.mean([np.float16(k + 1 / 3) for k in range(n)], dtype=np.float64))
    check(
        abs(got - via_fp16) < 1e-4 and abs(got - exact) > 1e-7,
        f"compression=fp16 applies to the loaded optimizer: got {got}, want ~{via_fp16} "
        f"(fp16 rounding), not {exact}",
    )
    expect_error(
        TypeError,
        lambda: hvd.load_model(path, op=hvd.Sum),
        "op",
        what="an argument Horovod's load_model does not take",
    )


def test_best_model_checkpoint(r, n):
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    check(
        checkpoint.save_best_only and checkpoint.monitor == "loss",
        "BestModelCheckpoint keeps the best model by its monitor",
    )
    model = linear_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x, y = ones(B)
    expect_error(
        ValueError,
        lambda: model.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint]),
        "filepath",
        what="fit() before filepath is set",
    )
    checkpoint.filepath = os.path.join(DIRECTORY, f"best.{r}.keras")
    model.fit(
        x, y, epochs=3, verbose=0, callbacks=[hvd.callbacks.MetricAverageCallback(), checkpoint]
    )
    check(os.path.exists(checkpoint.filepath), "the best model was saved")
    best = keras.models.load_model(checkpoint.filepath)
    check_close(
        best.get_weights()[0],
        model.get_weights()[0],
        "the loss fell every epoch, so the best model is the last",
    )


def test_metric_average_callback_device(r, n):
    hvd.callbacks.MetricAverageCallback(device="")
    hvd.callbacks.MetricAverageCallback(device="/cpu:0")
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd.callbacks.MetricAverageCallback(device="/gpu:0"),
        "GPU",
        what="a GPU device",
    )


def test_warmup_of_one_epoch(r, n):
    model = linear_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss=mean_output)
    x, y = ones(2 * B)
    rec = Recorder()
    model.fit(
        x,
        y,
        batch_size=B,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[
            hvd.callbacks.LearningRateWarmupCallback(
                0.2, warmup_epochs=1, verbose=1 if r == 0 else 0
            ),
            rec,
        ],
    )
    check_close(
        rec.lr,
        [0.2 / n * (0.5 * (n - 1) + 1), 0.2, 0.2, 0.2],
        "warmup_epochs=1: half way after one batch, initial_lr from the second",
    )


if __name__ == "__main__":
    main_tests(globals())
