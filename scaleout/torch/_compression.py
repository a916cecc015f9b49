"""Gradient compression for the wire: floating-point tensors are cast to a 16-bit type before
the reduction and cast back after it. Integer and bool tensors pass untouched.

The core reduces float16 and bfloat16 in float32 and rounds once, so only the inputs and the
result are rounded, not every partial sum.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor:
    """Interface: compress(tensor) -> (tensor for the wire, context); decompress(tensor, context)
    -> tensor in the original dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor goes to the core as it is (zero copy)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx: Optional[torch.dtype]):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes; range up to 65504)."""
    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (half the bytes, float32's range, 8-bit
    mantissa)."""
    wire_dtype = torch.bfloat16


class Compression:
    """The compression choices: Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
