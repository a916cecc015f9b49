"""Compression.none / fp16 / bf16 for TensorFlow tensors (built by scaleout._compression). The casts
are TensorFlow ops, so compression works the same eagerly and inside tf.function."""

import tensorflow as tf

from scaleout._compression import Compressor, NoneCompressor, make_compression

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression, FP16Compressor, BF16Compressor = make_compression(
    __name__,
    tf.float16,
    tf.bfloat16,
    is_floating=lambda t: t.dtype.is_floating,
    cast=lambda t, dtype: tf.cast(t, dtype),
)
