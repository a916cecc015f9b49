"""Collectives on numpy arrays (and anything with the buffer protocol or DLPack).

Every collective has a name; the same name on every rank means the same collective. Without a
name, one is generated from a per-kind counter, so ranks must then call unnamed collectives in
the same order (as with Horovod).
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from scaleout import _basics, _fastpath, _native
from scaleout._basics import check, size
from scaleout._errors import InvalidArgumentError, ShutDownError

__all__ = ["Average", "Sum", "Min", "Max", "Product", "Handle", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
           "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join", "poll",
           "synchronize", "dtype_code", "enqueue"]

# Reduce ops (values of the C ABI's SO_AVERAGE ... SO_PRODUCT).
Average, Sum, Min, Max, Product = 0, 1, 2, 3, 4
_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product"}

# Collective kinds (SO_ALLREDUCE ...).
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = range(7)

_DTYPE_CODES = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5,
                "bfloat16": 6, "float32": 7, "float64": 8, "bool": 9}

_counters = {k: itertools.count() for k in ("allreduce", "allgather", "broadcast", "alltoall",
                                            "reducescatter", "barrier", "join")}
_counter_lock = threading.Lock()


def _auto_name(kind: str, name: Optional[str]) -> str:
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, not {name!r}")
        return name
    with _counter_lock:
        return f"{kind}.noname.{next(_counters[kind])}"


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
    name = dt.name
    try:
        code = _CODE_BY_DTYPE[dtype] = _DTYPE_CODES[name]
        return code
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {name} is not supported; scaleout reduces "
            f"{', '.join(_DTYPE_CODES)}") from None


def _resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    if average is not None:
        if op is not None:
            raise InvalidArgumentError("pass either op or the deprecated average, not both")
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise InvalidArgumentError(f"unknown reduce op {op!r}; use scaleout.Average, Sum, Min, "
                                   "Max or Product")
    return int(op)


def _as_array(obj: Any) -> np.ndarray:
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


def _contiguous(a: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array into a 1-d one.
    return a if a.flags.c_contiguous else a.copy(order="C")


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# A pending collective (a C type: see native/python/fastpath.c). Handle(id, name, finish, keep,
# reads_result=True): finish(handle) makes the result once the core's handle has completed;
# keep holds the buffers the core reads or writes until then; reads_result=False says the
# result is in the caller's buffers at completion, so the core's handle is released in the wait.
Handle = _fastpath.Handle

# Handles dropped while pending: (id, buffers, generation), released once complete.
_orphans: list = _fastpath.orphans


def _sweep_orphans() -> None:
    done = ctypes.c_int(0)
    so_poll = _fns()[2]
    # Handles dropped by other threads meanwhile (the ctypes calls release the GIL) are appended
    # at the end: take only the entries there now, and put back those still pending.
    taken = _orphans[:]
    del _orphans[:len(taken)]
    keep = []
    for hid, buffers, generation in taken:
        if generation != _basics.generation:
            continue  # its runtime is gone, and the buffers with it
        if so_poll(hid, ctypes.byref(done)) != 0 or done.value:
            release(hid)
        else:
            keep.append((hid, buffers, generation))
    _orphans.extend(keep)


def _shut_down(name: str) -> None:
    raise ShutDownError(f"scaleout was shut down while '{name}' was pending")


_fastpath.set_errors(check, _shut_down)


_lib_fns = None


def _fns():
    """(so_enqueue, so_wait, so_poll, so_release) through ctypes, with the fast path bound."""
    global _lib_fns
    if _lib_fns is None:
        lib = _native.library()
        address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        _fastpath.bind(address(lib.so_enqueue), address(lib.so_wait), address(lib.so_release))
        _lib_fns = (lib.so_enqueue, lib.so_wait, lib.so_poll, lib.so_release)
    return _lib_fns


def _checked(hid: int) -> int:
    if hid < 0:
        check(-hid)
    return hid


def enqueue(name: str, collective: int, dtype: int, shape: Sequence[int], in_ptr: int,
            out_ptr: int, reduce_op: int = Average, root: int = 0, prescale: float = 1.0,
            postscale: float = 1.0, splits: Optional[np.ndarray] = None) -> int:
    """Low level: enqueues a collective on raw buffers and returns the core's handle id. Used by
    the framework shims, which own their buffers and keep them alive until completion."""
    so_enqueue = _fns()[0]
    if _orphans:
        _sweep_orphans()
    if splits is None:
        return _checked(_fastpath.enqueue(name, collective, dtype, tuple(shape), in_ptr or 0,
                                          out_ptr or 0, reduce_op, root, float(prescale),
                                          float(postscale)))
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * ndim)(*shape) if ndim else None
    handle = ctypes.c_int64(0)
    check(so_enqueue(name.encode(), collective, dtype, ndim, shape_arr, in_ptr or None,
                     out_ptr or None, reduce_op, root, float(prescale), float(postscale),
                     _address(splits), len(splits), ctypes.byref(handle)))
    return handle.value


def _enqueue_arrays(name: str, collective: int, dtype: int, src: np.ndarray,
                    dst: Optional[np.ndarray], reduce_op: int = Sum, root: int = 0,
                    prescale: float = 1.0, postscale: float = 1.0) -> int:
    """Enqueues on C-contiguous arrays (dst None: the core owns the result)."""
    _fns()
    if _orphans:
        _sweep_orphans()
    try:
        hid = _fastpath.enqueue_arrays(name, collective, dtype, src, dst, reduce_op, root,
                                       float(prescale), float(postscale))
    except (BufferError, ValueError, TypeError):  # dtypes numpy cannot export (bfloat16)
        return enqueue(name, collective, dtype, src.shape, _address(src),
                       _address(dst) if dst is not None else 0, reduce_op, root, prescale,
                       postscale)
    return _checked(hid)


def wait(handle_id: int) -> None:
    """Low level: blocks (without the GIL) until the core's handle completes; raises its error."""
    _fns()
    check(_fastpath.wait(handle_id, False))


