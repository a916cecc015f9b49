"""Collectives on torch CPU tensors.

The core reads and writes a contiguous tensor's memory directly through `data_ptr()` (no copy,
no compiled code against torch); a non-contiguous tensor goes through a contiguous copy. The
tensor forms of the numpy-level API keep its names, defaults and handles: a handle returned here
is a `scaleout.Handle`, finished by `synchronize` / `poll`.

The out-of-place forms are differentiable (see the autograd functions at the end).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch
from torch.autograd.graph import increment_version

from scaleout import _ops as _core
from scaleout._basics import rank, size
from scaleout._errors import InvalidArgumentError
from scaleout._ops import Average, Handle, Sum, poll, synchronize

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
           "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "barrier", "join", "poll", "synchronize"]

# The core's element type codes (SO_UINT8 ... SO_BOOL); bfloat16 is reduced natively.
_DTYPE_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
                torch.float16: 5, torch.bfloat16: 6, torch.float32: 7, torch.float64: 8,
                torch.bool: 9}


def check_device(device: torch.device) -> None:
    """Raises the error a tensor on `device` gets: only CPU tensors are supported so far."""
    if device.type == "cpu":
        return
    if device.type in ("cuda", "xpu", "mps", "hip"):
        raise InvalidArgumentError(
            f"GPU tensors are not supported yet: got a tensor on '{device}'. scaleout reduces CPU "
            "tensors; move it with tensor.cpu() (and the result back with .to(device)).")
    raise InvalidArgumentError(f"tensors on device '{device}' are not supported; scaleout "
                               "works on CPU tensors")


def _dtype_code(tensor, what: str) -> int:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{what} takes a torch.Tensor, not {type(tensor).__name__} "
                                   "(use scaleout's numpy API for arrays)")
    check_device(tensor.device)
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{what}: {tensor.layout} tensors are not supported; "
                                   "convert with tensor.to_dense()")
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise InvalidArgumentError(
            f"{what}: dtype {tensor.dtype} is not supported; scaleout handles "
            f"{', '.join(str(d).replace('torch.', '') for d in _DTYPE_CODES)}")
    return code


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when the core can use its memory as it is, else a contiguous copy."""
    t = tensor.detach()
    return t if t.is_contiguous() else t.contiguous()


def _result_tensor(handle_id: int, dtype: torch.dtype) -> torch.Tensor:
    """Copies a core-owned result (allgather, alltoall, reducescatter) into a new tensor."""
    out = torch.empty(_core.result_shape(handle_id), dtype=dtype)
    nbytes = out.numel() * out.element_size()
    _core.result_copy(handle_id, out.data_ptr() if nbytes else 0, nbytes)
    return out


def _written(tensor: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Finishes an in-place collective: copies back from a contiguous stand-in, or tells autograd
    that the core wrote into the tensor's memory (its version counter)."""
    if result is not tensor and result.data_ptr() != tensor.data_ptr():
        tensor.detach().copy_(result)
    else:
        increment_version(tensor)
    return tensor


# ---- allreduce ----

def _allreduce_async(tensor, name: Optional[str], op: int, prescale_factor: float,
                     postscale_factor: float, inplace: bool) -> Handle:
    code = _dtype_code(tensor, "allreduce")
    src = _dense(tensor)
    dst = src if inplace else torch.empty_like(src, memory_format=torch.contiguous_format)
    name = _core._auto_name("allreduce", name)
    hid = _core.enqueue(name, _core.ALLREDUCE, code, tuple(src.shape), src.data_ptr(),
                        dst.data_ptr(), op, 0, prescale_factor, postscale_factor)
    if inplace:
        return Handle(hid, name, lambda h: _written(tensor, dst), (src, tensor),
                      reads_result=False)
    return Handle(hid, name, lambda h: dst, (src, dst), reads_result=False)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Starts reducing `tensor` across ranks (default op Average); synchronize() returns a new
    tensor. Not differentiable (use allreduce for that)."""
    return _allreduce_async(tensor, name, _core._resolve_op(op, average), prescale_factor,
                            postscale_factor, inplace=False)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """In-place form: the result is written into `tensor` (its memory, when contiguous)."""
    return _allreduce_async(tensor, name, _core._resolve_op(op, average), prescale_factor,
                            postscale_factor, inplace=True)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def _differentiable(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=None, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` across ranks (default Average) and returns a new tensor.

    Differentiable: the gradient is the allreduce of the output's gradient with the same op and
    scale factors (Sum and Average only). `compression` (a `Compression` member) casts the tensor
    for the wire and back."""
    op = _core._resolve_op(op, average)
    name = _core._auto_name("allreduce", name)
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)
    if _differentiable(tensor):
        out = _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor)
    else:
        out = synchronize(_allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                           inplace=False))
    return compression.decompress(out, ctx) if compression is not None else out


