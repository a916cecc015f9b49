"""The elastic driver's decisions, as pure functions (groundwork for issue 14: the driver loop
that runs generations of a job is not written yet; scaleoutrun still refuses the elastic flags).

With Horovod's meanings:
- the discovery script prints `host` or `host:slots` lines (slots default: --slots-per-host);
  duplicates are dropped, blank lines skipped;
- hosts keep the order they first appeared in, new ones are appended, so ranks stay on the
  hosts they were on and older hosts get the lower ranks; at most --max-np slots are used;
- a host where a rank failed is blacklisted: for good without --blacklist-cooldown-range,
  else for min(max, min * 2**failures + uniform(0, 1) * min) seconds, after which it counts as
  added again;
- a generation that ends with every rank done ends the job; one where ranks failed blacklists
  their hosts and starts the next, unless --reset-limit resets were made already
  ("... number of resets during elastic job exceeded limit: N").
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .config import UsageError
from .hosts import HostSlots, _check_host, _check_slots

__all__ = ["parse_discovery", "Blacklist", "assign_slots", "GenerationEnd", "judge_generation",
           "RESTART_EXIT_CODE"]

RESTART_EXIT_CODE = 75  # a rank that stops for a restart (scaleout/_elastic_run.py)


def parse_discovery(output: str, slots_per_host: int, script: str = "discovery script"
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

    def __post_init__(self) -> None:
        if self.cooldown is not None:
            low, high = self.cooldown
            if low < 1 or high > 3600 or low > high:
                raise UsageError(f"--blacklist-cooldown-range {low} {high}: the range must have "
                                 "1 <= min <= max <= 3600 (seconds)")

    def add(self, host: str, now: float) -> None:
        count = self.failures.get(host, 0) + 1
        self.failures[host] = count
        if self.cooldown is None:
            self.until[host] = None
            return
        low, high = self.cooldown
        delay = low * 2 ** (count - 1) + self.random_unit() * low
        self.until[host] = now + max(low, min(high, delay))

    def blocks(self, host: str, now: float) -> bool:
        if host not in self.until:
            return False
        until = self.until[host]
        return until is None or now < until


def assign_slots(previous: Sequence[str], discovered: Iterable[HostSlots],
                 blacklist: Blacklist, now: float, max_np: Optional[int]
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


@dataclass(frozen=True)
class GenerationEnd:
    """What the driver does after a generation: stop (with `message` when it failed) or go on
    without `failed_hosts`."""
    done: bool
    failed_hosts: Tuple[str, ...] = ()
    message: Optional[str] = None


def judge_generation(ends: Dict[int, Tuple[str, Optional[int], Optional[int]]],
                     resets: int, reset_limit: Optional[int]) -> GenerationEnd:
    """`ends`: rank -> (host, exit code or None, signal or None). Every rank ended with 0: the
    job is done. Otherwise the hosts of ranks that neither finished nor stopped for a restart
    failed; the job goes on unless the reset limit is reached or no rank stopped for a
    restart (a failure of the program itself, not of a host)."""
    if ends and all(code == 0 for _, code, sig in ends.values()):
        return GenerationEnd(done=True)
    failed = sorted({host for host, code, sig in ends.values()
                     if sig is not None or code not in (0, RESTART_EXIT_CODE)})
    restarting = any(code == RESTART_EXIT_CODE for _, code, _ in ends.values())
    if not restarting:
        return GenerationEnd(done=True, failed_hosts=tuple(failed),
                             message="no rank stopped for a restart: the program failed")
    if reset_limit is not None and resets >= reset_limit:
        return GenerationEnd(done=True, failed_hosts=tuple(failed),
                             message="the job was stopped because the number of resets during "
                                     f"the elastic job exceeded the limit: {reset_limit}")
    return GenerationEnd(done=False, failed_hosts=tuple(failed))