def release(handle_id: int) -> None:
    _fns()[3](handle_id)


def poll(handle: Handle) -> bool:
    """True when the collective behind the handle has completed."""
    if handle._done:
        return True
    if handle._generation != _basics.generation:
        handle._done, handle._keep = True, ()
        _shut_down(handle.name)
    if not handle._id:  # a group: done when every member is
        return all(poll(m) for m in handle._keep)
    done = ctypes.c_int(0)
    check(_fns()[2](handle._id, ctypes.byref(done)))
    return bool(done.value)


# synchronize(handle) -> result: waits for the collective and returns its result (raises its
# error on every rank); an interrupt (KeyboardInterrupt) leaves the handle pending.
synchronize = _fastpath.synchronize


def result_shape(handle_id: int) -> tuple:
    """Low level: the shape of a completed core-owned result (allgather, alltoall,
    reducescatter)."""
    ndim = ctypes.c_int(0)
    shape = (ctypes.c_int64 * 32)()
    check(_native.library().so_result_shape(handle_id, ctypes.byref(ndim), shape))
    return tuple(shape[: ndim.value])


def result_copy(handle_id: int, dst_ptr: int, nbytes: int) -> None:
    """Low level: copies a completed core-owned result into nbytes of memory at dst_ptr."""
    check(_native.library().so_result_copy(handle_id, dst_ptr or None, nbytes))


def _result_array(handle_id: int, dtype: np.dtype) -> np.ndarray:
    out = np.empty(result_shape(handle_id), dtype=dtype)
    result_copy(handle_id, _address(out) if out.size else 0, out.nbytes)
    return out


def _received_splits(handle_id: int) -> np.ndarray:
    n = size()
    splits = np.zeros(n, dtype=np.int64)
    check(_native.library().so_result_splits(
        handle_id, splits.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), n))
    return splits


# ---- allreduce ----

def _allreduce_async(tensor, name, op, prescale_factor, postscale_factor, inplace) -> Handle:
    if type(tensor) is np.ndarray and name is not None:
        # The common case in one C call; None when it does not apply (the path below then
        # explains any error).
        if _orphans:
            _sweep_orphans()
        got = _fastpath.allreduce_array(name, tensor, tensor if inplace else np.empty_like(tensor),
                                        op, float(prescale_factor), float(postscale_factor))
        if got is not None:
            return _checked(got) if type(got) is int else got
    a = _as_array(tensor)
    code = dtype_code(a.dtype)
    src = _contiguous(a)
    if inplace:
        if not a.flags.writeable:
            raise InvalidArgumentError("in-place allreduce needs a writable array")
        dst = src  # a copy when `a` is not contiguous; written back in finish
    else:
        dst = np.empty_like(src)
    name = _auto_name("allreduce", name)
    hid = _enqueue_arrays(name, ALLREDUCE, code, src, dst, op, 0, prescale_factor,
                          postscale_factor)

    def finish(h: Handle):
        if inplace:
            if dst is not a:
                a[...] = dst
            return tensor
        return dst
    return Handle(hid, name, finish, (src, dst, a), reads_result=False)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0) -> Handle:
    """Starts reducing `tensor` across ranks (default op Average); returns a Handle."""
    return _allreduce_async(tensor, name, _resolve_op(op, average), prescale_factor,
                            postscale_factor, inplace=False)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0) -> np.ndarray:
    """Reduces `tensor` across ranks and returns the result as a new array."""
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0) -> Handle:
    """In-place form of allreduce_async: the result is written into `tensor`."""
    return _allreduce_async(tensor, name, _resolve_op(op, average), prescale_factor,
                            postscale_factor, inplace=True)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def _group(handles: List[Handle], name: str) -> Handle:
    def finish(h: Handle):
        return [synchronize(m) for m in handles]
    return Handle(0, name, finish, tuple(handles))