def _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor,
                   inplace) -> Handle:
    op = _core._resolve_op(op, average)
    base = _core._auto_name("allreduce", name)
    handles = [_allreduce_async(t, f"{base}.{i}", op, prescale_factor, postscale_factor, inplace)
               for i, t in enumerate(tensors)]
    return _core._group(handles, base)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Reduces a list of tensors together (fused whenever they fit the buffer); synchronize()
    returns the list of results."""
    return _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0) -> Handle:
    return _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor, True)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0) -> List[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression=None, op: Optional[int] = None,
                      prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reduces a list of tensors together and returns new tensors. Differentiable like
    allreduce."""
    tensors = list(tensors)
    op = _core._resolve_op(op, average)
    name = _core._auto_name("allreduce", name)
    ctxs = [None] * len(tensors)
    if compression is not None:
        pairs = [compression.compress(t) for t in tensors]
        tensors, ctxs = [p[0] for p in pairs], [p[1] for p in pairs]
    if _differentiable(*tensors):
        outs = list(_GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor,
                                              *tensors))
    else:
        outs = synchronize(_grouped_async(tensors, None, name, op, prescale_factor,
                                          postscale_factor, False))
    if compression is not None:
        outs = [compression.decompress(o, c) for o, c in zip(outs, ctxs)]
    return outs


