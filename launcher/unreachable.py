"""Recognizing, in the MPI launcher's stderr, that it could not reach a host.

Both Hydra and Open MPI start their per-host daemons with ssh and pass ssh's own complaint
through; these are the lines that name the host. (A rank's own output cannot look like them:
the rank wrapper prefixes every line of it with "[rank] ".) A host that hangs instead of
failing is caught by --start-timeout, which names the hosts of the ranks that never started.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["Unreachable", "parse_unreachable", "planned_host"]

_PATTERNS = (
    # ssh: connect to host hostb port 2222: Connection refused / No route to host / timed out
    re.compile(r"^ssh: connect to host (?P<host>\S+) port \d+: (?P<reason>.+)$"),
    # ssh: Could not resolve hostname nosuchhost: Name or service not known
    re.compile(r"^ssh: Could not resolve hostname (?P<host>[^\s:]+): (?P<reason>.+)$"),
    # root@hostb: Permission denied (publickey).
    re.compile(r"^(?:[^@\s]+@)?(?P<host>[^\s:@]+): (?P<reason>Permission denied .*)$"),
)


@dataclass(frozen=True)
class Unreachable:
    host: str      # as ssh printed it (ssh writes host names in lower case)
    line: str      # ssh's whole message


def parse_unreachable(line: str) -> Optional[Unreachable]:
    """The host a line of the launcher's stderr says could not be reached, or None."""
    line = line.rstrip("\r\n")
    for pattern in _PATTERNS:
        match = pattern.match(line)
        if match:
            return Unreachable(match.group("host"), line)
    return None


def planned_host(printed: str, hosts: Sequence[str]) -> str:
    """The host of the plan that ssh's printed name stands for (the name as given by -H, the
    hostfile or Slurm, whatever its case); the printed name when none matches."""
    for host in hosts:
        if host.lower() == printed.lower():
            return host
    return printed
