"""Run by
tests/test_tensorflow_elastic.py::test_keras_callbacks_commit_count_and_shorten_the_resumed_epoch.

The Keras elastic callbacks in model.fit on real ranks, as after a restart in the middle of
an epoch (state.epoch 1, state.batch 3) with 8 steps per epoch: which commits happen and what
state.epoch and state.batch are at each, the shortened first epoch (8 - 3 steps, really run),
and another callback's request to stop, which the shortening leaves in place."""

import keras
import numpy as np
from _harness import check, finish
from tf_common import tf  # noqa: F401  (quiet, one thread)

import scaleout.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 4, 8


class BatchesPerEpoch(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.counts = []

    def on_epoch_begin(self, epoch, logs=None):
        self.counts.append(0)

    def on_batch_end(self, batch, logs=None):
        self.counts[-1] += 1


class StopAtBatch(keras.callbacks.Callback):
    """Asks fit to stop at the end of batch `at` (as EarlyStopping or TerminateOnNaN would)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_batch_end(self, batch, logs=None):
        if batch == self.at:
            self.model.stop_training = True


keras.utils.set_random_seed(r)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
state.sync()
rng = np.random.default_rng(r)
x, y = rng.normal(size=(B * STEPS, 3)).astype(np.float32), np.zeros((B * STEPS, 2), np.float32)

commits = []
commit = state.commit


def recording_commit():
    commits.append((state.epoch, state.batch))
    commit()


state.commit = recording_commit
counted = BatchesPerEpoch()
callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=3),
    counted,
]

state.epoch, state.batch = 1, 3  # as resumed from a commit made after batch 3 of epoch 1
before = int(model.optimizer.iterations)
model.fit(x, y, batch_size=B, epochs=3 - state.epoch, callbacks=callbacks, verbose=0, shuffle=False)
check(
    counted.counts == [STEPS - 3, STEPS],
    f"batches run per epoch: {counted.counts}, want "
    f"[{STEPS - 3}, {STEPS}] (the first epoch shortened by state.batch)",
)
check(
    int(model.optimizer.iterations) - before == 2 * STEPS - 3,
    f"optimizer steps: {int(model.optimizer.iterations) - before}, want {2 * STEPS - 3}",
)
# A commit every 3rd batch of the fit and at each epoch's end; the count goes on across epochs.
# Inside the shortened epoch state.batch counts from 3.
want = [(1, 5), (2, 0), (2, 0), (2, 3), (2, 6), (3, 0)]
check(commits == want, f"commits (epoch, batch): {commits}, want {want}")
check(
    state.epoch == 3 and state.batch == 0,
    f"at the end: epoch {state.epoch}, batch {state.batch}, want 3, 0",
)

# Another callback's stop at the shortened epoch's last batch ends the fit there.
state.epoch, state.batch = 1, 3
model.fit(
    x,
    y,
    batch_size=B,
    epochs=2,
    verbose=0,
    shuffle=False,
    callbacks=callbacks + [StopAtBatch(STEPS - 3 - 1)],
)
check(
    counted.counts == [STEPS - 3],
    f"a stop requested by another callback holds: {counted.counts}, want [{STEPS - 3}]",
)
# Without a shortening, fit runs every epoch in full.
state.epoch, state.batch = 0, 0
model.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
check(
    counted.counts == [STEPS, STEPS] and state.epoch == 2,
    f"no shortening: {counted.counts}, epoch {state.epoch}",
)
finish()