# ---- allgather, broadcast, alltoall, reducescatter ----

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank)."""
    code = _dtype_code(tensor, "allgather")
    src = _dense(tensor)
    if src.dim() == 0:
        src = src.reshape(1)
    name = _core._auto_name("allgather", name)
    hid = _core.enqueue(name, _core.ALLGATHER, code, tuple(src.shape), src.data_ptr(), 0)
    return Handle(hid, name, lambda h: _result_tensor(h._id, src.dtype), (src,))


def allgather(tensor: torch.Tensor, name: Optional[str] = None) -> torch.Tensor:
    """Concatenation of every rank's tensor along dim 0. Differentiable: each rank's gradient is
    its own rows of the Average-allreduce of the output gradients (Horovod's definition)."""
    name = _core._auto_name("allgather", name)
    if _differentiable(tensor):
        return _AllgatherFn.apply(tensor, name)
    return synchronize(allgather_async(tensor, name))


def _broadcast_async(tensor, root_rank: int, name: Optional[str], inplace: bool) -> Handle:
    code = _dtype_code(tensor, "broadcast")
    src = _dense(tensor)
    dst = src if inplace else torch.empty_like(src, memory_format=torch.contiguous_format)
    name = _core._auto_name("broadcast", name)
    hid = _core.enqueue(name, _core.BROADCAST, code, tuple(src.shape), src.data_ptr(),
                        dst.data_ptr(), Sum, int(root_rank))
    if inplace:
        return Handle(hid, name, lambda h: _written(tensor, dst), (src, tensor),
                      reads_result=False)
    return Handle(hid, name, lambda h: dst, (src, dst), reads_result=False)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> Handle:
    """Starts sending root_rank's tensor to every rank; synchronize() returns a new tensor."""
    return _broadcast_async(tensor, root_rank, name, inplace=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int,
                     name: Optional[str] = None) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return _broadcast_async(tensor, root_rank, name, inplace=True)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor. Differentiable: the root's gradient is
    the Average-allreduce of the output gradients, the other ranks' is zero (Horovod's)."""
    name = _core._auto_name("broadcast", name)
    if _differentiable(tensor):
        return _BroadcastFn.apply(tensor, int(root_rank), name)
    return synchronize(_broadcast_async(tensor, root_rank, name, inplace=False))


def _splits_array(splits) -> Optional[np.ndarray]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        check_device(splits.device)
        splits = splits.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(splits, dtype=np.int64).reshape(-1))


def _alltoall_async(tensor, splits, name: Optional[str], with_splits: bool) -> Handle:
    code = _dtype_code(tensor, "alltoall")
    src = _dense(tensor)
    split_arr = _splits_array(splits)
    name = _core._auto_name("alltoall", name)
    hid = _core.enqueue(name, _core.ALLTOALL, code, tuple(src.shape), src.data_ptr(), 0,
                        splits=split_arr)

    def finish(h: Handle):
        out = _result_tensor(h._id, src.dtype)
        if not with_splits:
            return out
        return out, torch.from_numpy(_core._received_splits(h._id)).to(torch.int32)
    return Handle(hid, name, finish, (src, split_arr))


def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None) -> Handle:
    """Sends splits[i] rows of `tensor` (default: equal parts) to rank i. synchronize() returns
    the received rows, and with splits given also the rows received from each rank (int32)."""
    return _alltoall_async(tensor, splits, name, with_splits=splits is not None)


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None):
    """Synchronous alltoall; differentiable (the gradient is the reverse alltoall)."""
    name = _core._auto_name("alltoall", name)
    if _differentiable(tensor):
        out, received = _AlltoallFn.apply(tensor, splits, name)
    else:
        out, received = synchronize(_alltoall_async(tensor, splits, name, with_splits=True))
    return (out, received) if splits is not None else out


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None,
                        op: Optional[int] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Reduces `tensor` across ranks (default Average); rank r gets slice r of the first
    dimension (the first dim % size ranks get one row more)."""
    code = _dtype_code(tensor, "reducescatter")
    src = _dense(tensor)
    name = _core._auto_name("reducescatter", name)
    hid = _core.enqueue(name, _core.REDUCESCATTER, code, tuple(src.shape), src.data_ptr(), 0,
                        _core._resolve_op(op, None), 0, prescale_factor, postscale_factor)
    return Handle(hid, name, lambda h: _result_tensor(h._id, src.dtype), (src,))


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, op: Optional[int] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Synchronous reducescatter; differentiable for Sum and Average (the gradient is the
    allgather of the output gradients, scaled as the forward was)."""
    name = _core._auto_name("reducescatter", name)
    op = _core._resolve_op(op, None)
    if _differentiable(tensor):
        return _ReducescatterFn.apply(tensor, name, op, prescale_factor, postscale_factor)
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor))


def barrier(name: Optional[str] = None) -> None:
    _core.barrier(name)


def join(device: int = -1) -> int:
    """This rank is out of data: until every rank has joined, its allreduces contribute zeros.
    Blocks until all joined; returns the rank that joined last. (`device` is accepted for
    Horovod compatibility and ignored: scaleout works on CPU tensors.)"""
    return _core.join()


# ---- autograd ----
#
# Convention (Horovod's): the gradient a collective hands back on each rank combines the output
# gradients of every rank, so that a data-parallel optimizer that then averages parameter
# gradients over ranks sees the gradient of the ranks' combined loss. Backward collectives are
# named after the forward one ("<name>.grad"), so ranks match them whatever order autograd
# runs them in.

def _check_grad_op(op: int, what: str) -> None:
    if op not in (Average, Sum):
        raise InvalidArgumentError(f"the gradient of {what} is defined for the Average and Sum "
                                   f"ops only, not {_core._OP_NAMES.get(op, op)}")


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        return synchronize(_allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                            inplace=False))

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post = ctx.args
        _check_grad_op(op, "allreduce")
        g = synchronize(_allreduce_async(grad, f"{name}.grad", op, pre, post, inplace=False))
        return g, None, None, None, None


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, *tensors):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        return tuple(synchronize(_grouped_async(tensors, None, name, op, prescale_factor,
                                                postscale_factor, False)))

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post = ctx.args
        _check_grad_op(op, "grouped_allreduce")
        gs = synchronize(_grouped_async(grads, None, f"{name}.grad", op, pre, post, False))
        return (None, None, None, None, *gs)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        ctx.shape = tensor.shape
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        rows = ctx.shape[0] if len(ctx.shape) else 1
        reduced = _allreduce_async(grad, f"{ctx.name}.grad", Average, 1.0, 1.0, inplace=False)
        sizes = allgather_async(torch.tensor([rows], dtype=torch.int64), f"{ctx.name}.grad.rows")
        reduced, sizes = synchronize(reduced), synchronize(sizes)
        offset = int(sizes[: rank()].sum())
        return reduced.narrow(0, offset, rows).reshape(ctx.shape), None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.args = (root_rank, name)
        return synchronize(_broadcast_async(tensor, root_rank, name, inplace=False))

    @staticmethod
    def backward(ctx, grad):
        root_rank, name = ctx.args
        g = synchronize(_allreduce_async(grad, f"{name}.grad", Average, 1.0, 1.0, inplace=False))
        if rank() != root_rank:
            g = torch.zeros_like(g)
        return g, None, None


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = synchronize(_alltoall_async(tensor, splits, name, with_splits=True))
        ctx.args = (received, name)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _grad_received):
        received, name = ctx.args
        # What each rank received goes back to its sender, in the sender's original row order.
        g, _ = synchronize(_alltoall_async(grad, received, f"{name}.grad", with_splits=True))
        return g, None, None


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.args = (name, op, prescale_factor * postscale_factor)
        return synchronize(reducescatter_async(tensor, name, op, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        name, op, scale = ctx.args
        _check_grad_op(op, "reducescatter")
        g = synchronize(allgather_async(grad, f"{name}.grad"))
        if op == Average:
            scale /= size()
        if scale != 1.0:
            g = g * scale
        return g, None, None, None, None
