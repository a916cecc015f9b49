"""Collectives on torch CPU tensors.

The core reads and writes a contiguous tensor's memory directly through `data_ptr()` (no copy,
no compiled code against torch); a non-contiguous tensor goes through a contiguous copy. The
tensor forms of the numpy-level API keep its names, defaults and handles: a handle returned here
is a `scaleout.Handle`, finished by `synchronize` / `poll`.

The out-of-place forms are differentiable (see the autograd functions at the end).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.autograd.graph import increment_version

from scaleout import _gradient_rules, _naming
from scaleout._arrays import splits_array
from scaleout._errors import InvalidArgumentError
from scaleout._native import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, DTYPE_CODES,
                              REDUCESCATTER, Average, Handle, Sum, auto_name, group, poll,
                              register_tensor_type, resolve_op, submit, synchronize, wait_all)
from scaleout._ops import barrier as _barrier_np, join as _join_np
from scaleout._process_sets import global_process_set, process_set_id, set_size

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
           "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "sparse_allreduce_async", "barrier", "join", "poll",
           "synchronize"]

# Every collective takes Horovod's process_set= (a registered ProcessSet; the global set by
# default). Below the public functions it travels as the core's id (`ps`, 0: the global set).
_GLOBAL = global_process_set

# The core's element type codes, by torch dtype (from the core's table).
_DTYPE_CODES = {getattr(torch, name): code for name, code in DTYPE_CODES.items()
                if isinstance(getattr(torch, name, None), torch.dtype)}


register_tensor_type(torch.Tensor, _DTYPE_CODES, torch.strided)


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
    if isinstance(tensor, torch.Tensor):
        code = _DTYPE_CODES.get(tensor.dtype)
        if code is not None and tensor.is_cpu and tensor.layout is torch.strided:
            return code
    _refuse(tensor, what)


def _refuse(tensor, what: str):
    """Raises the error that says why the core cannot take `tensor`."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{what} takes a torch.Tensor, not {type(tensor).__name__} "
                                   "(use scaleout's numpy API for arrays)")
    check_device(tensor.device)
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{what}: {tensor.layout} tensors are not supported; "
                                   "convert with tensor.to_dense()")
    raise InvalidArgumentError(
        f"{what}: dtype {tensor.dtype} is not supported; scaleout handles "
        f"{', '.join(str(d).replace('torch.', '') for d in _DTYPE_CODES)}")


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when the core can use its memory as it is, else a contiguous copy."""
    return tensor if tensor.is_contiguous() else tensor.detach().contiguous()


def _allocator(dtype: torch.dtype):
    """A core-owned result (allgather, alltoall, reducescatter) as a tensor viewing the core's
    bytes (no copy; the tensor keeps them alive)."""
    def alloc(shape, buffer):
        if 0 in shape:
            return torch.empty(shape, dtype=dtype)  # frombuffer refuses an empty buffer
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)
    return alloc


def _bumped(tensor: torch.Tensor) -> torch.Tensor:
    """Finishes an in-place collective that wrote into the tensor's own memory: tells autograd
    (its version counter)."""
    increment_version(tensor)
    return tensor


def _copied_back(tensor: torch.Tensor):
    """Finishes an in-place collective that went through a contiguous stand-in."""
    def finish(result: torch.Tensor) -> torch.Tensor:
        tensor.detach().copy_(result)
        return tensor
    return finish


def _submit_into(collective: int, tensor, name: Optional[str], inplace: bool, op: int,
                 root: int, prescale: float, postscale: float, what: str, ps: int) -> Handle:
    """allreduce / broadcast: the result in a new tensor, or written into `tensor`."""
    if inplace:
        # The hot path of every DistributedOptimizer hook: the binding reads the tensor itself.
        try:
            return submit(collective, name=name, data=tensor, output=tensor, op=op,
                          root_rank=root, prescale_factor=prescale, postscale_factor=postscale,
                          finish=_bumped, process_set=ps)
        except BufferError:
            pass  # not a contiguous CPU tensor of a core dtype: explained or copied below
    code = _dtype_code(tensor, what)
    src = _dense(tensor)
    if inplace:
        ptr = src.data_ptr()
        return submit(collective, name=name, data=src, address=ptr, dtype=code, shape=src.shape,
                      output=src, out_address=ptr, op=op, root_rank=root,
                      prescale_factor=prescale, postscale_factor=postscale,
                      finish=_copied_back(tensor), process_set=ps)
    dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    return submit(collective, name=name, data=src, address=src.data_ptr(), dtype=code,
                  shape=src.shape, output=dst, out_address=dst.data_ptr(), op=op,
                  root_rank=root, prescale_factor=prescale, postscale_factor=postscale,
                  process_set=ps)


def _submit_owned(collective: int, tensor, name: Optional[str], what: str, ps: int,
                  op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, splits=None,
                  finish=None) -> Handle:
    """allgather / alltoall / reducescatter: the core owns the result until completion."""
    code = _dtype_code(tensor, what)
    src = _dense(tensor)
    if collective == ALLGATHER and src.dim() == 0:
        src = src.reshape(1)
    return submit(collective, name=name, data=src, address=src.data_ptr(), dtype=code,
                  shape=src.shape, output=_allocator(src.dtype), op=op,
                  prescale_factor=prescale, postscale_factor=postscale, splits=splits,
                  finish=finish, process_set=ps)


# ---- allreduce ----

def _allreduce_async(tensor, name: Optional[str], op: int, prescale_factor: float,
                     postscale_factor: float, inplace: bool, ps: int) -> Handle:
    return _submit_into(ALLREDUCE, tensor, name, inplace, op, 0, prescale_factor,
                        postscale_factor, "allreduce", ps)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set=_GLOBAL) -> Handle:
    """Starts reducing `tensor` across ranks (default op Average); synchronize() returns a new
    tensor. Not differentiable (use allreduce for that)."""
    return _allreduce_async(tensor, name, resolve_op(op, average), prescale_factor,
                            postscale_factor, False, process_set_id(process_set, "allreduce"))


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set=_GLOBAL) -> Handle:
    """In-place form: the result is written into `tensor` (its memory, when contiguous)."""
    return _submit_into(ALLREDUCE, tensor, name, True, resolve_op(op, average), 0,
                        prescale_factor, postscale_factor, "allreduce",
                        process_set_id(process_set, "allreduce_"))


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set=_GLOBAL) -> torch.Tensor:
    """Reduces `tensor` in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _differentiable(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=None, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=_GLOBAL) -> torch.Tensor:
    """Reduces `tensor` across ranks (default Average) and returns a new tensor.

    Differentiable: the gradient is the allreduce of the output's gradient with the same op and
    scale factors (Sum and Average only). `compression` (a `Compression` member) casts the tensor
    for the wire and back."""
    ps = process_set_id(process_set, "allreduce")
    op = resolve_op(op, average)
    name = auto_name(ALLREDUCE, name, ps)
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)
    if _differentiable(tensor):
        out = _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, ps)
    else:
        out = synchronize(_allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                           False, ps))
    return compression.decompress(out, ctx) if compression is not None else out


