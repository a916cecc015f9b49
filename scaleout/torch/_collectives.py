"""Collectives on torch CPU tensors, with Horovod's names and signatures.

The tensor forms of the numpy-level API keep its names, defaults and handles: a handle returned
here is a `scaleout.Handle`, finished by `synchronize` / `poll`. How a tensor reaches the core is
_tensors.py's. The out-of-place forms are differentiable (the autograd Functions are in
_autograd.py).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from scaleout import _naming
from scaleout._errors import InvalidArgumentError
from scaleout._native import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCESCATTER,
    Average,
    Handle,
    Sum,
    auto_name,
    group,
    poll,
    resolve_op,
    synchronize,
    wait_all,
)
from scaleout._ops import barrier as _barrier_np
from scaleout._ops import join as _join_np
from scaleout._process_sets import global_process_set, process_set_id, set_size
from scaleout.torch._autograd import (
    AllgatherFn,
    AllreduceFn,
    AlltoallFn,
    BroadcastFn,
    GroupedAllreduceFn,
    ReducescatterFn,
)
from scaleout.torch._tensors import (
    start_allreduce,
    start_alltoall,
    start_broadcast,
    start_grouped_allreduce,
    start_reducescatter,
    submit_into,
    submit_owned,
)

__all__ = [
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "barrier",
    "join",
    "poll",
    "synchronize",
]

# Every collective takes Horovod's process_set= (a registered ProcessSet; the global set by
# default). Below the public functions it travels as the core's id (`ps`, 0: the global set).
_GLOBAL = global_process_set


# ---- allreduce ----


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
    priority: int = 0,
) -> Handle:
    """Starts reducing `tensor` across ranks (default op Average); synchronize() returns a new
    tensor. Not differentiable (use allreduce for that). `priority` (scaleout's own): among
    reductions ready at the same time, higher ones complete first (Note [Priority])."""
    return start_allreduce(
        tensor,
        name,
        resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        False,
        process_set_id(process_set, "allreduce"),
        priority=priority,
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
    priority: int = 0,
) -> Handle:
    """In-place form: the result is written into `tensor` (its memory, when contiguous)."""
    return submit_into(  # straight to the submit: a user's own per-tensor loop is a hot path
        ALLREDUCE,
        tensor,
        name,
        True,
        resolve_op(op, average),
        0,
        prescale_factor,
        postscale_factor,
        "allreduce",
        process_set_id(process_set, "allreduce_"),
        priority=priority,
    )


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> torch.Tensor:
    """Reduces `tensor` in place and returns it."""
    op = resolve_op(op, average)
    ps = process_set_id(process_set, "allreduce_")
    return synchronize(
        start_allreduce(tensor, name, op, prescale_factor, postscale_factor, True, ps, True)
    )


def _differentiable(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression=None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> torch.Tensor:
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
        out = AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, ps)
    else:
        out = synchronize(
            start_allreduce(tensor, name, op, prescale_factor, postscale_factor, False, ps, True)
        )
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


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> Handle:
    """Reduces a list of tensors together (fused whenever they fit the buffer); synchronize()
    returns the list of results."""
    return start_grouped_allreduce(
        tensors,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        False,
        process_set_id(process_set, "grouped_allreduce"),
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> Handle:
    """In-place form of grouped_allreduce_async."""
    return start_grouped_allreduce(
        tensors,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        True,
        process_set_id(process_set, "grouped_allreduce_"),
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> List[torch.Tensor]:
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression=None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=_GLOBAL,
) -> List[torch.Tensor]:
    """Reduces a list of tensors together and returns new tensors. Differentiable like
    allreduce."""
    ps = process_set_id(process_set, "grouped_allreduce")
    tensors = list(tensors)
    op = resolve_op(op, average)
    name = auto_name(ALLREDUCE, name, ps)
    tensors, ctxs = _compress_all(compression, tensors)
    if _differentiable(*tensors):
        outs = list(
            GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor, ps, *tensors)
        )
    else:
        outs = synchronize(
            start_grouped_allreduce(
                tensors, None, name, op, prescale_factor, postscale_factor, False, ps
            )
        )
    return _decompress_all(compression, outs, ctxs)


# ---- allgather, broadcast, alltoall, reducescatter ----


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set=_GLOBAL
) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank)."""
    return submit_owned(
        ALLGATHER, tensor, name, "allgather", process_set_id(process_set, "allgather")
    )


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set=_GLOBAL
) -> torch.Tensor:
    """Concatenation of every rank's tensor along dim 0. Differentiable: each rank's gradient is
    its own rows of the Average-allreduce of the output gradients (Horovod's definition)."""
    ps = process_set_id(process_set, "allgather")
    name = auto_name(ALLGATHER, name, ps)
    if _differentiable(tensor):
        return AllgatherFn.apply(tensor, name, ps)
    return synchronize(submit_owned(ALLGATHER, tensor, name, "allgather", ps))


