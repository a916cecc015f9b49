"""DistributedOptimizer for Keras 3 optimizers, and load_model.

Keras 3 funnels every update through `Optimizer.apply(grads, trainable_variables)` (apply_gradients
calls it, and so does model.fit's train step). The distributed optimizer is a copy of the user's
optimizer (from its config) whose `apply` first averages the gradients across ranks, in one op, and
then runs the optimizer's own `apply` (clipping, weight decay, loss-scale handling, gradient
accumulation and the update itself all see the averaged gradients).

Why an instance attribute and not a generated subclass (as Horovod does): the optimizer's class
stays the user's class, so a saved model serialises exactly as a non-distributed one and loads
with plain `keras.models.load_model` (for inference without scaleout); `load_model` below loads
it and makes its optimizer distributed again. isinstance checks and get_config are unchanged.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Optional

import keras

from scaleout._core import Average, resolve_op
from scaleout._semantics import predivided
from scaleout.tensorflow._collectives import _not_converted, check_device
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._gradients import reduce_gradients

__all__ = ["DistributedOptimizer", "load_model", "is_distributed"]


@dataclass(frozen=True)
class _Settings:
    prefix: str
    op: int
    compression: Any
    sparse_as_dense: bool
    gradient_predivide_factor: float


@_not_converted
def _distributed_apply(self, grads, trainable_variables=None):
    settings: _Settings = self._scaleout_settings
    grads = list(grads)
    if trainable_variables is not None:
        trainable_variables = list(trainable_variables)
        variables = trainable_variables
    elif getattr(self, "built", False):
        variables = list(self._trainable_variables)
    else:  # Keras raises the right error for this below
        variables = [None] * len(grads)
    if grads:
        grads = reduce_gradients(grads, variables, settings.prefix, op=settings.op,
                                 compression=settings.compression,
                                 sparse_as_dense=settings.sparse_as_dense,
                                 gradient_predivide_factor=settings.gradient_predivide_factor)
    return type(self).apply(self, grads, trainable_variables)


def is_distributed(optimizer) -> bool:
    """True for an optimizer returned by DistributedOptimizer (or made so by load_model)."""
    return getattr(optimizer, "_scaleout_settings", None) is not None


def _make_distributed(optimizer, settings: _Settings):
    # Set through object.__setattr__: the settings and the method are not optimizer state for
    # Keras's tracker to record.
    object.__setattr__(optimizer, "_scaleout_settings", settings)
    object.__setattr__(optimizer, "apply", types.MethodType(_distributed_apply, optimizer))
    return optimizer


def _settings(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
              gradient_predivide_factor, op, backward_passes_per_step,
              average_aggregated_gradients) -> _Settings:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), "
                        f"not {type(optimizer).__name__}")
    if is_distributed(optimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    if backward_passes_per_step != 1 or average_aggregated_gradients:
        raise NotImplementedError(
            "backward_passes_per_step: use Keras's own gradient accumulation instead, "
            "e.g. keras.optimizers.SGD(..., gradient_accumulation_steps=k); every micro-batch's "
            "gradients are then averaged across ranks before they are accumulated")
    for device in (device_dense, device_sparse):
        if device:
            check_device(device, "DistributedOptimizer")
    op = resolve_op(op, None)
    predivided(op, float(gradient_predivide_factor), 1)  # validates the combination
    return _Settings(prefix=name or f"Distributed{type(optimizer).__name__}", op=op,
                     compression=compression, sparse_as_dense=bool(sparse_as_dense),
                     gradient_predivide_factor=float(gradient_predivide_factor))


def DistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression=Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: int = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups=None):
    """Returns a copy of the Keras optimizer `optimizer` that averages gradients across ranks
    before every update:

        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
        model.compile(optimizer=opt, loss=..., jit_compile=False)

    Works with any Keras 3 optimizer (SGD, Adam, AdamW, ..., with learning-rate schedules), with
    model.fit and with custom loops calling apply_gradients. `op`: Average or Sum; `compression`:
    Compression.none / fp16 / bf16; `sparse_as_dense`: reduce tf.IndexedSlices densely;
    `gradient_predivide_factor`: see DistributedGradientTape. For mixed precision, wrap the
    keras.optimizers.LossScaleOptimizer (so every rank checks the same averaged gradients).
    `device_*`, `num_groups`, `groups` are accepted for Horovod compatibility (the core fuses
    all gradients of a step anyway). XLA: compile the model with jit_compile=False.
    """
    settings = _settings(optimizer, name, device_dense, device_sparse, compression,
                         sparse_as_dense, gradient_predivide_factor, op,
                         backward_passes_per_step, average_aggregated_gradients)
    copy = type(optimizer).from_config(optimizer.get_config())
    return _make_distributed(copy, settings)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, **distributed_kwargs):
    """keras.models.load_model, with the model's optimizer (and its saved state) made
    distributed. `custom_optimizers`: optimizer classes of your own that the file refers to;
    `distributed_kwargs`: as for DistributedOptimizer."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        settings = _settings(optimizer, distributed_kwargs.pop("name", None),
                             distributed_kwargs.pop("device_dense", ""),
                             distributed_kwargs.pop("device_sparse", ""), compression,
                             distributed_kwargs.pop("sparse_as_dense", False),
                             distributed_kwargs.pop("gradient_predivide_factor", 1.0),
                             distributed_kwargs.pop("op", Average),
                             distributed_kwargs.pop("backward_passes_per_step", 1),
                             distributed_kwargs.pop("average_aggregated_gradients", False))
        if distributed_kwargs:
            raise TypeError(f"load_model got unknown arguments {sorted(distributed_kwargs)}")
        _make_distributed(optimizer, settings)
    return model
