"""What scaleoutrun's elastic driver and the ranks of an elastic job must agree on, written once
for both ends: the driver (Note [Elastic driver] in launcher/elastic_driver.py) and the ranks'
run() and State (Note [Elastic restarts] in scaleout/_elastic_run.py, scaleout/_elastic_state.py).

- How a rank ends for a restart: RESTART_EXIT_CODE.
- The variables the driver gives every rank of a generation (job_environment,
  driver_environment), and how a rank reads them back (job_id, generation, host_of_rank,
  driver_addresses).
- Where each host keeps the job's commits (job_directory; a directory per host in it, named as
  HOSTS names the host), which the ranks write and the driver reads.
- The host-update channel: rank 0 of each generation connects to the driver and says
  hello(token, generation); the driver accepts only its own token and the running generation
  (parse_hello), then writes update_line(timestamp, flags) lines (timestamps increase), which rank
  0 reads with parse_update and its State turns into HostsUpdatedInterrupt; the flags are
  Horovod's HostUpdateResult.

Pure: the standard library only (no MPI, no native core), so the launcher imports it.
"""

from __future__ import annotations

import enum
import secrets
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

__all__ = [
    "RESTART_EXIT_CODE",
    "HostUpdateResult",
    "JOB",
    "GENERATION",
    "HOSTS",
    "DRIVER",
    "TOKEN",
    "DIR",
    "job_environment",
    "driver_environment",
    "job_id",
    "generation",
    "host_of_rank",
    "driver_addresses",
    "job_directory",
    "new_token",
    "hello",
    "parse_hello",
    "HELLO_LIMIT",
    "update_line",
    "parse_update",
]

# The exit code of a rank that stops for the elastic driver to start the next generation
# (EX_TEMPFAIL: run this job again); Note [Elastic restarts].
RESTART_EXIT_CODE = 75


class HostUpdateResult(enum.IntFlag):
    """Horovod's flags of a host update."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


# The ranks' variables. The driver sets all but DIR, which the user may set.
JOB = "SCALEOUT_ELASTIC_JOB"  # the job's id: where its commits are kept
GENERATION = "SCALEOUT_ELASTIC_GENERATION"  # 0, 1, ...
HOSTS = "SCALEOUT_ELASTIC_HOSTS"  # the generation's "host:slots,..." in rank order
DRIVER = "SCALEOUT_ELASTIC_DRIVER"  # "address:port,..." where rank 0 connects
TOKEN = "SCALEOUT_ELASTIC_TOKEN"  # what rank 0 says first, so strangers are refused
DIR = "SCALEOUT_ELASTIC_DIR"  # where each host keeps the job's commits


def job_environment(job: str, hosts: Iterable[tuple[str, int]]) -> dict[str, str]:
    """The job's variables for every rank of a generation: `hosts` are its (host, slots) in rank
    order."""
    return {JOB: job, HOSTS: ",".join(f"{host}:{slots}" for host, slots in hosts)}


def driver_environment(
    addresses: Sequence[str], port: int, token: str, generation_number: int
) -> dict[str, str]:
    """The host-update channel's variables for every rank of a generation: where the driver
    listens (`addresses`, tried in turn, and `port`) and what rank 0 says on connecting."""
    return {
        DRIVER: ",".join(f"{address}:{port}" for address in addresses),
        TOKEN: token,
        GENERATION: str(generation_number),
    }


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The elastic job's id; None when the process does not run under the elastic driver."""
    return environ.get(JOB)


def generation(environ: Mapping[str, str]) -> int:
    return int(environ.get(GENERATION, "0") or 0)


def host_of_rank(environ: Mapping[str, str], rank: int) -> Optional[str]:
    """The name the driver knows `rank`'s host by, or None when HOSTS does not say."""
    for entry in filter(None, environ.get(HOSTS, "").split(",")):
        host, _, slots = entry.rpartition(":")
        if rank < int(slots):
            return host
        rank -= int(slots)
    return None


def driver_addresses(environ: Mapping[str, str]) -> list[str]:
    """The driver's "address:port" entries, in the order to try them ([]: no driver)."""
    return [entry for entry in environ.get(DRIVER, "").split(",") if entry]


def job_directory(job: str, environ: Mapping[str, str]) -> Path:
    """Where job `job`'s commits are kept on a host (each host's store is a directory in it
    named after the host): DIR when set, else in /dev/shm when there is one (it outlives the
    processes, not the host), else in the temporary directory."""
    if environ.get(DIR):
        return Path(environ[DIR])
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"scaleout-commits-{job}"


def new_token() -> str:
    return secrets.token_hex(16)


# The longest hello the driver reads: a stranger cannot make it wait for more.
HELLO_LIMIT = 256


def hello(token: str, generation_number: int) -> bytes:
    """What rank 0 writes first on connecting to the driver."""
    return f"{token} {generation_number}\n".encode()


def parse_hello(data: bytes) -> tuple[str, str]:
    """(token, generation as written) from a hello; the driver compares both as text."""
    token, _, generation_text = data.decode(errors="replace").strip().partition(" ")
    return token, generation_text


def update_line(timestamp: int, flags: int) -> bytes:
    """A host update, from the driver to rank 0: the timestamps of one generation increase
    (State raises HostsUpdatedInterrupt for an update newer than the last one it saw)."""
    return f"{timestamp} {int(flags)}\n".encode()


def parse_update(line: str) -> Optional[tuple[int, int]]:
    """(timestamp, flags) from an update line, or None for anything else."""
    timestamp, _, flags = line.strip().partition(" ")
    if timestamp.isdigit() and flags.isdigit():
        return int(timestamp), int(flags)
    return None
