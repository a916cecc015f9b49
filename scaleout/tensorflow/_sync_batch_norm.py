"""SyncBatchNormalization: Keras batch normalization with statistics over the global batch."""

from __future__ import annotations

import keras
import tensorflow as tf

from scaleout._native import Sum
from scaleout._runtime import size
from scaleout.tensorflow._collectives import allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training-mode mean and variance are those of the
    batch across all ranks, as Horovod's SyncBatchNormalization: one Sum allreduce of the
    per-rank sums of x and x**2 and of the element count, so ranks may hold batches of different
    sizes (Horovod assumes equal ones; for equal batches the results agree). Differentiable:
    gradients flow through the allreduce. In inference, or on one rank, it is plain batch
    normalization. `fused` must be False (Horovod's rule); masks are supported.

    Each layer's allreduce is named after its Keras name (unique per model when built the same
    way on every rank)."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(**kwargs)  # Keras names it sync_batch_normalization, _1, _2, ...

    def _moments(self, inputs, mask):
        if size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.cast(
                tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)), inputs.dtype
            )
        local = tf.stack(
            [
                tf.reduce_sum(inputs * weights, axes),
                tf.reduce_sum(tf.square(inputs) * weights, axes),
                tf.reduce_sum(weights, axes),
            ]
        )
        total = allreduce(local, op=Sum, name=f"{self.name}.moments")
        count = tf.maximum(total[2], keras.backend.epsilon())
        mean = total[0] / count
        variance = tf.maximum(total[1] / count - tf.square(mean), 0.0)
        return mean, variance
