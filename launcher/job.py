"""Runs the launcher command and watches it: the first rank to fail ends the job.

scaleoutrun relays the launcher's stdout and stderr. In stderr each rank wrapper says when it
has started and reports a bad end. On the first report scaleoutrun asks the launcher to stop the
job (SIGTERM, which mpiexec and mpirun forward to every rank); if the launcher has not ended
after a grace period, every local process it started is killed. Hydra, for one, does not end a
job whose rank exits non-zero before calling MPI_Init, and its message names a process id, not a
rank, so neither launcher's own clean-up is relied on.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import selectors
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from . import shm_cleanup
from .exit_report import (RankExit, parse_finished, parse_report, parse_segments, parse_started,
                          signal_name)
from .output import write_all
from .unreachable import Unreachable, parse_unreachable, planned_host

__all__ = ["JobOutcome", "run_job", "StderrRelay", "BannerFilter", "descendants"]

# Given the hosts of ranks that never started, the ones that cannot be reached, with why.
HostProbe = Callable[[Sequence[str]], "list[Unreachable]"]

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class JobOutcome:
    exit_status: int
    failure: Optional[RankExit] = None   # the first rank that ended badly
    message: Optional[str] = None        # what scaleoutrun prints last, when not success
    relay: Optional["StderrRelay"] = None   # what the ranks said of their starts and ends
    interrupted: bool = False            # scaleoutrun was interrupted (Ctrl-C, SIGTERM, ...)


# A rank's output line, as the wrapper prefixes it: "[3] text", or with
# --prefix-output-with-timestamp "Tue Jun 13 10:00:00 2023[3] text".
_RANK_LINE = re.compile(r"^(?:\w{3} \w{3} +\d+ [\d:]+ \d{4})?\[(\d+)\] (.*)$")
# Words of a scaleout error raised because another rank failed (a ShutDownError or a
# TransportError): which rank it blames.
_BLAMES = re.compile(r"\brank (\d+) (?:\(pid \d+(?: on \S+)?\) died|has shut down|has died)")
_LAST_LINES = 8


class StderrRelay:
    """The launcher's stderr, line by line: records the wrappers' reports and the remote
    shell's failures to reach a host (and lets both through), and the wrappers' started lines
    (which it keeps to itself). Also keeps each rank's last lines, and which rank a rank's
    scaleout error blamed (so the summary names the cause, not the first victim)."""

    def __init__(self) -> None:
        self._pending = b""
        self.reports: list[RankExit] = []
        self.started: dict[int, str] = {}
        self.unreachable: list[Unreachable] = []
        self.last_lines: dict[str, deque] = {}
        self.blamed: dict[str, str] = {}   # rank -> the rank its error said had failed
        self.finished: list[int] = []      # ranks whose program ended with code 0, in order
        self.segments: dict[str, set[str]] = {}   # host -> MPI segments the job's ranks mapped

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
            rank_line = _RANK_LINE.match(text)
            if rank_line is not None:
                rank, said = rank_line.groups()
                self.last_lines.setdefault(rank, deque(maxlen=_LAST_LINES)).append(said)
                blame = _BLAMES.search(said)
                if blame is not None and blame.group(1) != rank:
                    self.blamed.setdefault(rank, blame.group(1))
            report = parse_report(text)
            if report is not None:
                self.reports.append(report)
            elif (failure := parse_unreachable(text)) is not None:
                self.unreachable.append(failure)
            out.append(line + b"\n")
        if len(self._pending) > 1 << 16:   # no line ends in sight: let it through
            out.append(self._pending)
            self._pending = b""
        return b"".join(out)

    def finish(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest


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


def descendants(pid: int) -> list[int]:
    """pid's descendants now, from /proc (children first, deepest last)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: parse after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return found


def _terminate_with_parent(parent: int):
    """A preexec_fn: SIGTERM the child when the process that started it dies."""
    prctl = None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        pass

    def prepare() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)
    return prepare


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _ranks_text(ranks: Sequence[int], rank_hosts: Sequence[str]) -> str:
    hosts = sorted({rank_hosts[rank] for rank in ranks if rank < len(rank_hosts)})
    listed = ", ".join(map(str, ranks[:16])) + (", ..." if len(ranks) > 16 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}" + \
        (f" (on {', '.join(hosts)})" if hosts else "")