def _compress_all(compression, tensors: List[torch.Tensor]):
    """(tensors for the wire, contexts) of a grouped collective's `compression=`."""
    if compression is None:
        return tensors, [None] * len(tensors)
    pairs = [compression.compress(t) for t in tensors]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _decompress_all(compression, outs: List[torch.Tensor], ctxs) -> List[torch.Tensor]:
    if compression is None:
        return outs
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor,
                   inplace, ps: int) -> Handle:
    op = resolve_op(op, average)
    base = auto_name(ALLREDUCE, name, ps)
    return group([_allreduce_async(t, _naming.member(base, i), op, prescale_factor,
                                   postscale_factor, inplace, ps)
                  for i, t in enumerate(tensors)], base)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set=_GLOBAL) -> Handle:
    """Reduces a list of tensors together (fused whenever they fit the buffer); synchronize()
    returns the list of results."""
    return _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor, False,
                          process_set_id(process_set, "grouped_allreduce"))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set=_GLOBAL) -> Handle:
    """In-place form of grouped_allreduce_async."""
    return _grouped_async(tensors, average, name, op, prescale_factor, postscale_factor, True,
                          process_set_id(process_set, "grouped_allreduce_"))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set=_GLOBAL) -> List[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression=None, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set=_GLOBAL) -> List[torch.Tensor]:
    """Reduces a list of tensors together and returns new tensors. Differentiable like
    allreduce."""
    ps = process_set_id(process_set, "grouped_allreduce")
    tensors = list(tensors)
    op = resolve_op(op, average)
    name = auto_name(ALLREDUCE, name, ps)
    tensors, ctxs = _compress_all(compression, tensors)
    if _differentiable(*tensors):
        outs = list(_GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor, ps,
                                              *tensors))
    else:
        outs = synchronize(_grouped_async(tensors, None, name, op, prescale_factor,
                                          postscale_factor, False, ps))
    return _decompress_all(compression, outs, ctxs)


