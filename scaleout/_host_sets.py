"""The process sets of a job's machines, for what averages inside a machine first.

Note [Host sets]
Where the job's allreduces are hierarchical over machines of equal size (Note [Algorithm plan]
in the core), two process sets per rank let a front end do its own two-level exchange: `local`,
the ranks of this rank's machine, and `cross`, the ranks with this rank's local rank on every
machine. An allreduce over `local` then one over `cross` is an allreduce over the job, each
byte crossing between machines once per column. Top-k (Note [Hierarchical top-k]) and local
SGD's host averaging (Note [Local SGD]) use them. They are added collectively the first time
(every rank adds every machine's and every column's set, in the same order) and found again
afterwards, for as long as the job keeps them.
"""

from __future__ import annotations

from typing import Optional

from scaleout import _binding, _runtime
from scaleout._errors import InvalidArgumentError
from scaleout._objects import allgather_object

__all__ = ["Hosts", "host_sets"]


class Hosts:
    """This rank's two process sets of Note [Host sets]."""

    def __init__(
        self,
        local: int,
        cross: int,
        local_rank: int,
        local_size: int,
        count: int,
        slices: list,
        mine: list,
    ) -> None:
        self.local, self.cross = local, cross
        self.local_rank, self.local_size, self.count = local_rank, local_size, count
        self.slices = slices  # the local rank (slice) of each rank of the machine, in set order
        self.mine = mine  # per local rank q: this machine's place in local rank q's set

    def sent_here(self, block: int) -> bool:
        """Whether block `block` of the gathered pairs (the machine's ranks in set order, each
        with one block per machine in its cross set's order) is this machine's."""
        return block % self.count == self.mine[self.slices[block // self.count]]


_hosts_cache: dict = {}


def host_sets() -> Optional[Hosts]:
    """This rank's host sets (Note [Host sets]) when the job's allreduces are hierarchical over
    machines of equal size, else None. Collective the first time (every rank adds them)."""
    if _binding.algorithms()["allreduce"] != "hierarchical":  # Note [Algorithm plan]
        return None
    local_size, count = _runtime.local_size(), _runtime.cross_size()
    if local_size < 2 or count < 2 or local_size * count != _runtime.size():
        return None
    key = (_runtime.size(), _runtime.rank())
    known = _hosts_cache.get(key)
    if known is not None and _registered(known):
        return known
    places = allgather_object(
        (_runtime.cross_rank(), _runtime.local_rank()), name="scaleout.host_sets.places"
    )
    machines = [[r for r, (c, _) in enumerate(places) if c == h] for h in range(count)]
    columns = [[r for r, (_, local) in enumerate(places) if local == j] for j in range(local_size)]
    ids = {tuple(ranks): _added(ranks) for ranks in machines + columns}
    here = machines[_runtime.cross_rank()]
    hosts = Hosts(
        local=ids[tuple(here)],
        cross=ids[tuple(columns[_runtime.local_rank()])],
        local_rank=_runtime.local_rank(),
        local_size=local_size,
        count=count,
        slices=[places[q][1] for q in here],
        mine=[next(i for i, q in enumerate(column) if q in here) for column in columns],
    )
    hosts.ranks = (machines[_runtime.cross_rank()], columns[_runtime.local_rank()])
    _hosts_cache[key] = hosts
    return hosts


def _added(ranks) -> int:
    """The id of a process set with these ranks: added (collectively), or the existing one."""
    try:
        return _binding.add_process_set(list(ranks))
    except InvalidArgumentError as e:
        if e.process_set_id is None:  # Note [Error details]
            raise
        return e.process_set_id


def _registered(hosts: Hosts) -> bool:
    try:
        return [list(_binding.process_set(i)[1]) for i in (hosts.local, hosts.cross)] == [
            list(r) for r in hosts.ranks
        ]
    except Exception:  # noqa: BLE001  (a removed set, a new job)
        return False