class _Supervisor:
    def __init__(self, command: Sequence[str], env: Mapping[str, str], rank_hosts: Sequence[str],
                 start_timeout: float, grace: float, probe: Optional[HostProbe],
                 survivor_grace: Optional[float] = None):
        self.command = list(command)
        self.survivor_grace = survivor_grace
        self.stop_at: Optional[float] = None   # with survivor_grace: when to stop the rest
        self.probe = probe
        self.env = dict(env)
        self.rank_hosts = list(rank_hosts)
        self.start_timeout = start_timeout
        self.grace = grace
        self.proc: Optional[subprocess.Popen] = None
        self.relay = StderrRelay()
        self.stop_requested_at: Optional[float] = None
        self.kill_at: Optional[float] = None
        self.interrupted: Optional[int] = None
        self.start_timed_out = False

    def _stop(self, number: int) -> None:
        """Asks the launcher to end the job; arms the hard kill."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            self.kill_at = self.stop_requested_at + self.grace
            _signal(self.proc.pid, number)
        else:
            self.kill_at = time.monotonic()   # asked twice (a second Ctrl-C): kill now

    def _on_signal(self, number: int, _frame) -> None:
        if self.interrupted is None:
            self.interrupted = number
        self._stop(signal.SIGINT if number == signal.SIGINT else signal.SIGTERM)

    def _kill_everything(self) -> None:
        assert self.proc is not None
        for pid in [self.proc.pid] + descendants(self.proc.pid):
            _signal(pid, signal.SIGKILL)

    def run(self) -> JobOutcome:
        outcome = self._run()
        return dataclasses.replace(outcome, relay=self.relay,
                                   interrupted=self.interrupted is not None)

    def _run(self) -> JobOutcome:
        # Its own session: a terminal's Ctrl-C reaches scaleoutrun alone, which relays it once.
        # And should scaleoutrun itself be killed (say, by a test harness's timeout), the
        # launcher gets SIGTERM and takes the job down with it.
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_terminate_with_parent(os.getpid()))
        previous = {number: signal.signal(number, self._on_signal) for number in INTERRUPTS}
        try:
            self._watch()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return self._outcome(self.proc.wait())

    def _watch(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        banners = BannerFilter()
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        selector = selectors.DefaultSelector()
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        start_by = time.monotonic() + self.start_timeout if self.start_timeout > 0 else None
        drain_until: Optional[float] = None
        try:
            while True:
                now = time.monotonic()
                running = proc.poll() is None
                if not running:
                    if not selector.get_map():
                        break
                    if drain_until is None:
                        drain_until = now + 2.0   # processes it left behind may hold the pipes
                    elif now >= drain_until:
                        break
                elif self.kill_at is not None and now >= self.kill_at:
                    self._kill_everything()
                    self.kill_at = None
                elif self.stop_at is not None and now >= self.stop_at:
                    self.stop_at = None
                    self._stop(signal.SIGTERM)
                if start_by is not None and running:
                    if len(self.relay.started) >= len(self.rank_hosts):
                        start_by = None
                    elif now >= start_by:
                        start_by = None
                        self.start_timed_out = True
                        self._stop(signal.SIGTERM)
                timeout = 0.1
                for deadline in (drain_until, self.kill_at, start_by, self.stop_at):
                    if deadline is not None:
                        timeout = min(timeout, max(0.0, deadline - now))
                if not selector.get_map():
                    time.sleep(timeout)
                    continue
                # stderr first: a rank's report should be seen before the launcher's banner.
                ready = sorted(selector.select(timeout), key=lambda item: item[0].fd != err_fd)
                for key, _ in ready:
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        selector.unregister(key.fd)
                    elif key.fd == err_fd:
                        write_all(2, self.relay.feed(data))
                        if self.relay.unreachable or (self.relay.reports
                                                      and self.survivor_grace is None):
                            self._stop(signal.SIGTERM)
                        elif self.relay.reports and self.stop_at is None \
                                and self.stop_requested_at is None:
                            # An elastic job: the others get the time to see the failure and
                            # stop for a restart by themselves.
                            self.stop_at = time.monotonic() + self.survivor_grace
                    else:
                        write_all(1, banners.feed(data, drop=bool(self.relay.reports)))
            write_all(1, banners.finish(drop=bool(self.relay.reports)))
            write_all(2, self.relay.finish())
        finally:
            selector.close()

    def _not_started(self) -> list[int]:
        return [rank for rank in range(len(self.rank_hosts)) if rank not in self.relay.started]

    def _unreachable_message(self) -> str:
        hosts: dict[str, str] = {}   # planned host -> the first line about it
        for failure in self.relay.unreachable:
            hosts.setdefault(planned_host(failure.host, self.rank_hosts), failure.line)
        parts = []
        for host, line in hosts.items():
            ranks = [rank for rank, where in enumerate(self.rank_hosts) if where == host]
            verb = "was" if len(ranks) == 1 else "were"
            planned = f" ({_ranks_text(ranks, [])} {verb} to run there)" if ranks else ""
            parts.append(f"host {host} could not be reached{planned}: {line}")
        return "scaleoutrun: " + "; ".join(parts) + "; the job was stopped"

    def _failure(self, reports: Sequence[RankExit]) -> JobOutcome:
        stopped = "; the other ranks were stopped" if self.stop_requested_at else ""
        return _failure_of(self.relay, reports, stopped)

    def _outcome(self, returncode: int) -> JobOutcome:
        reports = self.relay.reports
        if (returncode != 0 and not reports and not self.relay.unreachable
                and self.interrupted is None and not self.start_timed_out
                and self.probe is not None):
            # The launcher failed before some ranks started and its messages named no host:
            # find out whether their hosts can be reached at all.
            missing = list(dict.fromkeys(self.rank_hosts[rank] for rank in self._not_started()))
            if missing:
                self.relay.unreachable.extend(self.probe(missing))
        # An unreachable host comes first: the ranks elsewhere only end because of it.
        if self.relay.unreachable:
            return JobOutcome(1, None, self._unreachable_message())
        if reports:
            return self._failure(reports)
        if self.start_timed_out:
            missing = _ranks_text(self._not_started(), self.rank_hosts)
            return JobOutcome(1, None, f"scaleoutrun: {missing} did not start within "
                                       f"{self.start_timeout:g} s (--start-timeout); "
                                       "the job was stopped")
        if self.interrupted is not None:
            return JobOutcome(128 + self.interrupted, None,
                              f"scaleoutrun: interrupted by {signal_name(self.interrupted)}; "
                              "the ranks were stopped")
        finished = set(self.relay.finished)
        unfinished = [r for r in range(len(self.rank_hosts)) if r not in finished]
        if finished and unfinished and not self._not_started():
            # A rank ended (with code 0) while others still ran: MPI launchers then end the
            # others, MPICH's even with exit code 0 and no message.
            early = _ranks_text(self.relay.finished, [])
            how = ("" if returncode == 0 else f" (it exited with code {returncode})" if returncode > 0
                   else f" (it was killed by {signal_name(-returncode)})")
            return JobOutcome(returncode if returncode > 0 else 1 if returncode == 0
                              else 128 - returncode, None,
                              f"scaleoutrun: job failed: {early} ended with code 0 while "
                              f"{_ranks_text(unfinished, [])} still ran, and the MPI launcher "
                              f"then ended {'it' if len(unfinished) == 1 else 'them'}{how}: a "
                              f"rank that leaves before the others (without MPI_Finalize) ends "
                              f"the whole job")
        if returncode != 0:
            how = (f"was killed by {signal_name(-returncode)}" if returncode < 0
                   else f"exited with code {returncode}")
            missing = self._not_started()
            never = f"; {_ranks_text(missing, self.rank_hosts)} never started" if missing else ""
            return JobOutcome(returncode if returncode > 0 else 128 - returncode, None,
                              f"scaleoutrun: the MPI launcher {how} without a rank reporting a "
                              f"failure{never}; see its messages above")
        return JobOutcome(0)


def _last_lines_text(relay: StderrRelay, rank: str) -> str:
    lines = relay.last_lines.get(rank)
    if not lines:
        return ""
    return f"\nscaleoutrun: rank {rank}'s last lines:\n" + "\n".join(f"  {line}" for line in lines)


def _failure_of(relay: StderrRelay, reports: Sequence[RankExit], stopped: str) -> JobOutcome:
    """The summary of a failed job: the rank whose failure came first in cause. A rank whose
    scaleout error says another rank failed (shut down, or died) is a consequence; the first
    rank that is not, or else the rank the errors blame, is the cause."""
    first = reports[0]
    causes = [r for r in reports if r.rank not in relay.blamed]
    if causes:
        cause = causes[0]
        return JobOutcome(cause.exit_status, cause,
                          f"scaleoutrun: job failed: {cause.describe()}{stopped}"
                          + _last_lines_text(relay, cause.rank))
    blamed = relay.blamed[first.rank]
    how = ("ended with code 0 while the others still needed it (without shutting scaleout "
           "down)" if int(blamed) in relay.finished else
           "failed first (the errors of the others name it)")
    return JobOutcome(first.exit_status, first,
                      f"scaleoutrun: job failed: rank {blamed} {how}; then {first.describe()}"
                      f"{stopped}" + _last_lines_text(relay, blamed)
                      + _last_lines_text(relay, first.rank))


def run_job(command: Sequence[str], env: Mapping[str, str], rank_hosts: Sequence[str],
            start_timeout: float = 0.0, grace: float = 6.0,
            probe: Optional[HostProbe] = None,
            survivor_grace: Optional[float] = None) -> JobOutcome:
    """Runs the launcher command to its end. stdin is inherited; stdout and stderr are relayed.

    rank_hosts: the host each rank is expected on, by rank. start_timeout: seconds for every
    rank's wrapper to start (0: no limit). grace: seconds between asking the launcher to stop
    the job and killing what is left of it. probe: asked, when the launcher fails before some
    ranks start without naming a host it could not reach, which of their hosts cannot be.
    survivor_grace: None stops the job at the first rank's bad end; an elastic generation gives
    the other ranks that many seconds to end by themselves (stopping for a restart) first.
    """
    supervisor = _Supervisor(command, env, rank_hosts, start_timeout, grace, probe,
                             survivor_grace)
    outcome = supervisor.run()
    # The wrappers remove their rank's segments when it ends, but a wrapper the launcher killed
    # could not: what this machine's ranks mapped, no process maps now, goes (shm_cleanup).
    shm_cleanup.remove_unmapped(supervisor.relay.segments.get(socket.gethostname(), ()))
    return outcome
