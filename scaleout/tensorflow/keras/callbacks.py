"""Keras callbacks for data-parallel training: `hvd.callbacks.BroadcastGlobalVariablesCallback`,
`MetricAverageCallback`, `LearningRateScheduleCallback`, `LearningRateWarmupCallback`.

They run between steps, in Python, so they use scaleout's numpy-level collectives directly.
"""
from __future__ import annotations

import numbers
import sys
from typing import Callable, Optional, Union

import keras
import numpy as np

import scaleout as _so
from scaleout.tensorflow._collectives import broadcast_variables

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Sets every rank's model weights and optimizer state to root_rank's when training starts,
    so all ranks start from the same point (random initialisation differs per rank).

    Broadcasts model.weights (trainable and not, e.g. batch-norm statistics) and the optimizer's
    variables (step count, moments, learning rate). Keras 3 builds the optimizer before the
    first step, so both go before any update; an optimizer still unbuilt then is broadcast
    after the first batch. Random-seed state is not broadcast (dropout masks stay
    independent). Done once per callback object, at the first fit().
    """

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = int(root_rank)
        self.broadcast_done = False
        self._optimizer_pending = False

    def _broadcast_optimizer(self) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.variables:
            broadcast_variables(optimizer.variables, self.root_rank,
                                name="BroadcastGlobalVariablesCallback.optimizer")

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(self.model.weights, self.root_rank,
                            name="BroadcastGlobalVariablesCallback.model")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            self._broadcast_optimizer()
        else:
            self._optimizer_pending = optimizer is not None
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        if self._optimizer_pending:
            self._optimizer_pending = False
            self._broadcast_optimizer()


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces the epoch's metrics in `logs` (loss, metrics, val_*) by their average over all
    ranks, so that History, the progress bar, checkpoints and early stopping see one value.
    Put it before callbacks that read metrics."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items()
                      if isinstance(v, numbers.Number) or np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = _so.allreduce(values, name="MetricAverageCallback", op=_so.Average)
        for key, value in zip(keys, averaged.tolist()):
            logs[key] = value


def _get_lr(optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _set_lr(optimizer, value: float) -> None:
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError("this callback sets the learning rate; it cannot be combined with an "
                         "optimizer whose learning rate is a LearningRateSchedule")
    optimizer.learning_rate = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) for start_epoch <= epoch <
    end_epoch. `multiplier`: a number or a function of the epoch. staircase=True: changes at
    epoch starts (integer epochs); False: every batch, with the fractional epoch
    epoch + batch / steps_per_epoch (steps_per_epoch from fit() unless given).

    `momentum_correction` is accepted for Horovod compatibility and has no effect: a Keras 3
    optimizer's momentum is a constant compiled into the train step."""

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch: float) -> None:
        _set_lr(self.model.optimizer, self.initial_lr * float(self.multiplier(epoch)))

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}(staircase=False) needs steps_per_epoch "
                                 "when fit() does not know the number of steps per epoch")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase:
            return
        epoch = self.current_epoch + batch / self.steps_per_epoch
        if self._in_range(epoch):
            self._adjust(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from initial_lr / size up to initial_lr over the first
    warmup_epochs epochs, batch by batch (Goyal et al., "Accurate, Large Minibatch SGD"):
    initial_lr is the rate for the full data-parallel batch, typically lr * hvd.size()."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0):
        if warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be positive, not {warmup_epochs}")

        def multiplier(epoch: float) -> float:
            size = _so.size()
            return (1.0 + epoch * (size - 1) / warmup_epochs) / size

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == int(np.ceil(self.warmup_epochs)) - 1:
            # The last batch set the rate of the fraction before the end: finish the ramp.
            _set_lr(self.model.optimizer, self.initial_lr)
            if logs is not None:
                logs["learning_rate"] = self.initial_lr
            if self.verbose and _so.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished the learning-rate warmup, learning rate "
                      f"{self.initial_lr:g}", file=sys.stderr)
