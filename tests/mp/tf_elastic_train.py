"""Run by
tests/test_tensorflow_elastic.py::test_a_killed_rank_stops_keras_fit_and_two_ranks_finish_it.

An elastic Keras training (Note [Elastic restarts]), run by tests/test_tensorflow_elastic.py
under scaleoutrun's elastic driver: model.fit with the three elastic callbacks (a commit after
every batch), 3 epochs of 6 steps. KILL=rank:epoch:batch makes that rank kill itself (SIGKILL)
at the end of that batch, before its commit, in the first generation. At the end rank 0 prints
what a user would look at: the epoch and batch counters, the optimizer's step count, the
batches run per epoch in the last generation, the sizes seen, and whether every rank holds the
same weights."""

import json
import os
import signal

import keras
import numpy as np
from tf_common import tf  # noqa: F401  (quiet, one thread)

import scaleout.tensorflow.keras as hvd

hvd.init()
EPOCHS, STEPS, B = 3, 6, 4
kill_rank, kill_epoch, kill_batch = (int(x) for x in os.environ.get("KILL", "-1:-1:-1").split(":"))
if os.environ.get("SCALEOUT_ELASTIC_GENERATION", "0") != "0":
    kill_rank = -1

keras.utils.set_random_seed(hvd.rank())  # different on every rank until the state is synced
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(B * STEPS, 8)).astype(np.float32)
y = rng.integers(0, 4, B * STEPS).astype(np.int32)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)]
)
model.compile(
    optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
state = hvd.elastic.KerasState(model, epoch=0, batch=0, sizes=[])
state.register_reset_callbacks(
    [
        lambda: state.sizes.append(
            ["reset", hvd.size(), state.epoch, state.batch, int(model.optimizer.iterations)]
        )
    ]
)


class Kill(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        if hvd.rank() == kill_rank and state.epoch == kill_epoch and batch == kill_batch:
            os.kill(os.getpid(), signal.SIGKILL)


class BatchesPerEpoch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.counts = []

    def on_epoch_begin(self, epoch, logs=None):
        self.counts.append(0)

    def on_batch_end(self, batch, logs=None):
        self.counts[-1] += 1


counted = BatchesPerEpoch()
callbacks = [
    Kill(),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
    counted,
]


@hvd.elastic.run
def train(state):
    state.sizes = state.sizes + [hvd.size()]
    state.model.fit(
        x,
        y,
        batch_size=B,
        epochs=EPOCHS - state.epoch,
        callbacks=callbacks,
        shuffle=False,
        verbose=0,
    )


train(state)
weights = np.concatenate([w.ravel() for w in model.get_weights()])
everywhere = hvd.allgather_object(weights, name="final weights")
if hvd.rank() == 0:
    print(
        "RESULT "
        + json.dumps(
            {
                "epoch": state.epoch,
                "batch": state.batch,
                "iterations": int(model.optimizer.iterations),
                "batches": counted.counts,
                "sizes": state.sizes,
                "same_weights": all(np.array_equal(everywhere[0], w) for w in everywhere),
            }
        ),
        flush=True,
    )
