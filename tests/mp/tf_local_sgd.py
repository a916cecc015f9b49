"""Run by tests/test_local_sgd.py::test_keras_local_sgd_callback (SCALEOUT_FUSION_THRESHOLD=0).

LocalSGDCallback (Note [Local SGD]) in model.fit: warm-up batches bulk-synchronous through the
DistributedOptimizer (the same weights on every rank), then local batches (the ranks apart) and
every third one a round (the same weights, BatchNormalization's moving statistics included,
equal to the ranks' average); a plain optimizer without warm-up; with an outer optimizer and
with staleness; the errors. scaleout.tensorflow.LocalSGD in a GradientTape loop: DiLoCo's outer
step against the same arithmetic in numpy, bounded staleness (rounds taken 2 steps after they
start; with one rank slowed the others wait exactly there), runs saved and resumed mid-period
(an outer optimizer's state, a round in flight) equal to the runs that went on."""

import keras
import numpy as np
import tensorflow as tf
from _harness import check, expect_error, main
from tf_common import so  # noqa: F401  (TensorFlow set up as the TF tests do)

import scaleout.tensorflow as hvd_tf
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


def check_fit_outer_and_staleness():
    """The callback with an outer optimizer (no warm-up: the first round is a plain average and
    the anchor) and with staleness (rounds taken 2 batches after they start)."""
    x, y = data(9)
    model = compiled(keras.optimizers.SGD(0.05))
    probe = Probe()
    local = hvd.callbacks.LocalSGDCallback(
        3, outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    )
    fit(model, x, y, [hvd.callbacks.BroadcastGlobalVariablesCallback(0), local, probe])
    if hvd.size() > 1:
        # batch 0 ends with the broadcast; rounds after batches 3, 6, 9
        want = [True, False, True] + [False, False, True] * 2
        check(probe.same == want, f"outer optimizer: equal at rounds only: {probe.same}")
    check(local.state_dict()["anchor"] is not None, "the first round gives the anchor")

    model = compiled(keras.optimizers.SGD(0.05))
    local = hvd.callbacks.LocalSGDCallback(3, staleness=2)
    waits = hvd.stats()["local_sgd"]["all"]["rounds"]
    fit(model, x, y, [hvd.callbacks.BroadcastGlobalVariablesCallback(0), local])
    got = hvd.stats()["local_sgd"]["all"]["rounds"] - waits
    check(got == 2, f"rounds started at batches 3 and 6 arrived (9's in flight): {got}")
    check(local.state_dict()["round"] is not None, "the round of batch 9 is in flight")
    saved = local.state_dict()
    local.average()
    same = hvd.allgather_object(flat(model.weights))
    check(all(np.array_equal(same[0], w) for w in same), "average() agrees everywhere")

    # load_state_dict() before fit(): taken at fit()'s start
    again = hvd.callbacks.LocalSGDCallback(3, staleness=2)
    again.load_state_dict(saved)
    fit(model, x[: 2 * BATCH], y[: 2 * BATCH], [again])
    check(again.local_sgd.step_count == 11, f"the count went on: {again.local_sgd.step_count}")


def check_fit_mixed_float16():
    """Under a mixed_float16 policy compile() wraps the optimizer in a LossScaleOptimizer: the
    warm-up reduces through the DistributedOptimizer inside it, whose reduction then stops."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))
        x, y = data(4)
        rounds = hvd.stats()["local_sgd"]["all"]["rounds"]
        fit(model, x, y, [hvd.callbacks.LocalSGDCallback(3, warmup_steps=1)])
        inner = model.optimizer.inner_optimizer
        check(not hvd.is_distributed(inner), "the inner optimizer reduces no more after warm-up")
        got = hvd.stats()["local_sgd"]["all"]["rounds"] - rounds
        check(got == 1, f"one round after the warm-up batch and three local ones: {got}")
    finally:
        keras.mixed_precision.set_global_policy("float32")


# ---- scaleout.tensorflow.LocalSGD in a GradientTape loop ----

loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def batch(step):
    rng = np.random.default_rng(1000 * hvd.rank() + step)
    return (
        rng.normal(size=(BATCH, 5)).astype(np.float32),
        rng.integers(0, 3, BATCH).astype(np.int32),
    )


def tape_step(model, opt, local, step):
    """One step of the loop a user writes: gradients reduced while local.bulk()."""
    x, y = batch(step)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    if local.bulk():
        tape = hvd_tf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def tape_train(model, opt, local, steps, first=0, after=None):
    for step in range(first, first + steps):
        tape_step(model, opt, local, step)
        local.after_step()
        if after is not None:
            after(step)


def trainable(model):
    return np.concatenate([np.ravel(v.numpy()) for v in model.trainable_variables])


def check_tape_outer():
    """DiLoCo after one warm-up step: at each round the anchor moves by SGD(momentum, nesterov)
    on anchor - average of the ranks' models."""
    lr, mu = 0.7, 0.9
    model = make_model()
    opt = keras.optimizers.SGD(0.05)
    outer = keras.optimizers.SGD(lr, momentum=mu, nesterov=True)
    local = hvd_tf.LocalSGD(
        model, period=2, warmup_steps=1, outer_optimizer=outer, average_buffers=False
    )
    tape_train(model, opt, local, 1)
    anchor = trainable(model).astype(np.float64)
    velocity = np.zeros_like(anchor)
    for step in range(1, 7):
        tape_step(model, opt, local, step)
        mine = trainable(model).astype(np.float64)
        local.after_step()
        if step % 2 == 0:
            grad = anchor - np.mean(hvd.allgather_object(mine), axis=0)
            velocity = mu * velocity + grad
            anchor = anchor - lr * (grad + mu * velocity)
            check(
                np.allclose(trainable(model), anchor, rtol=1e-5, atol=1e-6),
                f"step {step}: the outer step from the anchor",
            )


