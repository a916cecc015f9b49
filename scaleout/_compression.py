"""Gradient compression for the wire, shared by the framework shims: floating-point tensors are
cast to a 16-bit type before the reduction and cast back after it; integer and bool tensors pass
untouched. The core reduces float16 and bfloat16 in float32 and rounds once, so only the inputs
and the result are rounded, not every partial sum.

A shim supplies two framework operations (is_floating, cast) by subclassing CastCompressor.
"""
from __future__ import annotations

from typing import Any, Tuple

__all__ = ["Compressor", "NoneCompressor", "CastCompressor"]


class Compressor:
    """Interface: compress(tensor) -> (tensor for the wire, context); decompress(tensor, context)
    -> tensor in the original dtype."""

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor goes to the core as it is."""

    @classmethod
    def compress(cls, tensor):
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor


class CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype`; the context is the original dtype."""

    wire_dtype: Any = None

    @staticmethod
    def is_floating(tensor) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.is_floating(tensor) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)
