"""Collectives on arbitrary Python objects, serialised with cloudpickle."""

from __future__ import annotations

import io
from typing import Any, List, Optional

import cloudpickle
import numpy as np

from scaleout._naming import DATA, SIZE, part
from scaleout._ops import allgather, broadcast_
from scaleout._runtime import rank

__all__ = ["broadcast_object", "allgather_object", "broadcast_bytes"]


def _dumps(obj: Any) -> np.ndarray:
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def broadcast_bytes(data: Any, root_rank: int, name: str, process_set=None) -> Any:
    """root_rank's bytes-like `data` on every rank (others pass None): root_rank gets its own
    `data` back, the others a writable uint8 array."""
    if rank() == root_rank:
        payload = np.frombuffer(data, dtype=np.uint8)
        if not payload.flags.writeable:  # the core writes into what it sends from, in place
            payload = payload.copy()
    else:
        payload = np.zeros(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    broadcast_(length, root_rank, name=part(name, SIZE), process_set=process_set)
    if rank() != root_rank:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    broadcast_(payload, root_rank, name=part(name, DATA), process_set=process_set)
    return data if rank() == root_rank else payload


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set=None
) -> Any:
    """Returns root_rank's `obj` on every rank of the process set (the global one by default;
    other ranks' `obj` is ignored)."""
    name = name or "broadcast_object"
    payload = _dumps(obj) if rank() == root_rank else None
    data = broadcast_bytes(payload, root_rank, name, process_set)
    return obj if rank() == root_rank else cloudpickle.loads(data)


def allgather_object(obj: Any, name: Optional[str] = None, process_set=None) -> List[Any]:
    """Returns the list of every rank's `obj` (of the process set, the global one by default),
    in rank order."""
    name = name or "allgather_object"
    payload = _dumps(obj)
    sizes = allgather(
        np.array([payload.size], dtype=np.int64), name=part(name, SIZE), process_set=process_set
    )
    data = allgather(payload, name=part(name, DATA), process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(cloudpickle.loads(data[offset : offset + n].tobytes()))
        offset += n
    return out
