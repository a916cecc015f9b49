"""The names every front end (scaleout, scaleout.torch, scaleout.tensorflow) exports alike:
process state, reduce ops, handles, object collectives and the exception classes."""
from scaleout._errors import (DeadlockError, DuplicateNameError, HorovodInternalError,
                              InternalError, InvalidArgumentError, MismatchError,
                              MPINotFoundError, NotInitializedError, NotYetImplementedError,
                              PeerFailedError, ScaleoutError, ScaleoutTimeoutError, ShutDownError,
                              TransportError)
from scaleout._native import Adasum, Average, Handle, Max, Min, Product, Sum
from scaleout._objects import allgather_object, broadcast_object
from scaleout._process_set_registry import add_process_set, init, remove_process_set
from scaleout._process_sets import ProcessSet, global_process_set
from scaleout._runtime import (ccl_built, config, cross_rank, cross_size, cuda_built, ddl_built,
                               gloo_built, gloo_enabled, is_homogeneous, is_initialized,
                               local_rank, local_size, mpi_built, mpi_enabled,
                               mpi_threads_supported, nccl_built, placement, rank, rocm_built,
                               shutdown, size, start_timeline, stats, stop_timeline)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "config", "placement",
    "gloo_built", "ccl_built", "ddl_built", "is_homogeneous", "start_timeline", "stop_timeline",
    "stats",
    "Average", "Sum", "Min", "Max", "Product", "Handle",
    "broadcast_object", "allgather_object",
    "ScaleoutError", "InvalidArgumentError", "NotInitializedError", "ShutDownError",
    "MismatchError", "DuplicateNameError", "DeadlockError", "TransportError", "ScaleoutTimeoutError",
    "InternalError", "MPINotFoundError", "PeerFailedError", "HorovodInternalError",
    "NotYetImplementedError", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Adasum",
]
