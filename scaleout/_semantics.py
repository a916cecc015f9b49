"""What each collective means, written once for every front end: the reduce ops it accepts, its
gradient (Horovod's definitions), the error raised where a gradient is not defined, gradient
predivision, and the compression classes.

The gradient rules are functions over a small set of primitives a front end supplies (`Ops`):
scaleout.torch passes torch tensors, scaleout.tensorflow passes the numpy arrays its gradient ops
receive. So torch and TensorFlow compute the same gradient by construction; tests check both
against the same expected values (tests/mp/gradients_*.py).

Convention (Horovod's): the gradient a collective hands back on each rank combines every rank's
output gradient the way Horovod does, so that a data-parallel optimizer that then averages
parameter gradients sees what it would see under Horovod. Backward collectives are named after
the forward one ("<name>.grad"), so ranks match them whatever order autograd runs them in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Tuple

from scaleout import _basics, _process_sets
from scaleout._core import (OP_NAMES, Average, Handle, Max, Min, Product, Sum, synchronize,
                            wait_all)
from scaleout._errors import InvalidArgumentError, NoGradientError

__all__ = ["Collective", "COLLECTIVES", "Ops", "check_gradient_op", "gradient", "grad_name",
           "predivided", "Compressor", "NoneCompressor", "make_compression"]

ALL_OPS = (Average, Sum, Min, Max, Product)


@dataclass(frozen=True)
class Collective:
    """One row of the table."""
    name: str
    ops: Tuple[int, ...]           # reduce ops the forward accepts (the core checks them)
    gradient_ops: Tuple[int, ...]  # ops for which the gradient is defined
    gradient: str                  # Horovod's definition, in words (the code is below)


COLLECTIVES = {c.name: c for c in (
    Collective("allreduce", ALL_OPS, (Average, Sum),
               "an allreduce of the output gradients with the same op and scale factors"),
    Collective("allgather", (), (),
               "this rank's rows of the Average-allreduce of the output gradients"),
    Collective("broadcast", (), (),
               "on the root, the Average-allreduce of the output gradients; zeros elsewhere"),
    Collective("reducescatter", ALL_OPS, (Average, Sum),
               "the allgather of the output gradients, times size() for Sum, times the scale "
               "factors"),
    Collective("alltoall", (), (),
               "the output gradients sent back the way the rows came (the received splits)"),
)}
def check_gradient_op(what: str, op: int) -> None:
    """Raises NoGradientError (an InvalidArgumentError and a NotImplementedError, the classes
    torch and TensorFlow users catch) when the gradient of `what` with `op` is not defined."""
    if op not in COLLECTIVES[what].gradient_ops:
        raise NoGradientError(
            f"the gradient of {what} is defined for the Average and Sum ops only, not "
            f"{OP_NAMES.get(op, op)}")


def grad_name(name: str) -> str:
    return f"{name}.grad"


class Ops:
    """The primitives a front end supplies for the gradient rules, on its own tensor type, for
    the collectives of one process set (the core's id, 0: the global set). The *_async methods
    return scaleout Handles on that set."""

    def __init__(self, process_set: int = 0) -> None:
        self.process_set = process_set

    def set_rank(self) -> int:
        """This rank's place in the set (rows, offsets and splits follow the set's order)."""
        return _process_sets.set_rank(self.process_set)

    def set_size(self) -> int:
        return _process_sets.set_size(self.process_set)

    def allreduce_async(self, x, name: str, op: int, prescale: float,
                        postscale: float) -> Handle:
        raise NotImplementedError

    def allgather_async(self, x, name: str) -> Handle:
        raise NotImplementedError

    def alltoall(self, x, splits, name: str) -> Tuple[Any, Any]:
        """(received, received_splits)"""
        raise NotImplementedError

    def rows_tensor(self, rows: int):
        """A one-element int64 tensor holding `rows` (allgathered to find row offsets)."""
        raise NotImplementedError

    def narrow(self, x, start: int, length: int):
        """Rows [start, start + length) of x."""
        raise NotImplementedError

    def zeros_like(self, x):
        raise NotImplementedError

    def scale(self, x, factor: float):
        raise NotImplementedError


def _allreduce_grad(ops: Ops, dy, name: str, op: int, prescale: float = 1.0,
                    postscale: float = 1.0):
    check_gradient_op("allreduce", op)
    return synchronize(ops.allreduce_async(dy, grad_name(name), op, prescale, postscale))


def _allgather_grad(ops: Ops, dy, name: str, rows: int):
    reduced, counts = wait_all([
        ops.allreduce_async(dy, grad_name(name), Average, 1.0, 1.0),
        ops.allgather_async(ops.rows_tensor(rows), f"{grad_name(name)}.rows")])
    offset = int(sum(int(c) for c in list(counts)[:ops.set_rank()]))
    return ops.narrow(reduced, offset, rows)


def _broadcast_grad(ops: Ops, dy, name: str, root_rank: int):
    reduced = synchronize(ops.allreduce_async(dy, grad_name(name), Average, 1.0, 1.0))
    # root_rank is the job's rank, as in the forward (Horovod's convention).
    return reduced if _basics.rank() == root_rank else ops.zeros_like(reduced)


def _reducescatter_grad(ops: Ops, dy, name: str, op: int, prescale: float = 1.0,
                        postscale: float = 1.0):
    check_gradient_op("reducescatter", op)
    gathered = synchronize(ops.allgather_async(dy, grad_name(name)))
    factor = prescale * postscale * (ops.set_size() if op == Sum else 1)
    return gathered if factor == 1.0 else ops.scale(gathered, factor)


def _alltoall_grad(ops: Ops, dy, name: str, received_splits):
    back, _ = ops.alltoall(dy, received_splits, grad_name(name))
    return back


_GRADIENTS: dict = {"allreduce": _allreduce_grad, "allgather": _allgather_grad,
                    "broadcast": _broadcast_grad, "reducescatter": _reducescatter_grad,
                    "alltoall": _alltoall_grad}


def gradient(what: str) -> Callable[..., Any]:
    """The gradient rule of collective `what`: rule(ops, dy, name, ...forward arguments)."""
    return _GRADIENTS[what]


# ---- gradient predivision (DistributedOptimizer, DistributedGradientTape) ----

def predivided(op: int, gradient_predivide_factor: float, world_size: int
               ) -> Tuple[int, float, float]:
    """(op, prescale, postscale) for reducing gradients: with a predivide factor f, Average
    becomes a Sum of g / f multiplied by f / size afterwards (smaller partial sums in low
    precision). Raises for a factor with another op, or a non-positive one."""
    if not gradient_predivide_factor > 0:
        raise InvalidArgumentError("gradient_predivide_factor must be positive")
    if gradient_predivide_factor == 1.0:
        return op, 1.0, 1.0
    if op != Average:
        raise InvalidArgumentError("gradient_predivide_factor needs op=Average")
    return Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / world_size


# ---- compression (one factory for every framework) ----

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


def _cast_compressor(name: str, wire_dtype: Any, is_floating: Callable[[Any], bool],
                     cast: Callable[[Any, Any], Any], doc: str) -> type:
    """A compressor sending floating-point tensors as `wire_dtype` (the context is the original
    dtype); integer and bool tensors pass untouched. The core reduces float16 and bfloat16 in
    float32 and rounds once, so only the inputs and the result are rounded."""

    def compress(cls, tensor):
        if is_floating(tensor) and tensor.dtype != wire_dtype:
            return cast(tensor, wire_dtype), tensor.dtype
        return tensor, None

    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cast(tensor, ctx)

    return type(name, (Compressor,), {"__doc__": doc, "wire_dtype": wire_dtype,
                                      "compress": classmethod(compress),
                                      "decompress": classmethod(decompress)})


def make_compression(module: str, float16: Any, bfloat16: Any,
                     is_floating: Callable[[Any], bool], cast: Callable[[Any, Any], Any]):
    """The `Compression` namespace of a framework (none, fp16, bf16, topk) and its two
    compressor classes, from the framework's two 16-bit dtypes and its is-floating and cast
    operations. `topk(density, ...)` makes a TopK (scaleout/_topk.py), for the distributed
    optimizers and gradient tape only."""
    from scaleout._topk import TopK
    fp16 = _cast_compressor("FP16Compressor", float16, is_floating, cast,
                            "Sends floating-point tensors as float16 (half the bytes of float32; "
                            "range up to 65504).")
    bf16 = _cast_compressor("BF16Compressor", bfloat16, is_floating, cast,
                            "Sends floating-point tensors as bfloat16 (half the bytes, float32's "
                            "range, 8-bit mantissa).")
    for cls in (fp16, bf16):
        cls.__module__ = module
    compression = type("Compression", (), {
        "__doc__": "The compression choices: Compression.none, Compression.fp16, "
                   "Compression.bf16, and Compression.topk(density=0.01, "
                   "momentum_correction=False, warmup_steps=0) for gradients.",
        "__module__": module, "none": NoneCompressor, "fp16": fp16, "bf16": bf16,
        "topk": TopK})
    return compression, fp16, bf16
