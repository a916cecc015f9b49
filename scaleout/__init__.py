"""scaleout: data-parallel distributed training over MPI, with Horovod's API.

    import scaleout as hvd
    hvd.init()
    total = hvd.allreduce(np.ones(4), op=hvd.Sum)

Framework shims live in scaleout.torch and scaleout.tensorflow; the launcher is `scaleoutrun`.
Importing scaleout does not load MPI: that happens in init().
"""

from scaleout import _frontend_api
from scaleout._frontend_api import *  # noqa: F401,F403
from scaleout._ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)

__version__ = "0.1.0"

__all__ = _frontend_api.__all__ + [
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
