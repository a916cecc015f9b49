"""Elastic training's state objects, as Horovod's (exported by scaleout.elastic and each
framework's `hvd.elastic`).

Note [Elastic state]
Horovod's contract, kept: `commit()` is `save()` (an in-memory copy of the state to roll back
to) then `check_host_updates()` (collective: rank 0's view of host changes, broadcast, raises
HostsUpdatedInterrupt when there are any); `restore()` rolls back to the last save; `sync()`
makes every rank's state rank 0's (and saves it); `on_reset()` runs the reset callbacks, after
a reset and before the state is synchronized. `ObjectState` keeps its keyword arguments as
attributes; what is saved and synced is the values at the last save, not the live ones.

scaleout's addition: a commit must outlive the process and the host that made it (Note
[Commit store]). With a durable store attached (`attach_store`: the elastic driver's jobs do
it), `commit()` also writes the saved state's bytes (`serialized()`) to every host's store, and
`resume()` loads the newest commit any host holds (`load_serialized`) in a restarted job, which
may have another number of ranks.
"""

from __future__ import annotations

import io
import pickle
import queue
import struct
from typing import Any, Callable, Dict, List, Optional

import cloudpickle

from scaleout import _runtime
from scaleout._commit_protocol import commit, newest_commit
from scaleout._commit_store import CommitStore
from scaleout._elastic_protocol import HostUpdateResult
from scaleout._objects import broadcast_object

__all__ = ["HostsUpdatedInterrupt", "State", "ObjectState", "pack", "unpack"]

# Note [Commit format]
# A commit's bytes are written to every host's store and read back by a new process, perhaps
# with another number of ranks, so they hold a whole state (a 100 MB model's). They are pickled
# with protocol 5, its large buffers (numpy arrays; torch tensors through TorchState's reducer)
# kept out of band: `pack` returns the pieces as they are in memory (no copy), which the store
# writes one after the other, and `unpack` reads the arrays back as views of the file's bytes.
#   magic | pickle's length, buffer count (u64) | each buffer's length (u64) | pickle | buffers,
# each buffer starting at a multiple of 64 bytes.
_MAGIC = b"SOST"
_ALIGN = 64


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle, protocol 5, with a reducer of the caller's tried first."""

    def __init__(self, file, buffer_callback, reduce: Optional[Callable[[Any], Any]]):
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._reduce = reduce

    def reducer_override(self, obj):
        if self._reduce is not None:
            reduced = self._reduce(obj)
            if reduced is not NotImplemented:
                return reduced
        return super().reducer_override(obj)


