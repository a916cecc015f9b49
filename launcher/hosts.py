"""Hosts and their slots: -H lists, hostfiles, and which ranks land on which host.

Pure functions over text; reading the hostfile is the caller's one side effect.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from .errors import UsageError

__all__ = [
    "HostSlots",
    "parse_host_list",
    "parse_hostfile",
    "read_hostfile",
    "merge_hosts",
    "ranks_per_host",
    "is_local_host",
    "format_host_list",
]

# Host names, IPv4 addresses and bracket-free IPv6 are not all legal here on purpose: the name
# is handed to ssh and to the MPI launcher, and a ':' would be read as the slot separator.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class HostSlots:
    """A host and the number of ranks it runs (its slots)."""

    host: str
    slots: int


def _check_host(name: str, where: str) -> str:
    if not _HOST_NAME.match(name):
        raise UsageError(f"{where}: {name!r} is not a host name")
    return name


def _check_slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{where}: slots must be a positive integer, not {text!r}")
    return int(text)


def parse_host_list(text: str) -> list[HostSlots]:
    """'host1:2,host2:2,host3' -> hosts with their slots (1 when not given)."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise UsageError(f"-H {text!r}: empty host entry")
        name, _, slots = item.partition(":")
        where = f"-H entry {item!r}"
        hosts.append(
            HostSlots(_check_host(name, where), _check_slots(slots, where) if slots else 1)
        )
    return merge_hosts(hosts)


def parse_hostfile(text: str, source: str = "hostfile") -> list[HostSlots]:
    """Lines 'host', 'host slots=N' or 'host:N'; '#' starts a comment; blank lines are skipped.

    Open MPI's max_slots=M is accepted and ignored, so a file written for mpirun works here.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number}"
        words = line.split()
        name, _, colon_slots = words[0].partition(":")
        slots = _check_slots(colon_slots, where) if colon_slots else None
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and equals:
                if key == "slots":
                    if slots is not None:
                        raise UsageError(f"{where}: slots given twice")
                    slots = _check_slots(value, where)
                else:
                    _check_slots(value, where)
            else:
                raise UsageError(f"{where}: expected 'host slots=N', found {word!r}")
        hosts.append(HostSlots(_check_host(name, where), slots or 1))
    if not hosts:
        raise UsageError(f"{source} names no hosts")
    return merge_hosts(hosts)


def read_hostfile(path: str) -> list[HostSlots]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise UsageError(f"cannot read hostfile {path}: {exc.strerror or exc}") from None
    return parse_hostfile(text, source=path)


def merge_hosts(hosts: Iterable[HostSlots]) -> list[HostSlots]:
    """A host named twice gets the sum of its slots, at its first position."""
    slots: dict[str, int] = {}
    for entry in hosts:
        slots[entry.host] = slots.get(entry.host, 0) + entry.slots
    return [HostSlots(host, count) for host, count in slots.items()]


def ranks_per_host(
    hosts: Sequence[HostSlots], np: int, origin: str = "the hosts given"
) -> list[HostSlots]:
    """How many of np ranks each host runs when ranks fill hosts in order, slot by slot.

    That is the order both Hydra and Open MPI (--map-by slot) use, and it makes ranks
    0..slots-1 local to the first host. More ranks than slots is an error, not a silent
    oversubscription of remote machines.
    """
    total = sum(entry.slots for entry in hosts)
    if np > total:
        listed = ",".join(f"{entry.host}:{entry.slots}" for entry in hosts)
        raise UsageError(f"-np {np} is more than the {total} slots of {origin} ({listed})")
    placed, left = [], np
    for entry in hosts:
        if left == 0:
            break
        count = min(entry.slots, left)
        placed.append(HostSlots(entry.host, count))
        left -= count
    return placed


def format_host_list(hosts: Sequence[HostSlots]) -> str:
    return ",".join(f"{entry.host}:{entry.slots}" for entry in hosts)


def is_local_host(name: str, local_names: Optional[Iterable[str]] = None) -> bool:
    """Whether name is this machine (so that its ranks run beside scaleoutrun)."""
    if name in ("localhost", "127.0.0.1", "::1") or name.startswith("127."):
        return True
    if local_names is None:  # no DNS lookup: it can stall for long on a cluster's login node
        hostname = socket.gethostname()
        local_names = {hostname, hostname.split(".", 1)[0]}
    names = set(local_names)
    return name in names or name.split(".", 1)[0] in names
