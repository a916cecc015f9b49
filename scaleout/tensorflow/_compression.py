"""Gradient compression for the wire: floating-point tensors are cast to a 16-bit type before the
reduction and back after it. Integer and bool tensors pass untouched.

The core reduces float16 and bfloat16 in float32 and rounds once, so only the inputs and the
result are rounded, not every partial sum. The casts are TensorFlow ops, so compression works
the same eagerly and inside tf.function.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor:
    """Interface: compress(tensor) -> (tensor for the wire, context); decompress(tensor, context)
    -> tensor in the original dtype."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor goes to the core as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: tf.DType

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx: Optional[tf.DType]):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes of float32; range up to 65504)."""
    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (half the bytes, float32's range, 8-bit
    mantissa)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The compression choices: Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
