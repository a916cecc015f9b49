"""Recognizing, in the MPI launcher's stderr, that it could not reach a host.

Both Hydra and Open MPI start their per-host daemons with ssh and pass ssh's own complaint
through; these are the lines that name the host. (A rank's own output cannot look like them:
the rank wrapper prefixes every line of it with "[rank] ".) A host that hangs instead of
failing is caught by --start-timeout, which names the hosts of the ranks that never started.

ssh's complaint does not always get through: Hydra forwards its children's stderr itself and,
when a proxy fails to launch, may exit before it has read it. So when the launcher ends with
ranks that never started on remote hosts and nothing named them, scaleoutrun asks ssh again
(probe_hosts), the way the launcher would have reached them.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["Unreachable", "parse_unreachable", "planned_host", "probe_hosts"]

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
    host: str  # as ssh printed it (ssh writes host names in lower case)
    line: str  # ssh's whole message


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


def _ssh_command(
    host: str, port: Optional[int], identity_file: Optional[str], timeout: float
) -> list[str]:
    command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"]
    if port is not None:
        command += ["-p", str(port)]
    if identity_file is not None:
        command += ["-i", identity_file]
    return command + [host, "true"]


def probe_hosts(
    hosts: Sequence[str],
    port: Optional[int],
    identity_file: Optional[str] = None,
    timeout: float = 5.0,
) -> list[Unreachable]:
    """The hosts among `hosts` that ssh cannot log in to (non-interactively, on `port`, with
    the key `identity_file`), each with ssh's own message. All are tried at once; none takes
    longer than about `timeout`."""
    running = []
    for host in hosts:
        try:
            proc = subprocess.Popen(
                _ssh_command(host, port, identity_file, timeout),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as exc:  # no ssh at all: the launcher could not have used it either
            return [Unreachable(host, f"ssh could not be run: {exc}") for host in hosts]
        running.append((host, proc))
    deadline = time.monotonic() + timeout + 2.0
    failures = []
    for host, proc in running:
        try:
            _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append(Unreachable(host, f"ssh to {host} did not answer within {timeout:g} s"))
            continue
        if proc.returncode != 255:  # ssh's own failures exit 255; anything else logged in
            continue
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        named = next((found for line in lines if (found := parse_unreachable(line))), None)
        failures.append(
            named
            or Unreachable(host, lines[-1] if lines else f"ssh to {host} failed without a message")
        )
    return failures
