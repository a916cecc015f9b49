"""Collectives on numpy arrays (and anything with the buffer protocol or DLPack).

Every collective has a name; the same name on every rank means the same collective. Without a
name, one is generated from a per-kind counter, so ranks must then call unnamed collectives in
the same order (as with Horovod).
"""

from __future__ import annotations

import numpy as np

from scaleout import _naming
from scaleout._arrays import splits_array, submit_into, submit_owned
from scaleout._native import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    JOIN,
    OP_NAMES,
    REDUCESCATTER,
    Average,
    Handle,
    Max,
    Min,
    Product,
    Sum,
    allreduce_async_now,
    allreduce_now,
    auto_name,
    group,
    poll,
    resolve_op,
    set_fast_path,
    submit,
    synchronize,
)
from scaleout._process_sets import global_process_set, process_set_id

set_fast_path(np.ndarray, global_process_set, OP_NAMES)

__all__ = [
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Handle",
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
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "barrier",
    "join",
    "poll",
    "synchronize",
]


# ---- allreduce ----


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Starts reducing `tensor` across the ranks of `process_set` (default op Average);
    returns a Handle."""
    return _allreduce(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set, False, False
    )


def _allreduce(
    tensor, average, name, op, prescale_factor, postscale_factor, process_set, inplace, waits
) -> Handle:
    """`waits`: the caller synchronizes at once (Note [Caller drives] in the core)."""
    # The common call (a C-contiguous numpy array, an op code or none, the global set) goes to
    # submit in one step: the general path below costs ~0.5 us more per call, a tenth of a
    # small allreduce. Anything else, or an array submit cannot take as it is, goes that way.
    if (
        type(tensor) is np.ndarray
        and average is None
        and process_set is global_process_set
        and (op is None or (type(op) is int and op in OP_NAMES))
    ):
        try:
            return submit(
                ALLREDUCE,
                name=name,
                data=tensor,
                output=tensor if inplace else np.empty_like(tensor),
                op=Average if op is None else op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                caller_waits=waits,
            )
        except BufferError:
            pass
    return submit_into(
        ALLREDUCE,
        name,
        tensor,
        inplace=inplace,
        op=resolve_op(op, average),
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set_id(process_set, "allreduce_" if inplace else "allreduce"),
        caller_waits=waits,
    )


def allreduce(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> np.ndarray:
    """Reduces `tensor` across ranks and returns the result as a new array."""
    return synchronize(
        _allreduce(
            tensor, average, name, op, prescale_factor, postscale_factor, process_set, False, True
        )
    )


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """In-place form of allreduce_async: the result is written into `tensor`."""
    # The common case in one call of the binding, as allreduce_'s (Note [Synchronous allreduce_])
    handle = allreduce_async_now(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    if handle is not NotImplemented:
        return handle
    return _allreduce(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set, True, False
    )


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """In-place allreduce: the result is written into `tensor`, which is returned."""
    # The common case in one call of the binding (Note [Synchronous allreduce_])
    result = allreduce_now(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    if result is not NotImplemented:
        return result
    return synchronize(
        _allreduce(
            tensor, average, name, op, prescale_factor, postscale_factor, process_set, True, True
        )
    )


def _grouped(
    tensors, average, name, op, prescale_factor, postscale_factor, inplace, process_set, waits=False
) -> Handle:
    op = resolve_op(op, average)
    ps = process_set_id(process_set, "grouped_allreduce")
    base = auto_name(ALLREDUCE, name, ps)
    return group(
        [
            submit_into(
                ALLREDUCE,
                _naming.member(base, i),
                t,
                inplace=inplace,
                op=op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                process_set=ps,
                caller_waits=waits,
            )
            for i, t in enumerate(tensors)
        ],
        base,
    )


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Reduces a list of tensors together (they are fused whenever they fit the buffer)."""
    return _grouped(
        tensors, average, name, op, prescale_factor, postscale_factor, False, process_set
    )


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> list:
    return synchronize(
        _grouped(
            tensors, average, name, op, prescale_factor, postscale_factor, False, process_set, True
        )
    )


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    return _grouped(
        tensors, average, name, op, prescale_factor, postscale_factor, True, process_set
    )


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> list:
    return synchronize(
        _grouped(
            tensors, average, name, op, prescale_factor, postscale_factor, True, process_set, True
        )
    )


# ---- allgather, broadcast, alltoall, reducescatter ----


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank),
    in the order of the set's ranks."""
    return _allgather(tensor, name, process_set, False)


def _allgather(tensor, name, process_set, waits) -> Handle:
    return submit_owned(
        ALLGATHER,
        name,
        tensor,
        process_set=process_set_id(process_set, "allgather"),
        caller_waits=waits,
    )


def allgather(tensor, name=None, process_set=global_process_set) -> np.ndarray:
    return synchronize(_allgather(tensor, name, process_set, True))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Starts sending root_rank's tensor to every rank of the set (root_rank is the job's
    rank, as in Horovod); the result is a new array."""
    return _broadcast(tensor, root_rank, name, process_set, False, False)


def _broadcast(tensor, root_rank, name, process_set, inplace, waits) -> Handle:
    return submit_into(
        BROADCAST,
        name,
        tensor,
        inplace=inplace,
        root_rank=root_rank,
        process_set=process_set_id(process_set, "broadcast_" if inplace else "broadcast"),
        caller_waits=waits,
    )


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> np.ndarray:
    return synchronize(_broadcast(tensor, root_rank, name, process_set, False, True))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """In-place form: root_rank's values are written into `tensor` on every rank."""
    return _broadcast(tensor, root_rank, name, process_set, True, False)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(_broadcast(tensor, root_rank, name, process_set, True, True))


def _alltoall_result(with_splits: bool):
    def finish(result):
        out, received = result
        return (out, np.asarray(received, dtype=np.int64)) if with_splits else out

    return finish


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Sends splits[i] rows (default: equal parts) of `tensor` to the set's i-th rank.
    synchronize() returns the received rows, and the rows received from each rank when splits
    were given."""
    return submit_owned(
        ALLTOALL,
        name,
        tensor,
        splits=splits_array(splits),
        finish=_alltoall_result(splits is not None),
        process_set=process_set_id(process_set, "alltoall"),
    )


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(
    tensor,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Reduces `tensor` across ranks and gives each rank a slice of the first dimension (the
    first dim % size ranks get one row more)."""
    return submit_owned(
        REDUCESCATTER,
        name,
        tensor,
        op=resolve_op(op, None),
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set_id(process_set, "reducescatter"),
    )


def reducescatter(
    tensor,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    return synchronize(
        reducescatter_async(tensor, name, op, prescale_factor, postscale_factor, process_set)
    )


# ---- synchronisation ----


def barrier(name=None, process_set=global_process_set) -> None:
    """Returns once every rank of the set has reached the barrier."""
    synchronize(
        submit(
            BARRIER,
            name=name,
            address=0,
            op=Sum,
            dtype=0,
            shape=(),
            process_set=process_set_id(process_set, "barrier"),
            caller_waits=True,
        )
    )


def join(process_set=global_process_set) -> int:
    """Marks this rank as out of data: until every rank (of the set) has joined, its allreduces
    contribute zeros (Average still divides by the set's full size) and barriers count it as
    there; any other collective fails while a rank has joined, as in Horovod (Note [Join] in
    native/coordinator/negotiator.cc). Blocks until all joined; returns the rank that joined
    last (the job's rank)."""
    return synchronize(
        submit(
            JOIN,
            name="join",
            address=0,
            op=Sum,
            dtype=0,
            shape=(),
            process_set=process_set_id(process_set, "join"),
        )
    )
