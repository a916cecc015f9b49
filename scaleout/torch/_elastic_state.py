"""TorchState, as Horovod's (scaleout.torch.elastic). See Note [Elastic state] in
scaleout/_elastic_state.py.

The model, the optimizer and ElasticSamplers among the keyword arguments get handlers: save()
keeps a deep copy of their state_dict(), restore() loads it back, sync() broadcasts rank 0's
(broadcast_parameters, broadcast_optimizer_state, and the sampler's state, which re-shards it);
every other keyword argument is an ObjectState attribute. Assigning a handled attribute
(`state.model = other`) switches the handler to the new object and saves it.
"""

from __future__ import annotations

import copy
from typing import Any, Dict

import numpy as np
import torch

from scaleout._elastic_state import ObjectState
from scaleout._objects import broadcast_object
from scaleout._runtime import rank
from scaleout.torch._broadcast import broadcast_optimizer_state, broadcast_parameters
from scaleout.torch._elastic_sampler import ElasticSampler

__all__ = ["TorchState"]


def _reduce_tensor(obj: Any) -> Any:
    """A dense CPU tensor as its bytes, which pickle keeps out of band (Note [Commit format]),
    and what rebuilds it; NotImplemented for anything else."""
    if (
        not isinstance(obj, torch.Tensor)
        or obj.layout is not torch.strided
        or obj.device.type != "cpu"
    ):
        return NotImplemented
    flat = obj.detach().contiguous().reshape(-1)
    return (_tensor_from_bytes, (flat.view(torch.uint8).numpy(), str(obj.dtype), tuple(obj.shape)))


def _tensor_from_bytes(data: np.ndarray, dtype: str, shape: tuple) -> torch.Tensor:
    return torch.from_numpy(data).view(getattr(torch, dtype.split(".")[-1])).reshape(shape)


class _Handler:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        raise NotImplementedError()


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(
            broadcast_object(self.value.state_dict(), root_rank=0, name="TorchState.sampler")
        )


def _handler_for(value: Any):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """State of a torch training: TorchState(model=None, optimizer=None, **kwargs)."""

    def __init__(
        self, model: torch.nn.Module = None, optimizer: torch.optim.Optimizer = None, **kwargs: Any
    ) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, _Handler] = {}
        plain: Dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
            handlers[name].save()
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    _pickle_reduce = staticmethod(_reduce_tensor)

    def _serializable(self) -> Dict[str, Any]:
        return {
            **super()._serializable(),
            "handlers": {name: h.saved for name, h in self._handlers.items()},
        }

    def _load_serializable(self, loaded: Dict[str, Any]) -> None:
        for name, saved in loaded["handlers"].items():
            handler = self._handlers[name]
            handler.saved = saved
            handler.restore()
        super()._load_serializable(loaded)
