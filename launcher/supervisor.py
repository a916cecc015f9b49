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
import selectors
import signal
import socket
import subprocess
import time
from typing import Callable, Mapping, Optional, Sequence

from . import shm_cleanup
from .output import write_all
from .relay import BannerFilter, StderrRelay
from .report import JobOutcome, not_started, summarize
from .unreachable import Unreachable

__all__ = ["run_job", "descendants", "HostProbe"]

# Given the hosts of ranks that never started, the ones that cannot be reached, with why.
HostProbe = Callable[[Sequence[str]], "list[Unreachable]"]

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1


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
        fields = stat[stat.rfind(b")") + 2 :].split()
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


class _Supervisor:
    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        rank_hosts: Sequence[str],
        start_timeout: float,
        grace: float,
        probe: Optional[HostProbe],
        survivor_grace: Optional[float] = None,
    ):
        self.command = list(command)
        self.survivor_grace = survivor_grace
        self.stop_at: Optional[float] = None  # with survivor_grace: when to stop the rest
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
            self.kill_at = time.monotonic()  # asked twice (a second Ctrl-C): kill now

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
        return dataclasses.replace(
            outcome, relay=self.relay, interrupted=self.interrupted is not None
        )

    def _run(self) -> JobOutcome:
        # Its own session: a terminal's Ctrl-C reaches scaleoutrun alone, which relays it once.
        # And should scaleoutrun itself be killed (say, by a test harness's timeout), the
        # launcher gets SIGTERM and takes the job down with it.
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_terminate_with_parent(os.getpid()),
        )
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
                        drain_until = now + 2.0  # processes it left behind may hold the pipes
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
                        if self.relay.unreachable or (
                            self.relay.reports and self.survivor_grace is None
                        ):
                            self._stop(signal.SIGTERM)
                        elif (
                            self.relay.reports
                            and self.stop_at is None
                            and self.stop_requested_at is None
                        ):
                            # An elastic job: the others get the time to see the failure and
                            # stop for a restart by themselves.
                            self.stop_at = time.monotonic() + self.survivor_grace
                    else:
                        write_all(1, banners.feed(data, drop=bool(self.relay.reports)))
            write_all(1, banners.finish(drop=bool(self.relay.reports)))
            write_all(2, self.relay.finish())
        finally:
            selector.close()

    def _outcome(self, returncode: int) -> JobOutcome:
        if (
            returncode != 0
            and not self.relay.reports
            and not self.relay.unreachable
            and self.interrupted is None
            and not self.start_timed_out
            and self.probe is not None
        ):
            # The launcher failed before some ranks started and its messages named no host:
            # find out whether their hosts can be reached at all.
            missing = list(
                dict.fromkeys(
                    self.rank_hosts[rank] for rank in not_started(self.relay, self.rank_hosts)
                )
            )
            if missing:
                self.relay.unreachable.extend(self.probe(missing))
        return summarize(
            self.relay,
            self.rank_hosts,
            returncode,
            stopped=self.stop_requested_at is not None,
            start_timed_out=self.start_timed_out,
            start_timeout=self.start_timeout,
            interrupted=self.interrupted,
        )


def run_job(
    command: Sequence[str],
    env: Mapping[str, str],
    rank_hosts: Sequence[str],
    start_timeout: float = 0.0,
    grace: float = 6.0,
    probe: Optional[HostProbe] = None,
    survivor_grace: Optional[float] = None,
) -> JobOutcome:
    """Runs the launcher command to its end. stdin is inherited; stdout and stderr are relayed.

    rank_hosts: the host each rank is expected on, by rank. start_timeout: seconds for every
    rank's wrapper to start (0: no limit). grace: seconds between asking the launcher to stop
    the job and killing what is left of it. probe: asked, when the launcher fails before some
    ranks start without naming a host it could not reach, which of their hosts cannot be.
    survivor_grace: None stops the job at the first rank's bad end; an elastic generation gives
    the other ranks that many seconds to end by themselves (stopping for a restart) first.
    """
    supervisor = _Supervisor(command, env, rank_hosts, start_timeout, grace, probe, survivor_grace)
    outcome = supervisor.run()
    # The wrappers remove their rank's segments when it ends, but a wrapper the launcher killed
    # could not: what this machine's ranks mapped, no process maps now, goes (shm_cleanup).
    shm_cleanup.remove_unmapped(supervisor.relay.segments.get(socket.gethostname(), ()))
    return outcome
