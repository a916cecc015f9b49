"""What scaleoutrun reads from the MPI launcher: its stderr (StderrRelay: the rank wrappers'
reports, started and finished lines, MPI segments and blame records, the remote shell's
failures to reach a host, each rank's last lines) and its stdout (BannerFilter: Hydra's banner
held back). Both pass the lines meant for the user through, whole.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Optional

from scaleout import _rank_report

from .exit_report import (
    RankExit,
    parse_finished,
    parse_record,
    parse_report,
    parse_segments,
    parse_started,
)
from .unreachable import Unreachable, parse_unreachable

__all__ = ["StderrRelay", "BannerFilter"]

# A rank's output line, as the wrapper prefixes it: "[3] text", or with
# --prefix-output-with-timestamp "Tue Jun 13 10:00:00 2023[3] text".
_RANK_LINE = re.compile(r"^(?:\w{3} \w{3} +\d+ [\d:]+ \d{4})?\[(\d+)\] (.*)$")
_LAST_LINES = 8


class StderrRelay:
    """The launcher's stderr, line by line: records the wrappers' reports and the remote
    shell's failures to reach a host (and lets both through), and the wrappers' started lines
    (which it keeps to itself). Also keeps each rank's last lines, and which ranks a rank's
    scaleout error blamed, from the records its program sent (Note [Rank reports]), so that
    the summary names the cause, not the first victim."""

    def __init__(self) -> None:
        self._pending = b""
        self.reports: list[RankExit] = []
        self.started: dict[int, str] = {}
        self.unreachable: list[Unreachable] = []
        self.last_lines: dict[str, deque] = {}
        self.blamed: dict[str, tuple[int, ...]] = {}  # rank -> the ranks its error blamed
        self.finished: list[int] = []  # ranks whose program ended with code 0, in order
        self.segments: dict[str, set[str]] = {}  # host -> MPI segments the job's ranks mapped

    def feed(self, data: bytes) -> bytes:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        out = []
        for line in lines:
            text = line.decode("utf-8", "replace")
            started = parse_started(text)
            if started is not None:
                self.started[started[0]] = started[1]
                continue
            finished = parse_finished(text)
            if finished is not None:
                self.finished.append(finished)
                continue
            segments = parse_segments(text)
            if segments is not None:
                self.segments.setdefault(segments[0], set()).update(segments[1])
                continue
            record = parse_record(text)
            if record is not None:
                self._note_record(*record)
                continue
            rank_line = _RANK_LINE.match(text)
            if rank_line is not None:
                rank, said = rank_line.groups()
                self.last_lines.setdefault(rank, deque(maxlen=_LAST_LINES)).append(said)
            report = parse_report(text)
            if report is not None:
                self.reports.append(report)
            elif (failure := parse_unreachable(text)) is not None:
                self.unreachable.append(failure)
            out.append(line + b"\n")
        if len(self._pending) > 1 << 16:  # no line ends in sight: let it through
            out.append(self._pending)
            self._pending = b""
        return b"".join(out)

    def finish(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _note_record(self, rank: str, text: str) -> None:
        record = _rank_report.decode(text)
        culprits = tuple(r for r in _rank_report.culprit_ranks(record or {}) if str(r) != rank)
        if culprits:  # the first error a rank reports is the one that matters
            self.blamed.setdefault(rank, culprits)


class BannerFilter:
    """Passes the launcher's stdout through by whole lines, holding back Hydra's "BAD
    TERMINATION" banner until it ends: it is dropped when a rank has already reported its end
    (the banner then only repeats it, naming a process id and often the wrong exit code)."""

    _RULE = b"=" * 40
    _LAST = b"Please see the FAQ page"

    def __init__(self) -> None:
        self._pending = b""
        self._banner: Optional[list[bytes]] = None

    def feed(self, data: bytes, drop: bool) -> bytes:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        out = []
        for line in lines:
            if self._banner is None and line.startswith(self._RULE):
                # The blank line Hydra prints before its banner belongs to it.
                self._banner = [out.pop()] if out and out[-1] == b"\n" else []
            if self._banner is None:
                out.append(line + b"\n")
                continue
            self._banner.append(line + b"\n")
            if line.startswith(self._LAST) or len(self._banner) > 20:
                if not drop:
                    out += self._banner
                self._banner = None
        if self._banner is None and len(self._pending) > 1 << 16:
            out.append(self._pending)
            self._pending = b""
        return b"".join(out)

    def finish(self, drop: bool) -> bytes:
        held = b"".join(self._banner or []) if not drop else b""
        rest, self._pending, self._banner = self._pending, b"", None
        return held + rest
