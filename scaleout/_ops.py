"""Collectives on numpy arrays (and anything with the buffer protocol or DLPack).

Every collective has a name; the same name on every rank means the same collective. Without a
name, one is generated from a per-kind counter, so ranks must then call unnamed collectives in
the same order (as with Horovod).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from scaleout._core import (ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, DTYPE_CODES, JOIN,
                            REDUCESCATTER, Average, Handle, Max, Min, Product, Sum, auto_name,
                            group, poll, resolve_op, submit, synchronize)
from scaleout import _semantics
from scaleout._errors import InvalidArgumentError
from scaleout._process_sets import global_process_set, process_set_id

__all__ = ["Average", "Sum", "Min", "Max", "Product", "Handle", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
           "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join", "poll",
           "synchronize", "dtype_code", "as_array", "contiguous", "address", "allocator",
           "splits_array", "NUMPY_OPS", "numpy_ops"]

_CODE_BY_DTYPE: dict = {}


def dtype_code(dtype: Any) -> int:
    """The core's code for a numpy dtype (ml_dtypes' bfloat16 included)."""
    code = _CODE_BY_DTYPE.get(dtype)
    if code is not None:
        return code
    dt = np.dtype(dtype)
    if not dt.isnative:
        raise InvalidArgumentError(
            f"dtype {dt.str} is not in this machine's byte order; convert it first, e.g. "
            "array.astype(array.dtype.newbyteorder('='))")
    try:
        code = _CODE_BY_DTYPE[dtype] = DTYPE_CODES[dt.name]
        return code
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {dt.name} is not supported; scaleout reduces "
            f"{', '.join(DTYPE_CODES)}") from None


def as_array(obj: Any) -> np.ndarray:
    """A numpy view of an array-like (numpy arrays, the buffer protocol, DLPack, sequences)."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (np.generic, int, float, bool, list, tuple)):
        return np.asarray(obj)
    if hasattr(obj, "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            return np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError):
            pass
    return np.asarray(obj)


def contiguous(a: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array into a 1-d one.
    return a if a.flags.c_contiguous else a.copy(order="C")


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def allocator(dtype: np.dtype):
    """The result allocator of a core-owned result (allgather, alltoall, reducescatter): an
    array viewing the core's bytes (no copy; the array keeps them alive)."""
    def alloc(shape, buffer):
        return np.frombuffer(buffer, dtype).reshape(shape)
    return alloc


def _submit_array(collective: int, name: Optional[str], tensor, inplace: bool, op: int = Sum,
                  root: int = 0, prescale: float = 1.0, postscale: float = 1.0,
                  ps: int = 0) -> Handle:
    """allreduce / broadcast of an array-like, the result in a new array or in `tensor`."""
    if type(tensor) is np.ndarray:
        try:  # the common case: a C-contiguous array, in one call
            return submit(collective, name, tensor, None, None, None,
                          tensor if inplace else np.empty_like(tensor), None, op, root,
                          prescale, postscale, None, None, ps)
        except BufferError:
            pass  # not C-contiguous, read-only, or a dtype the buffer protocol cannot describe
    a = as_array(tensor)
    code = dtype_code(a.dtype)
    if inplace and not a.flags.writeable:
        raise InvalidArgumentError(f"in-place {'allreduce' if collective == ALLREDUCE else 'broadcast'}"
                                   " needs a writable array")
    src = contiguous(a)
    dst = src if inplace else np.empty(src.shape, src.dtype)
    return submit(collective, name, src, address(src), code, src.shape, dst, address(dst), op,
                  root, prescale, postscale, None, _written(a, tensor) if inplace else None, ps)


def _written(a: np.ndarray, tensor):
    """Finishes an in-place collective on `a` (the array behind `tensor`): copies the result
    back when it went through a contiguous stand-in; returns `tensor`."""
    def finish(result):
        if result is not a:
            a[...] = result
        return tensor
    return finish


def _submit_owned(collective: int, name: Optional[str], a: np.ndarray, op: int = Sum,
                  prescale: float = 1.0, postscale: float = 1.0, splits=None,
                  finish=None, ps: int = 0) -> Handle:
    """allgather / alltoall / reducescatter: the core owns the result until completion."""
    return submit(collective, name, a, address(a), dtype_code(a.dtype), a.shape,
                  allocator(a.dtype), None, op, 0, prescale, postscale, splits, finish, ps)


# ---- allreduce ----

def _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, inplace,
                     ps: int = 0) -> Handle:
    return _submit_array(ALLREDUCE, name, tensor, inplace, op, 0, prescale_factor,
                         postscale_factor, ps)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Starts reducing `tensor` across the ranks of `process_set` (default op Average);
    returns a Handle."""
    return _allreduce_async(tensor, name, resolve_op(op, average), prescale_factor,
                            postscale_factor, False, process_set_id(process_set, "allreduce"))


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> np.ndarray:
    """Reduces `tensor` across ranks and returns the result as a new array."""
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                       process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """In-place form of allreduce_async: the result is written into `tensor`."""
    return _submit_array(ALLREDUCE, name, tensor, True, resolve_op(op, average), 0,
                         prescale_factor, postscale_factor,
                         process_set_id(process_set, "allreduce_"))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set))


def _grouped(tensors, average, name, op, prescale_factor, postscale_factor, inplace,
             process_set) -> Handle:
    op = resolve_op(op, average)
    ps = process_set_id(process_set, "grouped_allreduce")
    base = auto_name(ALLREDUCE, name, ps)
    return group([_allreduce_async(t, f"{base}.{i}", op, prescale_factor, postscale_factor,
                                   inplace, ps) for i, t in enumerate(tensors)], base)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduces a list of tensors together (they are fused whenever they fit the buffer)."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, False,
                    process_set)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set) -> list:
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, True,
                    process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set) -> list:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather, broadcast, alltoall, reducescatter ----

def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank),
    in the order of the set's ranks."""
    a = contiguous(as_array(tensor))
    if a.ndim == 0:
        a = a.reshape(1)
    return _submit_owned(ALLGATHER, name, a, ps=process_set_id(process_set, "allgather"))


def allgather(tensor, name=None, process_set=global_process_set) -> np.ndarray:
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Starts sending root_rank's tensor to every rank of the set (root_rank is the job's
    rank, as in Horovod); the result is a new array."""
    return _submit_array(BROADCAST, name, tensor, False, Sum, root_rank,
                         ps=process_set_id(process_set, "broadcast"))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> np.ndarray:
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return _submit_array(BROADCAST, name, tensor, True, Sum, root_rank,
                         ps=process_set_id(process_set, "broadcast_"))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def splits_array(splits) -> Optional[np.ndarray]:
    """alltoall's splits as the C-contiguous int64 array the core reads (None stays None).
    Integers only: float or string splits are refused, not truncated or parsed."""
    if splits is None:
        return None
    if isinstance(splits, (str, bytes)):
        raise InvalidArgumentError(f"splits must be integers (rows per rank), not {splits!r}")
    array = np.asarray(splits)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise InvalidArgumentError(f"splits must be integers (rows per rank), not "
                                   f"{array.dtype} values {array.ravel()[:8].tolist()}")
    return np.ascontiguousarray(array.astype(np.int64).reshape(-1))


def _alltoall_result(with_splits: bool):
    def finish(result):
        out, received = result
        return (out, np.asarray(received, dtype=np.int64)) if with_splits else out
    return finish


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Sends splits[i] rows (default: equal parts) of `tensor` to the set's i-th rank.
    synchronize() returns the received rows, and the rows received from each rank when splits
    were given."""
    a = contiguous(as_array(tensor))
    return _submit_owned(ALLTOALL, name, a, splits=splits_array(splits),
                         finish=_alltoall_result(splits is not None),
                         ps=process_set_id(process_set, "alltoall"))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, name=None, op=None, prescale_factor=1.0,
                        postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduces `tensor` across ranks and gives each rank a slice of the first dimension (the
    first dim % size ranks get one row more)."""
    return _submit_owned(REDUCESCATTER, name, contiguous(as_array(tensor)), resolve_op(op, None),
                         prescale_factor, postscale_factor,
                         ps=process_set_id(process_set, "reducescatter"))


def reducescatter(tensor, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor,
                                           process_set))


# ---- synchronisation ----

def barrier(name=None, process_set=global_process_set) -> None:
    """Returns once every rank of the set has reached the barrier."""
    synchronize(submit(BARRIER, name, None, 0, 0, (), None, None, Sum, 0, 1.0, 1.0, None, None,
                       process_set_id(process_set, "barrier")))


def join(process_set=global_process_set) -> int:
    """Marks this rank as out of data: until every rank (of the set) has joined, its allreduces
    contribute zeros and its allgathers no rows. Blocks until all joined; returns the last
    one (the job's rank)."""
    return synchronize(submit(JOIN, "join", None, 0, 0, (), None, None, Sum, 0, 1.0, 1.0, None,
                              None, process_set_id(process_set, "join")))


class _NumpyOps(_semantics.Ops):
    """The gradient rules' primitives on numpy arrays, on one process set (scaleout.tensorflow's
    gradient ops run them on the arrays TensorFlow hands a numpy_function)."""

    def allreduce_async(self, x, name, op, prescale, postscale):
        return _allreduce_async(x, name, op, prescale, postscale, False, self.process_set)

    def allgather_async(self, x, name):
        a = contiguous(as_array(x))
        return _submit_owned(ALLGATHER, name, a.reshape(1) if a.ndim == 0 else a,
                             ps=self.process_set)

    def alltoall(self, x, splits, name):
        return synchronize(_submit_owned(ALLTOALL, name, contiguous(as_array(x)),
                                         splits=splits_array(splits), ps=self.process_set))

    def rows_tensor(self, rows):
        return np.asarray([rows], np.int64)

    def narrow(self, x, start, length):
        return np.ascontiguousarray(x[start:start + length])

    def zeros_like(self, x):
        return np.zeros_like(x)

    def scale(self, x, factor):
        return (x * np.asarray(factor, x.dtype)).astype(x.dtype, copy=False)


def numpy_ops(process_set: int = 0) -> _NumpyOps:
    """The gradient rules' primitives on numpy arrays for the set with core id `process_set`."""
    return _NumpyOps(process_set)


NUMPY_OPS = numpy_ops(0)
