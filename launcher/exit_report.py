"""How a rank's end is reported: one line, written by the rank wrapper, read by scaleoutrun.

The wrapper prefixes every line of the user's program with "[rank] ", so a report line, which
it writes unprefixed, can never be confused with the program's own output.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "RankExit",
    "parse_report",
    "signal_name",
    "started_line",
    "parse_started",
    "finished_line",
    "parse_finished",
    "segments_line",
    "parse_segments",
    "record_line",
    "parse_record",
]

_REPORT = re.compile(r"^scaleoutrun: rank (\S+) (?:exited with code (\d+)|was killed by (\w+))")
# Written by the wrapper before the user's program starts; scaleoutrun consumes these lines.
_STARTED = re.compile(r"^scaleoutrun: rank (\d+) started on (\S+)$")
# Written by the wrapper when the user's program ended with code 0; consumed too.
_FINISHED = re.compile(r"^scaleoutrun: rank (\d+) finished$")
# The MPI shared-memory segments a rank's wrapper saw it map (shm_cleanup).
_SEGMENTS = re.compile(r"^scaleoutrun: rank (\d+) on (\S+) maps MPI segments ((?:\S+ ?)+)$")
# A record the rank's program sent (Note [Rank reports] in scaleout/_rank_report.py), forwarded
# as it came; consumed too.
_RECORD = re.compile(r"^scaleoutrun: rank (\d+) reports (\{.*\})$")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


@dataclass(frozen=True)
class RankExit:
    """A rank's program ended badly: with a non-zero exit code, or killed by a signal."""

    rank: str
    code: Optional[int] = None
    signal: Optional[int] = None

    @classmethod
    def from_returncode(cls, rank: str, returncode: int) -> "RankExit":
        """From a subprocess returncode (negative: killed by that signal)."""
        if returncode < 0:
            return cls(rank, signal=-returncode)
        return cls(rank, code=returncode)

    def how(self) -> str:
        """How it ended: "was killed by SIGKILL", "exited with code 3"."""
        if self.signal is not None:
            return f"was killed by {signal_name(self.signal)}"
        return f"exited with code {self.code}"

    def describe(self) -> str:
        return f"rank {self.rank} {self.how()}"

    def report_line(self) -> str:
        return f"scaleoutrun: {self.describe()}\n"

    @property
    def exit_status(self) -> int:
        """The status scaleoutrun exits with: the code, or 128 + the signal as shells do."""
        if self.signal is not None:
            return 128 + self.signal
        return self.code if self.code else 1


def parse_report(line: str) -> Optional[RankExit]:
    """The RankExit a report line describes, or None for any other line."""
    match = _REPORT.match(line)
    if not match:
        return None
    rank, code, name = match.groups()
    if code is not None:
        return RankExit(rank, code=int(code))
    if name[3:].isdigit():
        return RankExit(rank, signal=int(name[3:]))
    try:
        return RankExit(rank, signal=int(signal.Signals[name]))
    except KeyError:
        return None


def started_line(rank: str, host: str) -> str:
    return f"scaleoutrun: rank {rank} started on {host}\n"


def parse_started(line: str) -> Optional[tuple[int, str]]:
    """(rank, host) from a started line, or None for any other line."""
    match = _STARTED.match(line)
    return (int(match.group(1)), match.group(2)) if match else None


def finished_line(rank: str) -> str:
    return f"scaleoutrun: rank {rank} finished\n"


def segments_line(rank: str, host: str, names) -> str:
    return f"scaleoutrun: rank {rank} on {host} maps MPI segments {' '.join(sorted(names))}\n"


def parse_segments(line: str) -> Optional[tuple[str, list[str]]]:
    """(host, segment names) from a segments line, or None for any other line."""
    match = _SEGMENTS.match(line)
    return (match.group(2), match.group(3).split()) if match else None


def parse_finished(line: str) -> Optional[int]:
    """The rank of a finished line, or None for any other line."""
    match = _FINISHED.match(line)
    return int(match.group(1)) if match else None


def record_line(rank: str, record: bytes) -> str:
    """The line forwarding a record the rank's program sent (one line, whatever it holds)."""
    text = record.decode("utf-8", "replace").replace("\r", " ").replace("\n", " ")
    return f"scaleoutrun: rank {rank} reports {text}\n"


def parse_record(line: str) -> Optional[tuple[str, str]]:
    """(rank, record) from a record line, or None for any other line."""
    match = _RECORD.match(line)
    return (match.group(1), match.group(2)) if match else None
