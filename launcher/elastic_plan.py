"""The elastic driver's decisions (elastic_driver.py runs the loop), as pure functions.

With Horovod's meanings:
- the discovery script prints `host` or `host:slots` lines (slots default: --slots-per-host);
  duplicates are dropped, blank lines skipped;
- hosts keep the order they first appeared in, new ones are appended, so ranks stay on the
  hosts they were on and older hosts get the lower ranks; at most --max-np slots are used;
- a host where a rank failed is blacklisted: for good without --blacklist-cooldown-range,
  else for min * 2**failures + uniform(0, 1) * min seconds, clamped to [min, max], after which
  it counts as added again;
- after a generation: see judge_generation (Horovod's order of checks; the reset limit's
  message "... number of resets during elastic job exceeded limit: N").
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from typing import Callable, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from scaleout._elastic_protocol import RESTART_EXIT_CODE, HostUpdateResult

from .hosts import HostSlots, _check_host, _check_slots

__all__ = [
    "parse_discovery",
    "Blacklist",
    "assign_slots",
    "End",
    "classify_ends",
    "GenerationEnd",
    "judge_generation",
    "host_update",
    "HOSTS_ADDED",
    "HOSTS_REMOVED",
    "worker_numbers",
]

# A rank that stops for a restart; Horovod's flags of a host update.
HOSTS_REMOVED, HOSTS_ADDED = HostUpdateResult.removed, HostUpdateResult.added


def parse_discovery(
    output: str, slots_per_host: int, script: str = "discovery script"
) -> List[HostSlots]:
    """The hosts a discovery script printed, in order, without duplicates."""
    found: Dict[str, int] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line:
            continue
        name, _, slots = line.partition(":")
        where = f"{script} line {line!r}"
        host = _check_host(name, where)
        if host not in found:
            found[host] = _check_slots(slots, where) if slots else slots_per_host
    return [HostSlots(h, s) for h, s in found.items()]


@dataclass
class Blacklist:
    """Hosts where ranks failed, and until when (None: for good)."""

    cooldown: Optional[Tuple[int, int]] = None
    random_unit: Callable[[], float] = random.random
    until: Dict[str, Optional[float]] = field(default_factory=dict)
    failures: Dict[str, int] = field(default_factory=dict)

    def add(self, host: str, now: float) -> None:
        count = self.failures.get(host, 0) + 1
        self.failures[host] = count
        if self.cooldown is None:
            self.until[host] = None
            return
        low, high = self.cooldown
        delay = low * 2**count + self.random_unit() * low  # Horovod's: 2 * MIN at first
        self.until[host] = now + max(low, min(high, delay))

    def blocks(self, host: str, now: float) -> bool:
        if host not in self.until:
            return False
        until = self.until[host]
        return until is None or now < until


def assign_slots(
    previous: Sequence[str],
    discovered: Iterable[HostSlots],
    blacklist: Blacklist,
    now: float,
    max_np: Optional[int],
) -> List[HostSlots]:
    """The hosts of the next generation: the discovered ones not blacklisted, those of the
    previous generation first in their order, then the new ones; capped at max_np slots."""
    usable = {h.host: h.slots for h in discovered if not blacklist.blocks(h.host, now)}
    order = [h for h in previous if h in usable] + [h for h in usable if h not in previous]
    chosen: List[HostSlots] = []
    left = max_np
    for host in order:
        slots = usable[host] if left is None else min(usable[host], left)
        if slots <= 0:
            break
        chosen.append(HostSlots(host, slots))
        if left is not None:
            left -= slots
    return chosen


def worker_numbers(
    hosts: Sequence[HostSlots],
    previous: Mapping[Tuple[str, int], int],
    failed_hosts: Collection[str],
    used: int,
) -> Dict[Tuple[str, int], int]:
    """Each (host, slot)'s worker number in a generation, its HOROVOD_RANK (Note [horovodrun's
    rank variables] in rank_env): a slot of the last generation on a host where nothing failed
    keeps its worker's number (in Horovod that worker lives on through the reset); any other
    slot gets a number not used before, counting on from `used`."""
    numbers = {}
    for entry in hosts:
        for slot in range(entry.slots):
            key = (entry.host, slot)
            if key in previous and entry.host not in failed_hosts:
                numbers[key] = previous[key]
            else:
                numbers[key] = used
                used += 1
    return numbers


def host_update(running: Sequence[HostSlots], next_hosts: Sequence[HostSlots]) -> HostUpdateResult:
    """Horovod's flags for a change from the running generation's hosts to those the next
    would have: HOSTS_ADDED where a host or slots would be added, HOSTS_REMOVED where some
    would go; 0 when the next generation would be the same."""
    now = {h.host: h.slots for h in running}
    then = {h.host: h.slots for h in next_hosts}
    flags = HostUpdateResult.no_update
    for host in now.keys() | then.keys():
        if then.get(host, 0) > now.get(host, 0):
            flags |= HOSTS_ADDED
        elif then.get(host, 0) < now.get(host, 0):
            flags |= HOSTS_REMOVED
    return flags


class End(enum.Enum):
    """How a rank of a generation ended."""

    DONE = "finished"  # its program ended with code 0
    RESTART = "stopped for a restart"  # with RESTART_EXIT_CODE (scaleout/_elastic_run.py)
    FAILED = "failed"  # any other end, or its host was lost
    STOPPED = "was stopped"  # scaleoutrun ended it, or no word of its end came


def classify_ends(
    rank_hosts: Sequence[str],
    finished: Iterable[int],
    reports: Iterable[Tuple[int, Optional[int], Optional[int]]],
    blamed: Iterable[int],
    unreachable_hosts: Iterable[str],
) -> Dict[int, Tuple[str, End]]:
    """Each rank's (host, End) from what the generation's ranks said: `finished` ranks ended
    with 0; `reports` are (rank, exit code or None, signal or None) of the other ends their
    wrappers saw; `blamed` ranks are those the others' errors named as failed (a rank whose
    host vanished reports nothing itself); on an unreachable host every rank failed. A rank
    that ended by itself for a restart never counts as failed, whoever blamed it."""
    ends = {rank: (host, End.STOPPED) for rank, host in enumerate(rank_hosts)}
    lost = set(unreachable_hosts)
    for rank in set(blamed) | {rank for rank, host in enumerate(rank_hosts) if host in lost}:
        if rank in ends:
            ends[rank] = (rank_hosts[rank], End.FAILED)
    for rank, code, sig in reports:
        if rank in ends:
            restart = sig is None and code == RESTART_EXIT_CODE
            ends[rank] = (rank_hosts[rank], End.RESTART if restart else End.FAILED)
    for rank in finished:
        if rank in ends:
            ends[rank] = (rank_hosts[rank], End.DONE)
    return ends


@dataclass(frozen=True)
class GenerationEnd:
    """What the driver does after a generation: stop (with `message` when it failed; None
    when it succeeded or the caller has the reason) or go on without `failed_hosts`."""

    done: bool
    failed_hosts: Tuple[str, ...] = ()
    message: Optional[str] = None


def judge_generation(
    ends: Dict[int, Tuple[str, End]], resets: int, reset_limit: Optional[int]
) -> GenerationEnd:
    """After a generation, in the order of Horovod's driver: a rank that finished ends the job
    (a success when every rank did); so does a generation where every rank failed (a failure
    of the program, not of a host); otherwise the failed ranks' hosts are left out of the next
    generation, unless that leaves none of this generation's hosts or the reset limit is
    reached. A generation with no failure and no restart (interrupted, not started) ends the
    job with the caller's reason."""
    kinds = [kind for _, kind in ends.values()]
    failed = tuple(sorted({host for host, kind in ends.values() if kind is End.FAILED}))
    if End.DONE in kinds:
        if all(kind is End.DONE for kind in kinds):
            return GenerationEnd(done=True)
        finished = [rank for rank, (_, kind) in sorted(ends.items()) if kind is End.DONE]
        others = [rank for rank, (_, kind) in sorted(ends.items()) if kind is not End.DONE]
        return GenerationEnd(
            done=True,
            failed_hosts=failed,
            message=(
                f"{_ranks(finished)} finished while {_ranks(others)} did not: once a rank has "
                "finished, the job is not restarted"
            ),
        )
    if kinds and all(kind is End.FAILED for kind in kinds):
        return GenerationEnd(
            done=True,
            failed_hosts=failed,
            message=(
                "every rank failed: a failure of the program itself, not of a host, so the job is "
                "not restarted"
            ),
        )
    if not failed and End.RESTART not in kinds:
        return GenerationEnd(done=True)
    if failed and set(failed) >= {host for host, _ in ends.values()}:
        return GenerationEnd(
            done=True,
            failed_hosts=failed,
            message=(
                f"ranks failed on every host of the job ({', '.join(failed)}): no host is left to "
                "go on with"
            ),
        )
    if reset_limit is not None and resets >= reset_limit:
        return GenerationEnd(
            done=True,
            failed_hosts=failed,
            message=(
                "the job was stopped because the number of resets during the elastic job "
                f"exceeded the limit: {reset_limit}"
            ),
        )
    return GenerationEnd(done=False, failed_hosts=failed)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
