"""Making every rank start from root's model and optimizer state."""
from __future__ import annotations

from typing import Any, Iterable, List, Mapping, NamedTuple, Tuple, Union

import torch

from scaleout._basics import rank
from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._objects import broadcast_object
from scaleout._core import synchronize
from scaleout.torch._collectives import _broadcast_async

__all__ = ["broadcast_parameters", "broadcast_optimizer_state"]


def _wait_all(handles) -> None:
    error = None
    for h in handles:
        try:  # wait for every one, so no buffer is still in use when an error is raised
            synchronize(h)
        except ScaleoutError as exc:
            error = error or exc
    if error is not None:
        raise error


def broadcast_parameters(params: Union[Mapping[str, torch.Tensor],
                                       Iterable[Tuple[str, torch.Tensor]]],
                         root_rank: int = 0, name: str = "broadcast_parameters") -> None:
    """Overwrites, in place, each tensor with root_rank's value: `model.state_dict()` (parameters
    and buffers such as BatchNorm statistics) or `model.named_parameters()`. Every rank must
    pass the same names; the broadcasts run concurrently and are fused by the core."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    handles = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidArgumentError("broadcast_parameters takes a state_dict or (name, tensor) "
                                       f"pairs, got {type(item).__name__}")
        key, tensor = item
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"broadcast_parameters: '{key}' is a "
                                       f"{type(tensor).__name__}, not a tensor")
        handles.append(_broadcast_async(tensor, root_rank, f"{name}.{key}", inplace=True))
    _wait_all(handles)


class _TensorSlot(NamedTuple):
    """Stands for a tensor in the state skeleton that root sends with broadcast_object."""
    index: int
    shape: Tuple[int, ...]
    dtype: str


def _split(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        dtype = str(obj.dtype).replace("torch.", "")
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), dtype)
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_split(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_split(v, tensors) for v in obj)
    return obj


def _fill(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              name: str = "broadcast_optimizer_state") -> None:
    """Gives every rank root_rank's optimizer state: hyper-parameters of every parameter group
    (lr, momentum, betas, ...), per-parameter tensors (momentum buffers, Adam moments) and scalar
    state (step counts), whether or not this rank's state is still empty.

    Root sends the structure with the scalars (broadcast_object), then the tensors (in-place
    broadcasts, fused by the core); the other ranks load the result with load_state_dict()."""
    is_root = rank() == root_rank
    tensors: List[torch.Tensor] = []
    skeleton = _split(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, name=f"{name}.structure")
    if not is_root:
        _collect_slots(skeleton, tensors)
    handles = [_broadcast_async(t, root_rank, f"{name}.{i}", inplace=True)
               for i, t in enumerate(tensors)]
    _wait_all(handles)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _collect_slots(obj: Any, tensors: List[torch.Tensor]) -> None:
    """Allocates, in index order, a tensor for every slot of root's skeleton."""
    slots: List[_TensorSlot] = []

    def walk(o):
        if isinstance(o, _TensorSlot):
            slots.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(obj)
    slots.sort(key=lambda s: s.index)
    tensors.extend(torch.empty(s.shape, dtype=getattr(torch, s.dtype)) for s in slots)
