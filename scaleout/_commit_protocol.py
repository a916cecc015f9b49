"""The collective protocol over a job's ranks that writes and finds the commits every host keeps
in its CommitStore (Note [Commit store] in scaleout/_commit_store.py): a commit is marked
complete on a host only once every host has written it."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

from scaleout import _runtime
from scaleout._commit_store import Buffer, CommitStore
from scaleout._errors import ScaleoutError
from scaleout._native import Min
from scaleout._objects import allgather_object, broadcast_bytes
from scaleout._ops import allreduce

__all__ = ["commit", "newest_commit"]


def commit(
    store: Optional[CommitStore],
    commit_id: int,
    payload: Union[Buffer, Sequence[Buffer], Callable[[], Any]],
) -> None:
    """Collective: every host's first rank writes `payload` (what CommitStore.write takes, or a
    function making it, called there only) as commit `commit_id` into its `store` (other ranks
    pass None); once every host has written, each marks it complete. Raises on every rank if a
    host could not make or write it."""
    written, why = 1, ""
    if _runtime.local_rank() == 0:
        try:
            store.write(commit_id, payload() if callable(payload) else payload)
        except Exception as e:  # an unpicklable attribute is the program's error, everywhere
            written, why = 0, f"{type(e).__name__}: {e}"
    everywhere = allreduce(
        np.array([written], np.int32), op=Min, name=f"scaleout.commit.{commit_id}"
    )
    if int(everywhere[0]) != 1:
        raise ScaleoutError(
            f"commit {commit_id} was not written on every host" + (f" (here: {why})" if why else "")
        )
    if _runtime.local_rank() == 0:
        store.mark_complete(commit_id)


def newest_commit(store: Optional[CommitStore]) -> Optional[Tuple[int, bytes]]:
    """Collective: the newest commit complete on any host, as (id, bytes) on every rank (sent
    by the lowest rank holding it), or None when no host holds one."""
    mine = -1
    if _runtime.local_rank() == 0 and store is not None:
        newest = store.newest_complete()
        mine = -1 if newest is None else newest
    held = allgather_object(mine, name="scaleout.commit.newest")
    best = max(held)
    if best < 0:
        return None
    holder = held.index(best)
    payload = store.read(best) if _runtime.rank() == holder else None
    return best, broadcast_bytes(payload, root_rank=holder, name="scaleout.commit.restore")
