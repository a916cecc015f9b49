"""Keras callbacks for data-parallel training, as Horovod 0.28.1's
horovod.tensorflow.keras.callbacks: BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateScheduleCallback, LearningRateWarmupCallback, BestModelCheckpoint; and scaleout's own
LocalSGDCallback (Note [Local SGD]).

They run between steps, in Python, so they use scaleout's numpy-level collectives directly.
Horovod's hooks are kept: the broadcast happens at the end of the first batch, learning rates are
set at the beginning of batches, metrics are averaged at the end of epochs.
"""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Union

import keras
import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout._errors import InvalidArgumentError
from scaleout._process_sets import global_process_set
from scaleout.tensorflow._arguments import check_device
from scaleout.tensorflow._collectives import broadcast_variables
from scaleout.tensorflow._local_sgd import LocalSGD
from scaleout.tensorflow.keras._optimizer import is_distributed, local_steps

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
    "LocalSGDCallback",
]


def _as_variable_list(local_variables):
    if local_variables is None:
        return []
    if isinstance(local_variables, (tf.Variable, keras.Variable)):
        return [local_variables]
    local_variables = list(local_variables)
    if not all(isinstance(v, (tf.Variable, keras.Variable)) for v in local_variables):
        raise ValueError("All local variables must be variables (tf.Variable or keras.Variable)")
    return local_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Sets every rank's model variables and optimizer variables to root_rank's, once, so that
    all ranks continue from the same point (random initialisation differs per rank, and a
    checkpoint may have been restored on root_rank only).

    As Horovod's, the broadcast happens at the end of the first batch of the first fit() (the
    moment at which Horovod could be sure the optimizer's slots exist). So the first update is
    computed by each rank from its own initial weights, and root_rank's result is then copied
    everywhere. To start the very first step from identical weights, broadcast before fit():
    `hvd.broadcast_variables(model.weights, root_rank=0)`.

    Broadcasts model.weights (trainable and not, e.g. batch-norm statistics) except
    `local_variables` (a variable or a list of them, which stay per rank; they may also be
    registered later with register_local_var), then the optimizer's variables (iteration count,
    learning rate, slots). Random-seed state is not broadcast. `device`: '' or a CPU device;
    scaleout reduces host memory, so a GPU device raises.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables=None):
        super().__init__()
        check_device(device, "BroadcastGlobalVariablesCallback")
        self.root_rank = int(root_rank)
        self.device = device
        self.broadcast_done = False
        self._local_vars = {}
        for var in _as_variable_list(local_variables):
            self.register_local_var(var)

    def register_local_var(self, var) -> None:
        """Registers a variable as local to this rank: it is not broadcast."""
        self._local_vars[id(var)] = var

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        # model.weights: model.variables also holds Keras 3's random-seed states, which must
        # stay per rank (Dropout masks, augmentations)
        variables = [v for v in self.model.weights if id(v) not in self._local_vars]
        broadcast_variables(
            variables, self.root_rank, name="BroadcastGlobalVariablesCallback.model"
        )
        optimizer = getattr(self.model, "optimizer", None)
        # Compression.topk's residuals are per rank (what each has not sent): not broadcast.
        shared = [
            v
            for v in (optimizer.variables if optimizer is not None else [])
            if not getattr(v, "_scaleout_per_rank", False)
        ]
        if shared:
            broadcast_variables(
                shared, self.root_rank, name="BroadcastGlobalVariablesCallback.optimizer"
            )
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces the metrics in `logs` (loss, metrics, val_*, and
    anything else numeric another callback put there before it) by their average over all ranks,
    in sorted name order, as Horovod's. History, the progress bar, checkpoints, early stopping and
    ReduceLROnPlateau then see one value: put this callback before them. Batch-level logs are not
    averaged (nor are they in Horovod). Non-numeric entries are left alone (Horovod would fail on
    them). `device`: '' or a CPU device; a GPU device raises."""

    def __init__(self, device: str = ""):
        super().__init__()
        check_device(device, "MetricAverageCallback")
        self.device = device

    def _average_metrics_in_place(self, logs) -> None:
        if not logs:
            return
        keys = sorted(
            k
            for k, v in logs.items()
            if isinstance(v, numbers.Number) or (np.ndim(v) == 0 and _numeric(v))
        )
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = _so.allreduce(values, name="MetricAverageCallback", op=_so.Average)
        for key, value in zip(keys, averaged.tolist()):
            logs[key] = value

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _numeric(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _innermost(optimizer):
    """The optimizer that holds the hyper-parameters: the inner one of a LossScaleOptimizer
    (which compile() adds under a mixed_float16 policy)."""
    while isinstance(getattr(optimizer, "inner_optimizer", None), keras.optimizers.Optimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _get_lr(optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _set_lr(optimizer, value: float) -> None:
    optimizer = _innermost(optimizer)
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            "this callback sets the learning rate; it cannot be combined with an "
            "optimizer whose learning rate is a LearningRateSchedule"
        )
    optimizer.learning_rate = value


class _Momentum(float):
    """An optimizer's `momentum` that the train step reads from a variable.

    Keras 3 optimizers keep momentum as a Python float, which tf.function bakes into the traced
    train step as a constant. Momentum correction must change it for single batches, so the
    callback swaps it for this float: it compares, prints and serialises (get_config, saving) as
    the configured value, and wherever the update turns it into a tensor it reads `variable`.
    `dtype = float` makes Keras's type promotion treat it as a Python scalar (weakly typed)."""

    dtype = float

    def __new__(cls, value: float):
        self = super().__new__(cls, value)
        with tf.init_scope():
            self.variable = tf.Variable(
                float(value), dtype=tf.float64, trainable=False, name="momentum_correction"
            )
        return self

    def __tf_tensor__(self, dtype=None, name=None):
        value = self.variable.read_value()
        return value if dtype is None else tf.cast(value, dtype)

    def __reduce__(self):  # copies and pickles are plain floats
        return (float, (float(self),))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` while
    start_epoch <= epoch < end_epoch (end_epoch None: no end), as Horovod's:

    - `multiplier` a number: exponential decay, `multiplier ** (epoch - start_epoch)`;
      a callable: called with the epoch (absolute, not relative to start_epoch).
    - `staircase=True`: set at the beginning of the first batch of every epoch in range, with
      the integer epoch. `staircase=False`: set at the beginning of every batch, with the
      fractional epoch `epoch + batch / steps_per_epoch`; steps_per_epoch is taken from fit()
      (or samples // batch_size) when not given. Whether an epoch is in range is decided on the
      integer epoch.
    - `momentum_correction=True`: for optimizers with a `momentum` (SGD, RMSprop), momentum is
      multiplied by new_lr / old_lr for the batch at which the rate changes and restored at the
      end of that batch (Goyal et al., "Accurate, Large Minibatch SGD"). To make that possible
      under Keras 3, the optimizer's float momentum is replaced at the start of training by a
      float that the train step reads from a variable (see _Momentum); its value and config
      stay the same. Unlike Horovod, no correction is made when the old rate is 0 (Horovod
      would set momentum to inf).
    - The rate in force at the end of every epoch is written into `logs['lr']` (Horovod's key).
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: Union[float, Callable[[float], float]],
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        params = self.params or {}
        if params.get("steps"):
            return params["steps"]
        if params.get("samples") and params.get("batch_size"):
            return params["samples"] // params["batch_size"]
        raise ValueError(
            f"{type(self).__name__}: could not find the number of steps per epoch "
            "(fit() does not know it for this data); pass steps_per_epoch"
        )

    def _momentum(self) -> Optional[_Momentum]:
        momentum = getattr(_innermost(self.model.optimizer), "momentum", None)
        return momentum if isinstance(momentum, _Momentum) else None

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(optimizer, new_lr)
        momentum = self._momentum()
        if momentum is not None and self.momentum_correction and old_lr != 0:
            self.restore_momentum = float(momentum)
            momentum.variable.assign(self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum:
            self._momentum().variable.assign(self.restore_momentum)
        self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()
        optimizer = _innermost(getattr(self.model, "optimizer", None))
        momentum = getattr(optimizer, "momentum", None)
        if (
            self.momentum_correction
            and isinstance(momentum, numbers.Real)
            and not isinstance(momentum, (_Momentum, bool))
        ):
            optimizer.momentum = _Momentum(momentum)
            # The train step may already be traced with the constant momentum.
            self.model.make_train_function(force=True)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup from `initial_lr / size` to `initial_lr` over `warmup_epochs` epochs
    (Goyal et al., "Accurate, Large Minibatch SGD"), as Horovod's: at the beginning of batch b of
    epoch e < warmup_epochs the rate is

        initial_lr / size * (t * (size - 1) / warmup_epochs + 1),  t = e + (b + 1) / steps_per_epoch

    so the first batch already runs slightly above initial_lr / size and the last batch of the
    warmup runs at exactly initial_lr. Compatibility note: with a non-integer warmup_epochs,
    Horovod (and so this callback) keeps ramping through the whole last started epoch, past
    initial_lr, and prints no message. `verbose > 0`: rank 0 prints a line to stdout at the end of
    the warmup. momentum_correction and steps_per_epoch as LearningRateScheduleCallback.
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
    ):
        if not warmup_epochs > 0:
            raise ValueError(f"warmup_epochs must be positive, not {warmup_epochs}")

        def multiplier(epoch: float) -> float:
            # As Horovod: one batch ahead, so that each epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            size = _so.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:  # on every such rank, as Horovod
            print(
                f"\nEpoch {epoch + 1}: learning rate warmup finished, learning rate "
                f"{_get_lr(self.model.optimizer):g}.",
                flush=True,
            )


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's BestModelCheckpoint: a keras.callbacks.ModelCheckpoint that keeps only the best
    model (save_best_only=True) by `monitor`. As in Horovod it takes no file path: set
    `callback.filepath` before fit() (Horovod's Spark estimator does), or pass `filepath=`
    (a scaleout addition; Keras 3 wants '.keras', or '.weights.h5' with save_weights_only).
    Like any checkpoint it saves on every rank that has it: add it on rank 0 only, and put
    MetricAverageCallback before it so that every rank's metric is the same."""

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq="epoch",
        filepath: Optional[str] = None,
    ):
        # Keras 3 checks the extension when constructed: give it a valid placeholder.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(
            filepath=filepath or placeholder,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
        )
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError(
                "BestModelCheckpoint: set its filepath (callback.filepath = "
                "'best.keras') before fit()"
            )
        super().on_train_begin(logs)


class LocalSGDCallback(keras.callbacks.Callback):
    """Local SGD for model.fit (Note [Local SGD]): each rank steps on its own gradients and the
    model's weights are averaged over the ranks every `period` batches, by a
    scaleout.tensorflow.LocalSGD (`self.local_sgd`).

    - period: batches between averaging rounds.
    - warmup_steps: the first batches are bulk-synchronous; the model's optimizer must then be a
      scaleout DistributedOptimizer, whose gradient reduction stops after them (the train
      function is traced again). Without warm-up the optimizer may be a plain one (a
      DistributedOptimizer's reduction stops at the start).
    - average_buffers: average the non-trainable floating-point weights too (BatchNormalization's
      moving mean and variance).
    - hierarchical: None (default) also averages among a machine's ranks after every batch where
      the job's allreduces are hierarchical; True requires that; False never.
    - process_set: the ranks that average together.
    - outer_optimizer: DiLoCo's outer optimizer, a Keras optimizer of its own (for example
      keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)); its anchor is the model at the
      warm-up's end, or without warm-up the first round's average.
    - staleness: bounded staleness, as scaleout.torch.LocalSGDOptimizer's (rounds made while the
      next batches run, taken `staleness` batches after they started).

    Start from the same weights everywhere (BroadcastGlobalVariablesCallback(0) before this
    one). The step count goes on across fit() calls; `average()` averages now (a round in
    flight taken first: before evaluating or saving); `state_dict()` / `load_state_dict()` carry
    what a resumed run needs.
    """

    def __init__(
        self,
        period: int,
        warmup_steps: int = 0,
        average_buffers: bool = True,
        hierarchical: Optional[bool] = None,
        process_set=global_process_set,
        outer_optimizer=None,
        staleness: int = 0,
    ):
        super().__init__()
        self.local_sgd = LocalSGD(
            None,
            period,
            warmup_steps,
            hierarchical,
            outer_optimizer,
            average_buffers,
            process_set,
            staleness,
            what="LocalSGDCallback",
        )
        self._saved = None

    def on_train_begin(self, logs=None):
        self.local_sgd.set_model(self.model)
        if self._saved is not None:  # load_state_dict() before fit()
            self.local_sgd.load_state_dict(self._saved)
            self._saved = None
        if self.local_sgd.bulk() and not is_distributed(_inner(self.model.optimizer)):
            raise InvalidArgumentError(
                "LocalSGDCallback: bulk-synchronous steps (warmup_steps, or period=1) need the "
                "model's optimizer to be a scaleout DistributedOptimizer"
            )
        if not self.local_sgd.bulk():
            self._stop_reducing()

    def on_train_batch_end(self, batch, logs=None):
        bulk = self.local_sgd.bulk()
        self.local_sgd.after_step()
        if bulk and not self.local_sgd.bulk():
            self._stop_reducing()

    def average(self) -> None:
        """Averages the model over the whole process set now."""
        self.local_sgd.average()

    def state_dict(self) -> dict:
        return self.local_sgd.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continues from a state_dict(); before fit() (no model yet), at fit()'s start."""
        if self.model is None:
            self._saved = state
            return
        self.local_sgd.set_model(self.model)
        self.local_sgd.load_state_dict(state)

    def _stop_reducing(self) -> None:
        """The optimizer reduces no more gradients from the next batch on."""
        if local_steps(_inner(self.model.optimizer)):
            self.model.make_train_function(force=True)


def _inner(optimizer):
    """The optimizer that applies the gradients: a LossScaleOptimizer's inner one (Keras's
    compile() wraps the optimizer in one under a mixed_float16 policy)."""
    return getattr(optimizer, "inner_optimizer", optimizer)
