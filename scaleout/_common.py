"""The names every front end (scaleout, scaleout.torch, scaleout.tensorflow) exports alike:
process state, reduce ops, handles, object collectives and the exception classes."""
from scaleout._basics import (ccl_built, ddl_built, gloo_built, is_homogeneous, start_timeline,
                              stats, stop_timeline)
from scaleout._basics import (config, cross_rank, cross_size, cuda_built, gloo_enabled, init,
                              is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                              mpi_threads_supported, nccl_built, placement, rank, rocm_built,
                              shutdown, size)
from scaleout._errors import (DeadlockError, DuplicateNameError, HorovodInternalError, InternalError,
                              InvalidArgumentError, MismatchError, MPINotFoundError,
                              NotInitializedError, PeerFailedError, ScaleoutError,
                              ScaleoutTimeoutError, ShutDownError, TransportError)
from scaleout._objects import allgather_object, broadcast_object
from scaleout._core import Adasum, Average, Handle, Max, Min, Product, Sum
from scaleout._errors import NotYetImplementedError
from scaleout._process_sets import (ProcessSet, add_process_set, global_process_set,
                                    remove_process_set)

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
