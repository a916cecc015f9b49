"""Averaging gradients across ranks: DistributedGradientTape, and the reduction it shares with the
Keras DistributedOptimizer.

All gradients of a step go to the core in one op (submitted together, then waited for together),
so the core fuses them into a few large messages. Names come from the gradient's position and its
variable's name, so they are the same on every rank and in every step.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

import scaleout as _so
from scaleout._core import Average, Sum, resolve_op
from scaleout._errors import InvalidArgumentError
from scaleout._semantics import predivided
from scaleout.tensorflow._collectives import (_not_converted, _variable_label, as_tensor,
                                              check_device, request, run_batch)
from scaleout.tensorflow._compression import Compression

__all__ = ["DistributedGradientTape", "reduce_gradients"]


@_not_converted
def reduce_gradients(grads: Sequence[Any], sources: Sequence[Any], prefix: str,
                     op: int = Average, compression=Compression.none,
                     sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0) -> List[Any]:
    """Reduces every gradient across ranks in one op; None stays None. A tf.IndexedSlices is
    gathered (values and indices) unless `sparse_as_dense`, which reduces it as a dense tensor."""
    op = resolve_op(op, None)
    size = _so.size()
    wire_op, prescale, postscale = predivided(op, float(gradient_predivide_factor), size)

    requests, inputs, plan = [], [], []
    for i, (grad, source) in enumerate(zip(grads, sources)):
        if grad is None:
            plan.append(None)
            continue
        label = f"{prefix}.{i}"
        var_label = "" if isinstance(source, tf.Tensor) else _variable_label(source)
        if var_label:
            label = f"{label}.{var_label}"
        if isinstance(grad, tf.IndexedSlices) and sparse_as_dense:
            grad = tf.convert_to_tensor(grad)
        if isinstance(grad, tf.IndexedSlices):
            if op not in (Sum, Average):
                raise InvalidArgumentError(
                    f"sparse gradient of {label}: tf.IndexedSlices are reduced with Sum or "
                    "Average; pass sparse_as_dense=True for other ops")
            values, ctx = compression.compress(as_tensor(grad.values, "gradient"))
            requests += [request("allgather", f"{label}.values"),
                         request("allgather", f"{label}.indices")]
            inputs += [values, as_tensor(grad.indices, "gradient")]
            plan.append(("sparse", ctx, grad.dense_shape))
        else:
            wire, ctx = compression.compress(as_tensor(grad, "gradient"))
            requests.append(request("allreduce", label, wire_op, prescale, postscale))
            inputs.append(wire)
            plan.append(("dense", ctx, None))

    outs = iter(run_batch(requests, inputs, "scaleout_reduce_gradients"))
    sparse_scale = 1.0 / size if op == Average else 1.0
    reduced = []
    for step in plan:
        if step is None:
            reduced.append(None)
            continue
        kind, ctx, dense_shape = step
        if kind == "dense":
            reduced.append(compression.decompress(next(outs), ctx))
            continue
        values = compression.decompress(next(outs), ctx)
        indices = next(outs)
        if sparse_scale != 1.0:
            values = values * tf.cast(sparse_scale, values.dtype)
        reduced.append(tf.IndexedSlices(values, indices, dense_shape))
    return reduced


class DistributedGradientTape(tf.GradientTape):
    """Wraps a tf.GradientTape so that gradient() returns gradients averaged across ranks.

        with tf.GradientTape() as tape:
            loss = ...
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    `op`: Average (default) or Sum. `compression`: Compression.none / fp16 / bf16.
    `sparse_as_dense`: reduce tf.IndexedSlices gradients as dense tensors instead of gathering
    them. `gradient_predivide_factor`: divide by f before the sum and by size / f after it.
    `device_dense`, `device_sparse`, `num_groups` and `groups` are accepted for Horovod
    compatibility: tensors are reduced on the host, and the core fuses every gradient of the
    call that fits its buffer anyway.
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "",
                 device_sparse: str = "", compression=Compression.none,
                 sparse_as_dense: bool = False, op: int = Average,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                 name: Optional[str] = None):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, not "
                            f"{type(gradtape).__name__}")
        for device in (device_dense, device_sparse):
            if device:
                check_device(device, "DistributedGradientTape")
        # Take over the recorded tape's state (not a copy of the recording), so this object is
        # the tape: it can be used instead of it, also as a context manager.
        self.__dict__.update(gradtape.__dict__)
        self._scaleout_op = resolve_op(op, None)
        predivided(self._scaleout_op, float(gradient_predivide_factor), 1)  # validates
        self._scaleout_compression = compression
        self._scaleout_sparse_as_dense = bool(sparse_as_dense)
        self._scaleout_predivide = float(gradient_predivide_factor)
        self._scaleout_prefix = name or "DistributedGradientTape"

    @_not_converted
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduced = reduce_gradients(flat_grads, flat_sources, self._scaleout_prefix,
                                   op=self._scaleout_op,
                                   compression=self._scaleout_compression,
                                   sparse_as_dense=self._scaleout_sparse_as_dense,
                                   gradient_predivide_factor=self._scaleout_predivide)
        return tf.nest.pack_sequence_as(grads, reduced)