def resumed(make, steps, at):
    """A run of `steps` steps, and the same run saved after `at` steps (the model, the
    optimizer's variables, LocalSGD's state_dict) and resumed in new ones: (the first's
    weights, the second's, the saved LocalSGD state)."""
    model, opt, local = make()
    tape_train(model, opt, local, steps)
    want = flat(model.weights)
    model, opt, local = make()
    tape_train(model, opt, local, at)
    weights = [w.numpy() for w in model.weights]
    slots = [v.numpy() for v in opt.variables]
    saved = local.state_dict()
    model, opt, local = make()
    for v, w in zip(model.weights, weights):
        v.assign(w)
    opt.build(model.trainable_variables)
    for v, w in zip(opt.variables, slots):
        v.assign(w)
    local.load_state_dict(saved)
    check(local.step_count == at, f"the step count is restored: {local.step_count}")
    tape_train(model, opt, local, steps - at, first=at)
    return want, flat(model.weights), saved


def check_tape_resume():
    def make():
        model = make_model()
        local = hvd_tf.LocalSGD(
            model, period=3, warmup_steps=1, outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.5)
        )
        return model, keras.optimizers.SGD(0.05, momentum=0.9), local

    want, got, _ = resumed(make, 10, 5)
    check(np.array_equal(got, want), "resumed mid-period: the same model as the run that went on")
    # saved before the first outer step: the outer optimizer not yet built
    want, got, saved = resumed(make, 6, 1)
    check(saved["outer"] is None, "an outer optimizer not yet built: no state saved")
    check(np.array_equal(got, want), "resumed before the first outer step: the same model")


def check_tape_staleness():
    """A round is taken 2 steps after it started, as average + own progress since the
    snapshot; resumed with a round in flight; one rank slowed: the others wait at the bound."""
    model = make_model()
    local = hvd_tf.LocalSGD(model, period=3, staleness=2)
    opt = keras.optimizers.SGD(0.05)
    seen = {"taken": []}
    start_round, take_round = local._start_round, local._take_round

    def started():
        start_round()
        seen["snapshots"] = hvd.allgather_object(flat(model.weights))
        seen["mine"] = flat(model.weights)

    def taken():
        before = flat(model.weights)
        take_round()
        want = np.mean(seen["snapshots"], axis=0) + (before - seen["mine"])
        check(
            np.allclose(flat(model.weights), want, rtol=1e-5, atol=1e-6),
            "a stale round is taken as average + own progress since the snapshot",
        )
        seen["taken"].append(local.step_count)

    local._start_round, local._take_round = started, taken
    tape_train(model, opt, local, 12)
    check(seen["taken"] == [5, 8, 11], f"rounds taken 2 steps after 3, 6, 9: {seen['taken']}")

    def make():
        model = make_model()
        local = hvd_tf.LocalSGD(model, period=3, staleness=2)
        return model, keras.optimizers.SGD(0.05, momentum=0.9), local

    want, got, saved = resumed(make, 12, 7)
    check(saved["round"] is not None, "the round in flight is saved")
    check(np.array_equal(got, want), "resumed with a round in flight: the same model")

    slow = hvd.size() - 1
    model = make_model()
    local = hvd_tf.LocalSGD(model, period=4, staleness=2)
    heavy = np.random.default_rng(0).normal(size=(300, 300))
    waits = []

    def after(step):
        if hvd.rank() == slow:
            for _ in range(40):
                np.dot(heavy, heavy)
        count = hvd.stats()["local_sgd"]["all"]["waits"]
        if count != after.count:
            waits.append(step + 1)
        after.count = count

    after.count = hvd.stats()["local_sgd"]["all"]["waits"]
    tape_train(model, keras.optimizers.SGD(0.05), local, 16, after=after)
    if hvd.rank() == slow:
        check(waits == [], f"the slowed rank never waits: waited after steps {waits}")
    else:
        check(waits == [6, 10, 14], f"waits exactly 2 steps after each round: {waits}")
    local.average()
    same = hvd.allgather_object(flat(model.weights))
    check(all(np.array_equal(same[0], w) for w in same), "average() agrees everywhere")

    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd_tf.LocalSGD(
            model, period=2, staleness=1, outer_optimizer=keras.optimizers.SGD(1.0)
        ),
        "LocalSGD: staleness with an outer optimizer is not supported",
        what="staleness with an outer optimizer",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd_tf.LocalSGD(model, period=2, outer_optimizer=object()),
        "outer_optimizer must be a Keras optimizer",
        what="an outer optimizer that is not Keras's",
    )
    expect_error(
        hvd.InvalidArgumentError,
        lambda: hvd_tf.LocalSGD("model", period=2),
        "must be a Keras model",
        what="a model that is not one",
    )

    def empty_round():
        empty = hvd_tf.LocalSGD(tf.Module(), period=1, outer_optimizer=keras.optimizers.SGD(1.0))
        empty.after_step()

    expect_error(
        hvd.InvalidArgumentError,
        empty_round,
        "no variables to average",
        what="a tf.Module without tf.Variables",
    )


def run():
    check_fit()
    check_fit_outer_and_staleness()
    check_fit_mixed_float16()
    check_tape_outer()
    check_tape_resume()
    check_tape_staleness()


if __name__ == "__main__":
    main(run)