def pack(obj: Any, reduce: Optional[Callable[[Any], Any]] = None) -> List[Any]:
    """`obj` as the pieces of a commit (Note [Commit format]); `reduce(obj)` may give a pickle
    reduction for objects it knows (NotImplemented otherwise)."""
    buffers: List[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _Pickler(stream, buffers.append, reduce).dump(obj)
    raws = [b.raw() for b in buffers]
    head = struct.pack(
        f"<4sQQ{len(raws)}Q", _MAGIC, stream.tell(), len(raws), *(r.nbytes for r in raws)
    )
    pieces, offset = [head, stream.getbuffer()], len(head) + stream.tell()
    for raw in raws:
        padding = -offset % _ALIGN
        pieces += [bytes(padding), raw]
        offset += padding + raw.nbytes
    return pieces


def unpack(data: Any) -> Any:
    """What `pack` packed, from its pieces' bytes one after the other (the buffers' arrays are
    views of `data`: pass a writable buffer for writable arrays)."""
    view = memoryview(data).cast("B")
    magic, length, count = struct.unpack_from("<4sQQ", view)
    if magic != _MAGIC:
        raise ValueError("not a scaleout commit (it does not start with its mark)")
    sizes = struct.unpack_from(f"<{count}Q", view, 20)
    offset = 20 + 8 * count
    pickled = view[offset : offset + length]
    offset += length
    buffers = []
    for size in sizes:
        offset += -offset % _ALIGN
        buffers.append(view[offset : offset + size])
        offset += size
    return pickle.loads(pickled, buffers=buffers)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by check_host_updates() (so by commit()) on every rank when hosts were added or
    removed; `skip_sync` is True when hosts were only removed (the survivors' state is alike)."""

    def __init__(self, skip_sync: bool) -> None:
        self.skip_sync = skip_sync


def _default_bcast_object(obj: Any) -> Any:
    return broadcast_object(obj, root_rank=0)


def _default_rank() -> int:
    return _runtime.rank()


class State:
    """The base class (see Note [Elastic state]). `bcast_object(obj)` (rank 0's obj on every
    rank) and `get_rank()` are Horovod's arguments; scaleout's broadcast_object and rank by
    default. As Horovod's, a state only ever broadcasts from rank 0 and calls bcast_object with
    the object alone, so a one-argument function (broadcast_object_fn()'s) serves."""

    def __init__(
        self,
        bcast_object: Optional[Callable[..., Any]] = None,
        get_rank: Optional[Callable[[], int]] = None,
    ) -> None:
        self._bcast_object = bcast_object or _default_bcast_object
        self._rank = get_rank or _default_rank
        self._host_messages: "queue.Queue" = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []
        self._store: Optional[CommitStore] = None
        self._attached = False
        self._commits = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after a reset, before the state is synchronized."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: int) -> None:
        """Called (on rank 0) when the driver reports a change of hosts."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Saves the state (and, with a store attached, makes it durable on every host), then
        checks for host updates: may raise HostsUpdatedInterrupt."""
        self.save()
        if self._attached:
            # Only a host's writer needs the bytes (and reports, on every rank, if it cannot
            # make them).
            commit(self._store, self._commits, self.serialized)
            self._commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Collective: rank 0's host updates since the last check, on every rank."""
        previous = self._last_updated_timestamp
        newest, flags = previous, HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
            flags |= update
        previous, newest, flags = self._bcast_object((previous, newest, flags))
        self._last_updated_timestamp = newest
        if newest > previous:
            raise HostsUpdatedInterrupt(flags == HostUpdateResult.removed)

    # ---- durable commits (scaleout's) ----

    def attach_store(self, store: Optional[CommitStore]) -> None:
        """Makes commits durable: every host's first rank passes its host's store (the others
        None); every rank calls it."""
        self._store, self._attached = store, True

    def resume(self) -> bool:
        """Collective: loads the newest commit any host holds; False when there is none."""
        found = newest_commit(self._store)
        if found is None:
            return False
        commit_id, payload = found
        self.load_serialized(payload)
        self._commits = commit_id + 1
        return True

    # ---- what a subclass provides ----

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Called on reset, before the callbacks."""

    # The framework's reducer for pack (TorchState's turns tensors into out-of-band buffers).
    _pickle_reduce: Optional[Callable[[Any], Any]] = None

    def serialized(self) -> List[Any]:
        """The last saved state as the pieces of a commit (Note [Commit format])."""
        return pack(self._serializable(), type(self)._pickle_reduce)

    def load_serialized(self, payload: Any) -> None:
        """Sets the state, and the saved copy restore() goes back to, from serialized()'s
        bytes."""
        self._load_serializable(unpack(payload))

    def _serializable(self) -> Dict[str, Any]:
        """The last saved state, as Python objects a new process can load."""
        raise NotImplementedError()

    def _load_serializable(self, loaded: Dict[str, Any]) -> None:
        raise NotImplementedError()


class ObjectState(State):
    """State of plain Python values: each keyword argument becomes an attribute; save() keeps
    their current values (by reference, as Horovod's), restore() puts them back, sync() makes
    every rank's saved values rank 0's."""

    def __init__(
        self,
        bcast_object: Optional[Callable[..., Any]] = None,
        get_rank: Optional[Callable[[], int]] = None,
        **kwargs: Any,
    ) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def _serializable(self) -> Dict[str, Any]:
        return {"objects": self._saved_state}

    def _load_serializable(self, loaded: Dict[str, Any]) -> None:
        self._saved_state = loaded["objects"]
        self._set_attrs()
