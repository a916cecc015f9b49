"""scaleout for PyTorch, with Horovod's names: `import scaleout.torch as hvd`.

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Tensors are CPU torch tensors; the core works on their memory directly (no copy for contiguous
tensors). GPU tensors are not supported yet.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "scaleout.torch needs PyTorch: pip install torch==2.13.0 (or pip install 'scaleout[torch]')"
    ) from exc

from scaleout import _frontend_api
from scaleout._errors import ScaleoutError as _ScaleoutError
from scaleout._frontend_api import *  # noqa: F401,F403

# Scripts written for Horovod's early torch releases catch torch.FatalError: with scaleout.torch
# imported, every scaleout error is one too (a base of the one root class; RuntimeError stays
# first, so nothing else about the classes changes).
if hasattr(_torch, "FatalError") and not issubclass(_ScaleoutError, _torch.FatalError):
    _ScaleoutError.__bases__ = (RuntimeError, _torch.FatalError)
from scaleout.torch import elastic
from scaleout.torch._broadcast import broadcast_optimizer_state, broadcast_parameters
from scaleout.torch._collectives import (
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
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from scaleout.torch._compression import Compression
from scaleout.torch._local_sgd import LocalSGDOptimizer
from scaleout.torch._optimizer import DistributedOptimizer
from scaleout.torch._sync_batch_norm import SyncBatchNorm

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
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "DistributedOptimizer",
    "LocalSGDOptimizer",
    "Compression",
    "SyncBatchNorm",
    "elastic",
]

# Note [torch.distributed backend]: dist.init_process_group("scaleout"), where torch was built
# with torch.distributed (pip's wheels are).
if _torch.distributed.is_available():
    from scaleout.torch._process_group import register as _register_backend

    _register_backend()