def _grouped_names(
    collective: int, name: Optional[str], count: int, ps: int
) -> Tuple[str, List[str]]:
    """The group's name and its members' ("<name>.<i>")."""
    base = auto_name(collective, name, ps)
    return base, _naming.members(base, count)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set=_GLOBAL
) -> Handle:
    """allgather of each tensor, submitted together; synchronize() returns the list."""
    ps = process_set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    base, names = _grouped_names(ALLGATHER, name, len(tensors), ps)
    return group(
        [submit_owned(ALLGATHER, t, n, "grouped_allgather", ps) for t, n in zip(tensors, names)],
        base,
    )


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set=_GLOBAL
) -> List[torch.Tensor]:
    """allgather of each tensor, together; differentiable as allgather."""
    ps = process_set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    if _differentiable(*tensors):
        _, names = _grouped_names(ALLGATHER, name, len(tensors), ps)
        return [AllgatherFn.apply(t, n, ps) for t, n in zip(tensors, names)]
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=_GLOBAL
) -> Handle:
    """Starts sending root_rank's tensor to every rank; synchronize() returns a new tensor."""
    return start_broadcast(tensor, root_rank, name, False, process_set_id(process_set, "broadcast"))


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=_GLOBAL
) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return start_broadcast(tensor, root_rank, name, True, process_set_id(process_set, "broadcast_"))


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=_GLOBAL
) -> torch.Tensor:
    ps = process_set_id(process_set, "broadcast_")
    return synchronize(start_broadcast(tensor, root_rank, name, True, ps, True))


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set=_GLOBAL
) -> torch.Tensor:
    """root_rank's tensor on every rank, as a new tensor. Differentiable: the root's gradient is
    the Average-allreduce of the output gradients, the other ranks' is zero (Horovod's)."""
    ps = process_set_id(process_set, "broadcast")
    name = auto_name(BROADCAST, name, ps)
    if _differentiable(tensor):
        return BroadcastFn.apply(tensor, root_rank, name, ps)
    return synchronize(start_broadcast(tensor, root_rank, name, False, ps, True))


def alltoall_async(
    tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=_GLOBAL
) -> Handle:
    """Sends splits[i] rows of `tensor` (default: equal parts) to rank i. synchronize() returns
    (received rows, rows received from each rank as an int32 tensor), as Horovod's does,
    whether or not splits were given."""
    return start_alltoall(tensor, splits, name, process_set_id(process_set, "alltoall"))


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None, process_set=_GLOBAL):
    """Synchronous alltoall: the received rows, and with splits given also the rows received
    from each rank (int32). Differentiable (the gradient is the reverse alltoall)."""
    ps = process_set_id(process_set, "alltoall")
    name = auto_name(ALLTOALL, name, ps)
    if _differentiable(tensor):
        out, received = AlltoallFn.apply(tensor, splits, name, ps)
    else:
        out, received = synchronize(start_alltoall(tensor, splits, name, ps))
    return (out, received) if splits is not None else out


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: Optional[int] = Average,
    process_set=_GLOBAL,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Reduces `tensor` across ranks (default Average); rank r gets slice r of the first
    dimension (the first dim % size ranks get one row more)."""
    return start_reducescatter(
        tensor,
        name,
        resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        process_set_id(process_set, "reducescatter"),
    )


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression=None,
    op: Optional[int] = Average,
    process_set=_GLOBAL,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
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
        out = ReducescatterFn.apply(tensor, name, op, prescale_factor, postscale_factor, ps)
    else:
        out = synchronize(
            start_reducescatter(tensor, name, op, prescale_factor, postscale_factor, ps)
        )
    return compression.decompress(out, ctx) if compression is not None else out


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: Optional[int] = Average,
    process_set=_GLOBAL,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """reducescatter of each tensor, submitted together; synchronize() returns the list."""
    ps = process_set_id(process_set, "grouped_reducescatter")
    tensors = list(tensors)
    op = resolve_op(op, None)
    base, names = _grouped_names(REDUCESCATTER, name, len(tensors), ps)
    return group(
        [
            start_reducescatter(t, n, op, prescale_factor, postscale_factor, ps)
            for t, n in zip(tensors, names)
        ],
        base,
    )


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression=None,
    op: Optional[int] = Average,
    process_set=_GLOBAL,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[torch.Tensor]:
    """reducescatter of each tensor, together; differentiable and compressed as reducescatter."""
    ps = process_set_id(process_set, "grouped_reducescatter")
    tensors = list(tensors)
    op = resolve_op(op, None)
    tensors, ctxs = _compress_all(compression, tensors)
    if _differentiable(*tensors):
        _, names = _grouped_names(REDUCESCATTER, name, len(tensors), ps)
        outs = [
            ReducescatterFn.apply(t, n, op, prescale_factor, postscale_factor, ps)
            for t, n in zip(tensors, names)
        ]
    else:
        outs = synchronize(
            grouped_reducescatter_async(
                tensors, name, op, process_set, prescale_factor, postscale_factor
            )
        )
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
    indices_handle = submit_owned(
        ALLGATHER,
        t.indices().t().contiguous(),
        _naming.part(name, _naming.INDICES),
        "sparse_allreduce_async",
        ps,
    )
    values_handle = submit_owned(
        ALLGATHER,
        t.values().contiguous(),
        _naming.part(name, _naming.VALUES),
        "sparse_allreduce_async",
        ps,
    )
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
