"""Registering process sets (Horovod's init(process_sets=...), add_process_set,
remove_process_set), and so the public init(): registering runs collectives, so it sits above
the collectives, while looking a set up (scaleout._process_sets) sits below them."""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Sequence, Tuple, Union

from scaleout import _binding, _runtime
from scaleout._errors import InvalidArgumentError
from scaleout._objects import allgather_object
from scaleout._process_sets import ProcessSet, global_process_set

__all__ = ["init", "add_process_set", "remove_process_set"]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Starts scaleout on every rank (collective). `comm`: an mpi4py communicator (default
    MPI.COMM_WORLD) or a list of world ranks. Called again while running, it starts nothing
    and, as Horovod's, gives the ProcessSet objects of `process_sets` the ids of the sets
    registered already. `process_sets` (Horovod's): a list of ProcessSet objects to register
    now (collectively, in order), or "dynamic" to allow add_process_set/remove_process_set
    later."""
    check_init_argument(process_sets)
    if _runtime.start(comm):
        _at_init(process_sets)
    elif process_sets is not None and not isinstance(process_sets, str):
        # Running already: as Horovod's init, the objects get the ids of the registered sets.
        _assign(process_sets)


_dynamic = False
# The registered sets' ids by their ranks (the global set's included), as this rank knows them,
# and the objects given each id (a removed set's are all unregistered, as in Horovod).
_ids: Dict[Tuple[int, ...], int] = {}
_holders: Dict[int, List["weakref.ref[ProcessSet]"]] = {}


def _hold(ps: ProcessSet) -> None:
    if ps.process_set_id is not None:
        _holders.setdefault(ps.process_set_id, []).append(weakref.ref(ps))


def _comm_ranks(comm: Any) -> List[int]:
    """The job's ranks of an mpi4py communicator's members (the job runs on COMM_WORLD)."""
    from mpi4py import MPI

    return sorted(
        MPI.Group.Translate_ranks(
            comm.Get_group(), list(range(comm.Get_size())), MPI.COMM_WORLD.Get_group()
        )
    )


def _at_init(process_sets: Union[None, str, Sequence[ProcessSet]]) -> None:
    """init()'s part: registers the sets given and notes whether sets may be added later.
    Ranks may give different lists (each rank the communicator it belongs to, as Horovod allows):
    every set any rank gave is registered, in the order of the first rank that gave it, and each
    object gets its set's id; an object whose set an earlier one in the list has is left
    unregistered, as in Horovod."""
    global _dynamic
    global_process_set.ranks = list(range(_runtime.size()))
    _dynamic = (
        process_sets == "dynamic" or _runtime.config().get("SCALEOUT_DYNAMIC_PROCESS_SETS") == "1"
    )
    _ids.clear()
    _holders.clear()
    _ids[tuple(global_process_set.ranks)] = 0
    if process_sets is None or isinstance(process_sets, str):
        return
    for ps in process_sets:
        if ps.ranks is None:
            ps.ranks = _comm_ranks(ps.mpi_comm)
    everyone = allgather_object(
        [tuple(ps.ranks) for ps in process_sets], name="scaleout.init.process_sets"
    )
    for ranks in (ranks for given in everyone for ranks in given):
        if ranks not in _ids:
            _ids[ranks] = _binding.add_process_set(list(ranks))
    _assign(process_sets)


def _assign(process_sets: Sequence[ProcessSet]) -> None:
    """Gives each object its registered set's id, as Horovod's init: an object whose set an
    earlier entry has (the same ranks, in any order) stays unregistered, and then init raises a
    ValueError naming the first such entry (scaleout keeps running: init again with a list
    without it). A set of every rank is the global set's (id 0), which is not in the list:
    a duplicate too, as in Horovod."""
    seen = {0}
    for ps in process_sets:
        if ps.ranks is None:
            ps.ranks = _comm_ranks(ps.mpi_comm)
        set_id = _ids.get(tuple(ps.ranks))
        if set_id is None:
            raise InvalidArgumentError(
                f"init(process_sets=...): {ps} is not registered; scaleout is running already "
                "with the sets of its first init (add it with add_process_set, with dynamic "
                "process sets on)"
            )
        ps.process_set_id = None if set_id in seen else set_id
        seen.add(set_id)
        _hold(ps)
    for index, ps in enumerate(process_sets):
        if ps.process_set_id is None:
            raise InvalidArgumentError(
                f"scaleout could not be initialized because process_sets entry number {index} is "
                f"a duplicate: {ps}"
            )


def check_init_argument(process_sets: Any) -> None:
    """Refuses what init(process_sets=...) cannot take, before anything starts."""
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, str) or not all(isinstance(p, ProcessSet) for p in process_sets):
        raise InvalidArgumentError(
            f"init(process_sets=...) takes a list of ProcessSet objects or "
            f"'dynamic', not {process_sets!r}"
        )


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Adds a process set after init (every rank calls it, in the same order) and returns it.
    Needs dynamic process sets (see scaleout._process_sets' docstring). No set with the same
    ranks may exist already."""
    if not _dynamic:
        raise InvalidArgumentError(
            "add_process_set: dynamic process sets are off; call init(process_sets='dynamic') or "
            "set SCALEOUT_DYNAMIC_PROCESS_SETS=1 (or HOROVOD_DYNAMIC_PROCESS_SETS=1)"
        )
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "adding a process set made from an MPI communicator after init "
            "is not implemented; make it from a list of ranks"
        )
    process_set.process_set_id = _binding.add_process_set(process_set.ranks)
    _ids[tuple(process_set.ranks)] = process_set.process_set_id
    _hold(process_set)
    return process_set


def member_process_set(ranks: Sequence[int]) -> ProcessSet:
    """The process set of `ranks` (sorted), made by those ranks alone: each of them calls this,
    the job's other ranks do not (torch.distributed's new_group). No dynamic process sets
    needed: nothing changes on the other ranks. An existing set of these ranks is returned;
    a new one lives until shutdown."""
    process_set = ProcessSet(ranks)
    process_set.process_set_id = _binding.add_member_process_set(process_set.ranks)
    _hold(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set (every rank calls it); returns False for the global set or a set
    that is not registered. A set with collectives in flight on any rank is not removed: an
    InvalidArgumentError names the ranks."""
    if not _dynamic:
        raise InvalidArgumentError(
            "remove_process_set: dynamic process sets are off; call init(process_sets='dynamic') "
            "or set SCALEOUT_DYNAMIC_PROCESS_SETS=1 (or HOROVOD_DYNAMIC_PROCESS_SETS=1)"
        )
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    _binding.remove_process_set(set_id)
    process_set._invalidate()
    for held in _holders.pop(set_id, []):
        other = held()
        if other is not None and other.process_set_id == set_id:
            other._invalidate()
    for ranks in [ranks for ranks, known in _ids.items() if known == set_id]:
        del _ids[ranks]
    return True
