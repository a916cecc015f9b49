"""Process sets, as Horovod's: groups of ranks that run collectives among themselves.

Make one from the job's ranks (or an mpi4py communicator, at init only), pass it to
`init(process_sets=[...])` or, with dynamic process sets on (`init(process_sets="dynamic")`, or
SCALEOUT_DYNAMIC_PROCESS_SETS=1 / HOROVOD_DYNAMIC_PROCESS_SETS=1), to `add_process_set` at any
time; then give it to a collective's `process_set=`. Adding and removing are collective: every
rank of the job calls them, in the same order. As in Horovod, ranks given to collectives (a
broadcast's root) are the job's ranks, not ranks within the set; splits and results follow the
set's order. See Note [Process sets] in native/runtime/runtime.h.

This module is the lookup every collective needs (the ProcessSet type, the global set, a set's
core id, rank and size); registering sets (at init, add_process_set, remove_process_set) runs
collectives and is scaleout._process_set_registry's.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Union

from scaleout import _binding, _runtime
from scaleout._errors import InvalidArgumentError

__all__ = ["ProcessSet", "global_process_set", "process_set_id", "set_rank", "set_size"]


class ProcessSet:
    """A set of the job's ranks that run collectives together: `ProcessSet([0, 2])`, or
    `ProcessSet(mpi4py_comm)` (registered at init). `process_set_id` is None until it is
    registered with init() or add_process_set()."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]) -> None:
        if _is_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise InvalidArgumentError(
                f"ProcessSet takes a list of ranks or an mpi4py communicator, not {ranks_or_comm!r}"
            ) from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise InvalidArgumentError(f"ProcessSet takes a list of ranks (ints), not {ranks!r}")
        self.ranks = sorted(ranks)

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None while it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_binding.process_set(self.process_set_id)[1])

    def rank(self) -> Optional[int]:
        """This rank's place in the set (-1 when not a member), or None while it is not
        registered. Collectives still take the job's ranks (a broadcast's root_rank)."""
        if self.process_set_id is None:
            return None
        return _binding.process_set(self.process_set_id)[0]

    def included(self) -> Optional[bool]:
        """Whether this rank is in the set, or None while its ranks are not known."""
        if self.ranks is None:
            return None
        return _runtime.rank() in self.ranks

    def __repr__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
            f"mpi_comm={self.mpi_comm})"
        )

    __str__ = __repr__


def _is_comm(obj: Any) -> bool:
    # Without importing mpi4py.MPI, which initializes MPI: an object can only be a
    # communicator if the user has imported it already.
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def set_rank(set_id: int) -> int:
    """This rank's place in the set with core id `set_id` (-1 when not a member)."""
    return _runtime.rank() if set_id == 0 else _binding.process_set(set_id)[0]


def set_size(set_id: int) -> int:
    """The number of ranks in the set with core id `set_id`."""
    return _runtime.size() if set_id == 0 else len(_binding.process_set(set_id)[1])


def process_set_id(process_set: Optional[ProcessSet], what: str) -> int:
    """The core's id of a collective's process_set= argument (None: the global set)."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(f"{what}: process_set must be a ProcessSet, not {process_set!r}")
    if process_set.process_set_id is None:
        raise InvalidArgumentError(
            f"{what}: {process_set} is not registered: pass it to init("
            "process_sets=[...]) or add_process_set() first (or it was "
            "removed)"
        )
    return process_set.process_set_id
