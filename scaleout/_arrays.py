"""Arrays into requests: the numpy-level helpers and the array submit that the numpy API
(scaleout._ops), top-k (scaleout._topk), the gradient rules' numpy primitives and the TensorFlow
shim share. `submit_into` and `submit_owned` are the public lower-level submit for arrays: they
take the core's ids (collective code, process set id) and return a Handle."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from scaleout._errors import InvalidArgumentError
from scaleout._native import ALLGATHER, ALLREDUCE, DTYPE_CODES, Handle, Sum, submit

__all__ = [
    "dtype_code",
    "as_array",
    "contiguous",
    "address",
    "allocator",
    "splits_array",
    "submit_into",
    "submit_owned",
]

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
            "array.astype(array.dtype.newbyteorder('='))"
        )
    try:
        code = _CODE_BY_DTYPE[dtype] = DTYPE_CODES[dt.name]
        return code
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {dt.name} is not supported; scaleout reduces {', '.join(DTYPE_CODES)}"
        ) from None


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


def splits_array(splits) -> Optional[np.ndarray]:
    """alltoall's splits as the C-contiguous int64 array the core reads (None stays None).
    Integers only: float or string splits are refused, not truncated or parsed."""
    if splits is None:
        return None
    if isinstance(splits, (str, bytes)):
        raise InvalidArgumentError(f"splits must be integers (rows per rank), not {splits!r}")
    array = np.asarray(splits)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise InvalidArgumentError(
            f"splits must be integers (rows per rank), not "
            f"{array.dtype} values {array.ravel()[:8].tolist()}"
        )
    return np.ascontiguousarray(array.astype(np.int64).reshape(-1))


def submit_into(
    collective: int,
    name: Optional[str],
    tensor: Any,
    *,
    inplace: bool = False,
    output: Optional[np.ndarray] = None,
    op: int = Sum,
    root_rank: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: int = 0,
    caller_waits: bool = False,
) -> Handle:
    """allreduce / broadcast of an array-like on the set with core id `process_set`. The result
    goes into `tensor` itself (`inplace`; synchronize returns `tensor`), or into `output` (a
    C-contiguous array of the input's shape and dtype), or into a new array."""
    if type(tensor) is np.ndarray:
        try:  # the common case: a C-contiguous array, in one call
            dst = tensor if inplace else np.empty_like(tensor) if output is None else output
            return submit(
                collective,
                name=name,
                data=tensor,
                output=dst,
                op=op,
                root_rank=root_rank,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                process_set=process_set,
                caller_waits=caller_waits,
            )
        except BufferError:
            pass  # not C-contiguous, read-only, or a dtype the buffer protocol cannot describe
    a = as_array(tensor)
    code = dtype_code(a.dtype)
    if inplace and not a.flags.writeable:
        what = "allreduce" if collective == ALLREDUCE else "broadcast"
        raise InvalidArgumentError(f"in-place {what} needs a writable array")
    src = contiguous(a)
    dst = src if inplace else np.empty(src.shape, src.dtype) if output is None else output
    return submit(
        collective,
        name=name,
        data=src,
        address=address(src),
        dtype=code,
        shape=src.shape,
        output=dst,
        out_address=address(dst),
        op=op,
        root_rank=root_rank,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        finish=_written(a, tensor) if inplace else None,
        process_set=process_set,
        caller_waits=caller_waits,
    )


def _written(a: np.ndarray, tensor):
    """Finishes an in-place collective on `a` (the array behind `tensor`): copies the result
    back when it went through a contiguous stand-in; returns `tensor`."""

    def finish(result):
        if result is not a:
            a[...] = result
        return tensor

    return finish


def submit_owned(
    collective: int,
    name: Optional[str],
    tensor: Any,
    *,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    splits=None,
    finish=None,
    process_set: int = 0,
    caller_waits: bool = False,
) -> Handle:
    """allgather / alltoall / reducescatter of an array-like on the set with core id
    `process_set`: the core owns the result until completion, then an array views its bytes.
    allgather takes a scalar as one row. `splits`: alltoall's, as splits_array makes them."""
    a = contiguous(as_array(tensor))
    if a.ndim == 0 and collective == ALLGATHER:
        a = a.reshape(1)
    return submit(
        collective,
        name=name,
        data=a,
        address=address(a),
        dtype=dtype_code(a.dtype),
        shape=a.shape,
        output=allocator(a.dtype),
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        splits=splits,
        finish=finish,
        process_set=process_set,
        caller_waits=caller_waits,
    )