# ---- allgather, broadcast, alltoall, reducescatter ----

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set=_GLOBAL) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank)."""
    return _submit_owned(ALLGATHER, tensor, name, "allgather",
                         process_set_id(process_set, "allgather"))


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set=_GLOBAL) -> torch.Tensor:
    """Concatenation of every rank's tensor along dim 0. Differentiable: each rank's gradient is
    its own rows of the Average-allreduce of the output gradients (Horovod's definition)."""
    ps = process_set_id(process_set, "allgather")
    name = auto_name(ALLGATHER, name, ps)
    if _differentiable(tensor):
        return _AllgatherFn.apply(tensor, name, ps)
    return synchronize(_submit_owned(ALLGATHER, tensor, name, "allgather", ps))


def _grouped_names(collective: int, name: Optional[str], count: int,
                   ps: int) -> Tuple[str, List[str]]:
    """The group's name and its members' ("<name>.<i>")."""
    base = auto_name(collective, name, ps)
    return base, _naming.members(base, count)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set=_GLOBAL) -> Handle:
    """allgather of each tensor, submitted together; synchronize() returns the list."""
    ps = process_set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    base, names = _grouped_names(ALLGATHER, name, len(tensors), ps)
    return group([_submit_owned(ALLGATHER, t, n, "grouped_allgather", ps)
                  for t, n in zip(tensors, names)], base)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set=_GLOBAL) -> List[torch.Tensor]:
    """allgather of each tensor, together; differentiable as allgather."""
    ps = process_set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    if _differentiable(*tensors):
        _, names = _grouped_names(ALLGATHER, name, len(tensors), ps)
        return [_AllgatherFn.apply(t, n, ps) for t, n in zip(tensors, names)]
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _broadcast_async(tensor, root_rank: int, name: Optional[str], inplace: bool,
                     ps: int) -> Handle:
    return _submit_into(BROADCAST, tensor, name, inplace, Sum, root_rank, 1.0, 1.0,
                        "broadcast", ps)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set=_GLOBAL) -> Handle:
    """Starts sending root_rank's tensor to every rank; synchronize() returns a new tensor."""
    return _broadcast_async(tensor, root_rank, name, False,
                            process_set_id(process_set, "broadcast"))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set=_GLOBAL) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return _broadcast_async(tensor, root_rank, name, True,
                            process_set_id(process_set, "broadcast_"))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set=_GLOBAL) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set=_GLOBAL) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor. Differentiable: the root's gradient is
    the Average-allreduce of the output gradients, the other ranks' is zero (Horovod's)."""
    ps = process_set_id(process_set, "broadcast")
    name = auto_name(BROADCAST, name, ps)
    if _differentiable(tensor):
        return _BroadcastFn.apply(tensor, root_rank, name, ps)
    return synchronize(_broadcast_async(tensor, root_rank, name, False, ps))


def _splits_array(splits) -> Optional[np.ndarray]:
    if isinstance(splits, torch.Tensor):
        check_device(splits.device)
        splits = splits.detach().cpu().numpy()
    return splits_array(splits)


def _with_received_splits(result):
    out, received = result
    return out, torch.tensor(received, dtype=torch.int32)


def _alltoall_async(tensor, splits, name: Optional[str], ps: int) -> Handle:
    return _submit_owned(ALLTOALL, tensor, name, "alltoall", ps, splits=_splits_array(splits),
                         finish=_with_received_splits)


def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set=_GLOBAL) -> Handle:
    """Sends splits[i] rows of `tensor` (default: equal parts) to rank i. synchronize() returns
    (received rows, rows received from each rank as an int32 tensor), as Horovod's does,
    whether or not splits were given."""
    return _alltoall_async(tensor, splits, name, process_set_id(process_set, "alltoall"))


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set=_GLOBAL):
    """Synchronous alltoall: the received rows, and with splits given also the rows received
    from each rank (int32). Differentiable (the gradient is the reverse alltoall)."""
    ps = process_set_id(process_set, "alltoall")
    name = auto_name(ALLTOALL, name, ps)
    if _differentiable(tensor):
        out, received = _AlltoallFn.apply(tensor, splits, name, ps)
    else:
        out, received = synchronize(_alltoall_async(tensor, splits, name, ps))
    return (out, received) if splits is not None else out


def _reducescatter_async(tensor, name: Optional[str], op: int, prescale_factor: float,
                         postscale_factor: float, ps: int) -> Handle:
    return _submit_owned(REDUCESCATTER, tensor, name, "reducescatter", ps, op, prescale_factor,
                         postscale_factor)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None,
                        op: Optional[int] = Average, process_set=_GLOBAL,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Reduces `tensor` across ranks (default Average); rank r gets slice r of the first
    dimension (the first dim % size ranks get one row more)."""
    return _reducescatter_async(tensor, name, resolve_op(op, None), prescale_factor,
                                postscale_factor, process_set_id(process_set, "reducescatter"))


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression=None,
                  op: Optional[int] = Average, process_set=_GLOBAL,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Synchronous reducescatter; differentiable for Sum and Average (the gradient is the
    allgather of the output gradients, scaled as the forward was). `compression` casts the
    tensor for the wire and back, as in allreduce."""
    ps = process_set_id(process_set, "reducescatter")
    name = auto_name(REDUCESCATTER, name, ps)
    op = resolve_op(op, None)
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)
    if _differentiable(tensor):
        out = _ReducescatterFn.apply(tensor, name, op, prescale_factor, postscale_factor, ps)
    else:
        out = synchronize(_reducescatter_async(tensor, name, op, prescale_factor,
                                               postscale_factor, ps))
    return compression.decompress(out, ctx) if compression is not None else out


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: Optional[int] = Average, process_set=_GLOBAL,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """reducescatter of each tensor, submitted together; synchronize() returns the list."""
    ps = process_set_id(process_set, "grouped_reducescatter")
    tensors = list(tensors)
    op = resolve_op(op, None)
    base, names = _grouped_names(REDUCESCATTER, name, len(tensors), ps)
    return group([_reducescatter_async(t, n, op, prescale_factor, postscale_factor, ps)
                  for t, n in zip(tensors, names)], base)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression=None, op: Optional[int] = Average, process_set=_GLOBAL,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """reducescatter of each tensor, together; differentiable and compressed as reducescatter."""
    ps = process_set_id(process_set, "grouped_reducescatter")
    tensors = list(tensors)
    op = resolve_op(op, None)
    tensors, ctxs = _compress_all(compression, tensors)
    if _differentiable(*tensors):
        _, names = _grouped_names(REDUCESCATTER, name, len(tensors), ps)
        outs = [_ReducescatterFn.apply(t, n, op, prescale_factor, postscale_factor, ps)
                for t, n in zip(tensors, names)]
    else:
        outs = synchronize(grouped_reducescatter_async(tensors, name, op, process_set,
                                                       prescale_factor, postscale_factor))
    return _decompress_all(compression, outs, ctxs)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int, process_set=_GLOBAL):
    """Reduces a sparse (COO) tensor as Horovod does: its indices and values are allgathered
    (so duplicates from different ranks are summed when the result is used), and with
    op=Average the values are divided by the set's size. Returns a function that waits and
    returns the reduced sparse tensor (Horovod's DistributedOptimizer calls it in
    synchronize())."""
    ps = process_set_id(process_set, "sparse_allreduce_async")
    op = resolve_op(op, None)
    if op not in (Average, Sum):
        raise InvalidArgumentError("sparse_allreduce_async reduces with op=Average or op=Sum")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # allgather concatenates along dim 0, so the (ndim, nnz) indices travel as (nnz, ndim).
    indices_handle = _submit_owned(ALLGATHER, t.indices().t().contiguous(),
                                   _naming.part(name, _naming.INDICES), "sparse_allreduce_async",
                                   ps)
    values_handle = _submit_owned(ALLGATHER, t.values().contiguous(),
                                  _naming.part(name, _naming.VALUES), "sparse_allreduce_async", ps)
    world = set_size(ps)

    def wait() -> torch.Tensor:
        indices, values = wait_all([indices_handle, values_handle])
        if op == Average:
            values = values / world
        return torch.sparse_coo_tensor(indices.t(), values, t.size(), check_invariants=False)
    return wait


def barrier(process_set=_GLOBAL) -> None:
    """Returns once every rank has reached the barrier."""
    _barrier_np(process_set=process_set)


def join(device: int = -1, process_set=_GLOBAL) -> int:
    """This rank is out of data: until every rank (of the set) has joined, its allreduces
    contribute zeros. Blocks until all joined; returns the (job's) rank that joined last.
    (`device` is accepted for Horovod compatibility and ignored: scaleout works on CPU
    tensors.)"""
    return _join_np(process_set)


# ---- autograd ----
#
# The backward passes apply the rules of scaleout._gradient_rules (Horovod's definitions, shared
# with scaleout.tensorflow) to torch tensors.

class _TorchOps(_gradient_rules.Ops):
    """The gradient rules' primitives on torch tensors, on one process set (the forward's)."""

    def allreduce_async(self, x, name, op, prescale, postscale):
        return _allreduce_async(x, name, op, prescale, postscale, False, self.process_set)

    def allgather_async(self, x, name):
        return _submit_owned(ALLGATHER, x, name, "allgather", self.process_set)

    def alltoall(self, x, splits, name):
        return synchronize(_alltoall_async(x, splits, name, self.process_set))

    def rows_tensor(self, rows):
        return torch.tensor([rows], dtype=torch.int64)

    def narrow(self, x, start, length):
        return x.narrow(0, start, length)

    def zeros_like(self, x):
        return torch.zeros_like(x)

    def scale(self, x, factor):
        return x * factor


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        ctx.ps = ps
        return synchronize(_allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                            False, ps))

    @staticmethod
    def backward(ctx, grad):
        g = _gradient_rules.gradient("allreduce")(_TorchOps(ctx.ps), grad, *ctx.args)
        return g, None, None, None, None, None


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (name, op, prescale_factor, postscale_factor, ps)
        return tuple(synchronize(_grouped_async(tensors, None, name, op, prescale_factor,
                                                postscale_factor, False, ps)))

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post, ps = ctx.args
        _gradient_rules.check_gradient_op("allreduce", op)
        gs = synchronize(_grouped_async(grads, None, _naming.gradient(name), op, pre, post,
                                        False, ps))
        return (None, None, None, None, None, *gs)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.name = name
        ctx.shape = tensor.shape
        ctx.ps = ps
        return synchronize(_submit_owned(ALLGATHER, tensor, name, "allgather", ps))

    @staticmethod
    def backward(ctx, grad):
        rows = ctx.shape[0] if len(ctx.shape) else 1
        g = _gradient_rules.gradient("allgather")(_TorchOps(ctx.ps), grad, ctx.name, rows)
        return g.reshape(ctx.shape), None, None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.args = (root_rank, name)
        ctx.ps = ps
        return synchronize(_broadcast_async(tensor, root_rank, name, False, ps))

    @staticmethod
    def backward(ctx, grad):
        root_rank, name = ctx.args
        g = _gradient_rules.gradient("broadcast")(_TorchOps(ctx.ps), grad, name, root_rank)
        return g, None, None, None


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = synchronize(_alltoall_async(tensor, splits, name, ps))
        ctx.args = (received, name)
        ctx.ps = ps
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _grad_received):
        received, name = ctx.args
        g = _gradient_rules.gradient("alltoall")(_TorchOps(ctx.ps), grad, name, received)
        return g, None, None, None


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        ctx.ps = ps
        return synchronize(_reducescatter_async(tensor, name, op, prescale_factor,
                                                postscale_factor, ps))

    @staticmethod
    def backward(ctx, grad):
        g = _gradient_rules.gradient("reducescatter")(_TorchOps(ctx.ps), grad, *ctx.args)
        return g, None, None, None, None, None
