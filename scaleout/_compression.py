"""The compression classes, one factory for every framework: Compression.none, fp16, bf16 and
topk (scaleout._topk), built from a framework's 16-bit dtypes and its is-floating and cast
operations."""

from __future__ import annotations

from typing import Any, Callable, Tuple

from scaleout._topk import TopK

__all__ = ["Compressor", "NoneCompressor", "make_compression"]


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


def _cast_compressor(
    name: str,
    wire_dtype: Any,
    is_floating: Callable[[Any], bool],
    cast: Callable[[Any, Any], Any],
    doc: str,
) -> type:
    """A compressor sending floating-point tensors as `wire_dtype` (the context is the original
    dtype); integer and bool tensors pass untouched. The core reduces float16 and bfloat16 in
    float32 and rounds once, so only the inputs and the result are rounded."""

    def compress(cls, tensor):
        if is_floating(tensor) and tensor.dtype != wire_dtype:
            return cast(tensor, wire_dtype), tensor.dtype
        return tensor, None

    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cast(tensor, ctx)

    return type(
        name,
        (Compressor,),
        {
            "__doc__": doc,
            "wire_dtype": wire_dtype,
            "compress": classmethod(compress),
            "decompress": classmethod(decompress),
        },
    )


def make_compression(
    module: str,
    float16: Any,
    bfloat16: Any,
    is_floating: Callable[[Any], bool],
    cast: Callable[[Any, Any], Any],
):
    """The `Compression` namespace of a framework (none, fp16, bf16, topk) and its two
    compressor classes, from the framework's two 16-bit dtypes and its is-floating and cast
    operations. `topk(density, ...)` makes a TopK (scaleout/_topk.py), for the distributed
    optimizers and gradient tape only."""
    fp16 = _cast_compressor(
        "FP16Compressor",
        float16,
        is_floating,
        cast,
        "Sends floating-point tensors as float16 (half the bytes of float32; range up to 65504).",
    )
    bf16 = _cast_compressor(
        "BF16Compressor",
        bfloat16,
        is_floating,
        cast,
        "Sends floating-point tensors as bfloat16 (half the bytes, float32's "
        "range, 8-bit mantissa).",
    )
    for cls in (fp16, bf16):
        cls.__module__ = module
    compression = type(
        "Compression",
        (),
        {
            "__doc__": "The compression choices: Compression.none, Compression.fp16, "
            "Compression.bf16, and Compression.topk(density=0.01, "
            "momentum_correction=False, warmup_steps=0) for gradients.",
            "__module__": module,
            "none": NoneCompressor,
            "fp16": fp16,
            "bf16": bf16,
            "topk": TopK,
        },
    )
    return compression, fp16, bf16
