"""Compression.none / fp16 / bf16 for torch tensors (the logic is scaleout._compression's)."""
import torch

from scaleout._compression import CastCompressor, Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class _TorchCast(CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


class FP16Compressor(_TorchCast):
    """Sends floating-point tensors as float16 (half the bytes; range up to 65504)."""
    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """Sends floating-point tensors as bfloat16 (half the bytes, float32's range, 8-bit
    mantissa)."""
    wire_dtype = torch.bfloat16


class Compression:
    """The compression choices: Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
