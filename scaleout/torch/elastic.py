"""Elastic training for PyTorch with Horovod's names (`hvd.elastic` of scaleout.torch):
`run`, `TorchState(model, optimizer, **kwargs)`, `ElasticSampler`, and the framework-neutral
names of scaleout.elastic."""

from scaleout.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HostUpdateResult,
    ObjectState,
    State,
    run,
)
from scaleout.torch._elastic_sampler import ElasticSampler
from scaleout.torch._elastic_state import TorchState

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TorchState",
    "ElasticSampler",
    "HostsUpdatedInterrupt",
    "HostUpdateResult",
    "HorovodInternalError",
]