def _grouped(tensors, average, name, op, prescale_factor, postscale_factor, inplace) -> Handle:
    op = _resolve_op(op, average)
    base = _auto_name("allreduce", name)
    handles = [_allreduce_async(t, f"{base}.{i}", op, prescale_factor, postscale_factor, inplace)
               for i, t in enumerate(tensors)]
    return _group(handles, base)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0) -> Handle:
    """Reduces a list of tensors together (they are fused whenever they fit the buffer)."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0) -> list:
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0) -> Handle:
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0) -> list:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor))


# ---- allgather, broadcast, alltoall, reducescatter ----

def allgather_async(tensor, name=None) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank)."""
    a = _contiguous(_as_array(tensor))
    if a.ndim == 0:
        a = a.reshape(1)
    name = _auto_name("allgather", name)
    hid = _enqueue_arrays(name, ALLGATHER, dtype_code(a.dtype), a, None)
    return Handle(hid, name, lambda h: _result_array(h._id, a.dtype), (a,))


def allgather(tensor, name=None) -> np.ndarray:
    return synchronize(allgather_async(tensor, name))


def _broadcast_async(tensor, root_rank, name, inplace) -> Handle:
    a = _as_array(tensor)
    src = _contiguous(a)
    if inplace and not a.flags.writeable:
        raise InvalidArgumentError("in-place broadcast needs a writable array")
    dst = src if inplace else np.empty_like(src)
    name = _auto_name("broadcast", name)
    hid = _enqueue_arrays(name, BROADCAST, dtype_code(a.dtype), src, dst, Sum, int(root_rank))

    def finish(h: Handle):
        if inplace:
            if dst is not a:
                a[...] = dst
            return tensor
        return dst
    return Handle(hid, name, finish, (src, dst, a), reads_result=False)


def broadcast_async(tensor, root_rank, name=None) -> Handle:
    """Starts sending root_rank's tensor to every rank; the result is a new array."""
    return _broadcast_async(tensor, root_rank, name, inplace=False)


def broadcast(tensor, root_rank, name=None) -> np.ndarray:
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_async_(tensor, root_rank, name=None) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return _broadcast_async(tensor, root_rank, name, inplace=True)


def broadcast_(tensor, root_rank, name=None):
    return synchronize(broadcast_async_(tensor, root_rank, name))


def alltoall_async(tensor, splits=None, name=None) -> Handle:
    """Sends splits[i] rows (default: equal parts) of `tensor` to rank i. synchronize() returns
    the received rows, and the rows received from each rank when splits were given."""
    a = _contiguous(_as_array(tensor))
    split_arr = None
    if splits is not None:
        split_arr = np.ascontiguousarray(np.asarray(splits, dtype=np.int64).reshape(-1))
    name = _auto_name("alltoall", name)
    hid = enqueue(name, ALLTOALL, dtype_code(a.dtype), a.shape, _address(a), 0,
                  splits=split_arr)

    def finish(h: Handle):
        out = _result_array(h._id, a.dtype)
        return (out, _received_splits(h._id)) if splits is not None else out
    return Handle(hid, name, finish, (a, split_arr))


def alltoall(tensor, splits=None, name=None):
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor, name=None, op=None, prescale_factor=1.0,
                        postscale_factor=1.0) -> Handle:
    """Reduces `tensor` across ranks and gives each rank a slice of the first dimension (the
    first dim % size ranks get one row more)."""
    a = _contiguous(_as_array(tensor))
    name = _auto_name("reducescatter", name)
    hid = enqueue(name, REDUCESCATTER, dtype_code(a.dtype), a.shape, _address(a), 0,
                  _resolve_op(op, None), 0, prescale_factor, postscale_factor)
    return Handle(hid, name, lambda h: _result_array(h._id, a.dtype), (a,))


def reducescatter(tensor, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor))


# ---- synchronisation ----

def barrier(name=None) -> None:
    """Returns once every rank has reached the barrier."""
    name = _auto_name("barrier", name)
    hid = enqueue(name, BARRIER, 0, (), 0, 0)
    synchronize(Handle(hid, name, lambda h: None, (), reads_result=False))


def join() -> int:
    """Marks this rank as out of data: until every rank has joined, its allreduces contribute
    zeros and its allgathers no rows. Blocks until all ranks joined; returns the last one."""
    hid = enqueue("join", JOIN, 0, (), 0, 0)

    def finish(h: Handle):
        out = ctypes.c_int32(-1)
        check(_native.library().so_result_join_rank(h._id, ctypes.byref(out)))
        return out.value
    return synchronize(Handle(hid, "join", finish, ()))
