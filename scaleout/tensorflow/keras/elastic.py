"""Elastic training for Keras 3, with Horovod 0.28.1's names (`hvd.elastic` after
`import scaleout.tensorflow.keras as hvd`):

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(x, y, epochs=epochs - state.epoch, callbacks=callbacks)

    train(state)

The callbacks are Horovod's (horovod/_keras/elastic.py), in Keras 3's fit loop:
- CommitStateCallback commits every `batches_per_commit` batches and at the end of every epoch
  (its count starts again at every fit).
- UpdateBatchStateCallback sets `state.batch` to the index of the batch that ended (0 at the end
  of an epoch), and shortens the first epoch of a fit by `state.batch` steps when the number of
  steps is known: after a restart, the interrupted epoch runs only what it had left (by
  Horovod's count, which runs the batch of the last commit's index again).
- UpdateEpochStateCallback sets `state.epoch` to the epochs done: the state's epoch when fit
  began plus Keras's epoch plus one (so pass `epochs=total - state.epoch`, not initial_epoch).
Order them as above, so that a commit holds the batch and epoch it ends.
"""

from __future__ import annotations

import keras

from scaleout.tensorflow.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HostUpdateResult,
    ObjectState,
    State,
    TensorFlowKerasState,
    run,
)

__all__ = [
    "run",
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "TensorFlowKerasState",
    "State",
    "ObjectState",
    "HostsUpdatedInterrupt",
    "HostUpdateResult",
    "HorovodInternalError",
]


class KerasState(TensorFlowKerasState):
    """State of a Keras model and its optimizer (default: model.optimizer); keyword arguments
    become attributes. See TensorFlowKerasState."""

    def __init__(self, model, optimizer=None, **kwargs) -> None:
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` at the end of every `batches_per_commit`-th batch and of every epoch."""

    def __init__(self, state, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Every fit starts counting afresh, so that every rank commits at the same batches.
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.commit()

    def commit(self) -> None:
        self.state.commit()


class _EndOfEpoch:
    """The value UpdateBatchStateCallback gives model.stop_training to end a shortened epoch:
    true, so Keras leaves the epoch's loop, and told apart from another callback's True, which
    it leaves in place."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<end of a shortened epoch>"


_END_OF_EPOCH = _EndOfEpoch()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Sets `state.batch` at the end of every batch (0 at the end of an epoch); when the number
    of steps per epoch is known, the first epoch of a fit runs `state.batch` steps fewer.

    Horovod lowers params['steps'], which Keras 3's fit loop does not read (it counts the steps
    it was given), so here the shortened epoch ends through model.stop_training, set after its
    last step and cleared at the epoch's end; params['steps'] is lowered too, as Horovod's.
    Inside a shortened epoch, state.batch counts from where the epoch started (Horovod's counts
    from 0 again), so that a second restart in the same epoch shortens it by the right amount.
    """

    def __init__(self, state) -> None:
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.steps_per_epoch = None
        self._skipped = 0  # steps of this epoch done before this fit
        self._last_batch = None  # the index of the shortened epoch's last batch

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self._skipped, self._last_batch = 0, None
        if not self.params.get("steps"):
            return
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params["steps"]
        steps = self.steps_per_epoch - self.state.batch
        self.params["steps"] = steps
        if self.state.batch:
            self._skipped = self.state.batch
            self._last_batch = max(steps, 1) - 1

    def on_batch_end(self, batch, logs=None):
        self.state.batch = self._skipped + batch
        if (
            self._last_batch is not None
            and batch >= self._last_batch
            and not self.model.stop_training
        ):
            self.model.stop_training = _END_OF_EPOCH

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._end_shortened_epoch()

    def on_train_end(self, logs=None):
        self._end_shortened_epoch()

    def _end_shortened_epoch(self) -> None:
        self._skipped, self._last_batch = 0, None
        if self.model.stop_training is _END_OF_EPOCH:
            self.model.stop_training = False


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Sets `state.epoch` at the end of every epoch to the epochs done across restarts."""

    def __init__(self, state) -> None:
        super().__init__()
        self.backend = keras.backend
        self.state = state
        # Keras counts a fit's epochs from 0; the state counts them across restarts.
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # One more than the epoch that ended: a restart after state.batch went back to 0 starts
        # the next epoch, not this one again.
        self.state.epoch = self.initial_epoch + epoch + 1
