"""Compression.none / fp16 / bf16 for TensorFlow tensors (the logic is scaleout._compression's).
The casts are TensorFlow ops, so compression works the same eagerly and inside tf.function."""
import tensorflow as tf

from scaleout._compression import CastCompressor, Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class _TensorFlowCast(CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class FP16Compressor(_TensorFlowCast):
    """Sends floating-point tensors as float16 (half the bytes of float32; range up to 65504)."""
    wire_dtype = tf.float16


class BF16Compressor(_TensorFlowCast):
    """Sends floating-point tensors as bfloat16 (half the bytes, float32's range, 8-bit
    mantissa)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The compression choices: Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
