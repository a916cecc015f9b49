"""Compression.none / fp16 / bf16 for torch tensors (built by scaleout._compression)."""

import torch

from scaleout._compression import Compressor, NoneCompressor, make_compression

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression, FP16Compressor, BF16Compressor = make_compression(
    __name__,
    torch.float16,
    torch.bfloat16,
    is_floating=lambda t: t.dtype.is_floating_point,
    cast=lambda t, dtype: t.to(dtype),
)
