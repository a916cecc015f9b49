"""scaleout: data-parallel distributed training over MPI, with Horovod's API.

    import scaleout as hvd
    hvd.init()
    total = hvd.allreduce(np.ones(4), op=hvd.Sum)

Framework shims live in scaleout.torch and scaleout.tensorflow; the launcher is `scaleoutrun`.
"""
from scaleout._basics import (config, cross_rank, cross_size, init, is_initialized, local_rank,
                              local_size, mpi_built, mpi_threads_supported, placement, rank,
                              shutdown, size)
from scaleout._errors import (DuplicateNameError, InternalError, InvalidArgumentError,
                              MismatchError, MPINotFoundError, NotInitializedError,
                              ScaleoutError, ScaleoutTimeoutError, ShutDownError, TransportError)
from scaleout._objects import allgather_object, broadcast_object
from scaleout._ops import (Average, Handle, Max, Min, Product, Sum, allgather, allgather_async,
                           allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                           alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                           broadcast_async_, grouped_allreduce, grouped_allreduce_,
                           grouped_allreduce_async, grouped_allreduce_async_, join, poll,
                           reducescatter, reducescatter_async, synchronize)

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_built", "mpi_threads_supported", "config", "placement",
    "Average", "Sum", "Min", "Max", "Product", "Handle",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "barrier", "join", "poll", "synchronize",
    "broadcast_object", "allgather_object",
    "ScaleoutError", "InvalidArgumentError", "NotInitializedError", "ShutDownError",
    "MismatchError", "DuplicateNameError", "TransportError", "ScaleoutTimeoutError",
    "InternalError", "MPINotFoundError",
]
