"""Making every rank start from root's model and optimizer state."""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, NamedTuple, Tuple, Union

import torch

from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._naming import member, part
from scaleout._native import synchronize
from scaleout._objects import broadcast_object
from scaleout._process_sets import global_process_set, process_set_id
from scaleout._runtime import rank
from scaleout.torch._optimizer import _DistributedMixin
from scaleout.torch._reductions import STATE_KEY
from scaleout.torch._tensors import start_broadcast

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


def broadcast_parameters(
    params: Union[Mapping[str, torch.Tensor], Iterable[Any]],
    root_rank: int,
    process_set=global_process_set,
    *,
    name: str = "broadcast_parameters",
) -> None:
    """Overwrites, in place, each tensor with root_rank's value, as Horovod's does: a dict such
    as `model.state_dict()` (parameters and buffers such as BatchNorm statistics; broadcast in
    sorted key order), or a list of tensors (`list(model.parameters())`) or of (name, tensor)
    pairs (`list(model.named_parameters())`); an iterator of either is accepted too. Every rank
    must pass the same structure; the broadcasts run concurrently and are fused by the core.
    `name` prefixes the collectives' names. With `process_set`, among that set's ranks
    (root_rank is the job's rank, a member of the set)."""
    ps = process_set_id(process_set, "broadcast_parameters")
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise InvalidArgumentError(
            f"broadcast_parameters takes a dict or a list of tensors or "
            f"(name, tensor) pairs, not {type(params).__name__}"
        )
    handles = []
    for index, item in enumerate(items):
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and (item[0] is None or isinstance(item[0], str))
        ):
            raise InvalidArgumentError(
                "broadcast_parameters takes tensors or (name, tensor) "
                f"pairs, got {type(item).__name__} {str(item)[:60]}"
            )
        key, tensor = item
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(
                f"broadcast_parameters: '{key}' is a {type(tensor).__name__}, not a tensor"
            )
        label = key if key is not None else f"#{index}"
        handles.append(start_broadcast(tensor, root_rank, member(name, label), True, ps))
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


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int,
    model=None,
    process_set=global_process_set,
    *,
    name: str = "broadcast_optimizer_state",
) -> None:
    """Gives every rank root_rank's optimizer state: the options of every parameter group (lr,
    momentum, betas, ..., tensor-valued ones included), per-parameter tensors (momentum buffers,
    Adam moments) and scalar state (step counts), value for value.

    As Horovod's does, a rank whose optimizer state is still empty first initializes it with
    one step of the wrapped optimizer on zero gradients (p.grad is left as zeros; for a
    DistributedOptimizer the step does not reduce), so a fresh Adam has step 1 on every rank
    afterwards; an optimizer that keeps no state then has nothing to broadcast. Unlike
    Horovod's, torch.optim.LBFGS is broadcast too (its state is not initialized first). `model`
    is accepted for Horovod compatibility and not needed.

    Root sends the structure with the scalars (broadcast_object), then the tensors (in-place
    broadcasts, fused by the core); the other ranks load the result with load_state_dict()."""
    del model
    ps = process_set_id(process_set, "broadcast_optimizer_state")
    if not optimizer.state_dict()["state"] and not isinstance(optimizer, torch.optim.LBFGS):
        _initialize_state(optimizer)
    is_root = rank() == root_rank
    tensors: List[torch.Tensor] = []
    # Compression.topk's residuals are per rank (what each has not sent): each keeps its own.
    skeleton = _split(_without_topk(optimizer.state_dict()), tensors) if is_root else None
    skeleton = broadcast_object(
        skeleton, root_rank, name=part(name, "structure"), process_set=process_set
    )
    if not is_root:
        _collect_slots(skeleton, tensors)
    handles = [
        start_broadcast(t, root_rank, member(name, i), True, ps) for i, t in enumerate(tensors)
    ]
    _wait_all(handles)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _without_topk(state_dict: dict) -> dict:
    return {k: v for k, v in state_dict.items() if k != STATE_KEY}


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """One step on zero gradients of the optimizer itself (never a reducing step)."""
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                grad = torch.zeros_like(p)
                p.grad = grad.to_sparse() if sparse else grad
    base = type(optimizer)
    if isinstance(optimizer, _DistributedMixin):
        base = base.__mro__[base.__mro__.index(_DistributedMixin) + 1]
    base.step(optimizer)


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
