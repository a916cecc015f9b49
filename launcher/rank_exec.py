"""The rank wrapper: the process the MPI launcher starts for each rank.

    python .../launcher/rank_exec.py [placement options] -- command [args...]

It runs the user's command as its child, and
- applies the rank's CPU binding and thread counts before the command starts (so every thread
  the program creates inherits them), whichever MPI launcher or remote shell started the rank;
- prefixes each line of the child's stdout and stderr with "[rank] " (after the local time,
  with --timestamp-output), and with --output-dir also writes those lines to the rank's files
  (DIR/1/rank.N/stdout and stderr, see output.rank_output_dir);
- notes the MPI shared-memory segments the child maps, and removes those left behind when it
  ends (shm_cleanup);
- forwards signals to the child, and gives the child PR_SET_PDEATHSIG so it cannot outlive the
  wrapper when the launcher kills the wrapper with SIGKILL;
- reports a bad end on stderr as "scaleoutrun: rank R exited with code C" (or "was killed by
  SIGNAME"), a line scaleoutrun watches for to stop the other ranks and name the failing one;
- with --report-variable NAME, gives the child a socket (named in its variable NAME) to send
  records to, and forwards each on stderr as "scaleoutrun: rank R reports <record>" (Note [Rank
  reports] in scaleout/_rank_report.py: how scaleoutrun learns which rank an error blames).

scaleoutrun runs this file by path rather than with -m scaleout..., so that starting a rank never
imports the scaleout package: that import may load MPI, which belongs to the user's program.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Make the launcher's modules importable as a private package without importing scaleout.
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location(
        "_scaleout_launcher", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    _package = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules["_scaleout_launcher"] = _package
    _spec.loader.exec_module(_package)  # type: ignore[union-attr]
    __package__ = "_scaleout_launcher"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Mapping, Optional, Sequence  # noqa: E402

from . import shm_cleanup  # noqa: E402
from .exit_report import RankExit, finished_line, record_line, segments_line, started_line  # noqa: E402
from .output import LinePrefixer, horovod_timestamp, rank_output_dir, write_all  # noqa: E402
from .placement import (  # noqa: E402
    PlacementError,
    PlacementRequest,
    parse_ep_affinity,
    plan_node,
    rank_environment,
)
from .rank_env import (  # noqa: E402
    horovod_rank_environment,
    local_rank_and_size,
    rank_from_environment,
    torch_rank_environment,
)
from .topology import detect  # noqa: E402

__all__ = ["main", "RankRunner"]

PR_SET_PDEATHSIG = 1
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Hydra run with -disable-auto-cleanup (an elastic generation) tells the processes left of a job
# that one has ended with SIGUSR1 (MPICH's library handles it); once its rank has ended, the
# wrapper ignores such notices rather than die of them.
NOTICES = (signal.SIGUSR1, signal.SIGUSR2)
DEFAULT_KILL_GRACE = 3.0
# How often the child's MPI segments are looked for: often while MPI is likely starting.
SEGMENT_LOOKS = ((10.0, 0.25), (float("inf"), 2.0))  # (until this long after start, every)


def _prctl():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


class RankRunner:
    """Runs one rank's command and relays its output, signals and end."""

    def __init__(
        self,
        rank: str,
        command: Sequence[str],
        env: Mapping[str, str],
        cpus: Optional[set[int]] = None,
        kill_grace: float = DEFAULT_KILL_GRACE,
        timestamps: bool = False,
        copies: Optional[tuple[int, int]] = None,
        ignore_notices: bool = False,
        report_variable: Optional[str] = None,
    ):
        self.rank = rank
        self.command = list(command)
        self.env = dict(env)
        self.cpus = cpus
        self.kill_grace = kill_grace
        self.timestamps = timestamps
        self.copies = copies  # open files that also get the stdout and the stderr lines
        self.ignore_notices = ignore_notices  # the child starts with NOTICES ignored
        self.report_variable = report_variable  # names the records' socket to the child
        self.reports: Optional[socket.socket] = None  # where the child sends its records
        self.child: Optional[subprocess.Popen] = None
        self.stopping: Optional[int] = None  # the terminating signal we forwarded
        self.kill_at: Optional[float] = None
        self.segments: set[str] = set()  # MPI segments the child has mapped
        self._next_look = 0.0
        self._prctl = _prctl()

    # The child, between fork and exec. No Python threads exist in the wrapper.
    def _prepare_child(self, wrapper_pid: int) -> None:
        if self._prctl is not None:
            self._prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != wrapper_pid:  # the wrapper died before prctl took effect
            os._exit(128 + signal.SIGKILL)
        os.setpgid(0, 0)  # signals reach the child once, through the wrapper
        if self.ignore_notices:
            # Not killed by a notice that comes before its MPI library handles them.
            for number in NOTICES:
                signal.signal(number, signal.SIG_IGN)
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)

    def _on_signal(self, number: int, _frame) -> None:
        if self.child is None or self.child.returncode is not None:
            return
        try:
            os.kill(self.child.pid, number)
        except ProcessLookupError:
            return
        if number in STOPPING and self.stopping is None:
            self.stopping = number
            self.kill_at = time.monotonic() + self.kill_grace

    def _open_reports(self) -> None:
        """The socket the child sends its records to (Note [Rank reports]), in the abstract
        namespace (no file to remove, also when the wrapper is killed), named in the child's
        environment; none when it cannot be made."""
        if self.report_variable is None:
            return
        name = f"scaleout-rank-report-{os.getpid()}-{os.urandom(8).hex()}"
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            channel.bind("\0" + name)
        except OSError:
            channel.close()
            return
        channel.setblocking(False)
        self.reports = channel
        self.env[self.report_variable] = "@" + name

    def _forward_reports(self) -> None:
        """The records the child has sent, each as one line on stderr."""
        while self.reports is not None:
            try:
                record = self.reports.recv(1 << 16)
            except OSError:  # BlockingIOError: none left
                return
            write_all(2, record_line(self.rank, record).encode())

    def run(self) -> int:
        """Runs the command to its end; returns the wrapper's exit status."""
        wrapper_pid = os.getpid()
        self._open_reports()
        try:
            self.child = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                close_fds=False,  # the MPI launcher may hand the rank descriptors (PMI_FD)
                preexec_fn=lambda: self._prepare_child(wrapper_pid),
            )
        except (OSError, subprocess.SubprocessError) as exc:  # the latter: from _prepare_child
            if self.reports is not None:
                self.reports.close()
            reason = getattr(exc, "strerror", None) or str(exc)
            write_all(
                2,
                f"scaleoutrun: rank {self.rank} could not start "
                f"{self.command[0]!r}: {reason}\n".encode(),
            )
            write_all(2, RankExit(self.rank, code=127).report_line().encode())
            return 127
        previous = {number: signal.signal(number, self._on_signal) for number in FORWARDED}
        try:
            self._relay()
            returncode = self.child.wait()
        finally:
            for number, handler in previous.items():
                signal.signal(number, signal.SIG_IGN if number in NOTICES else handler)
        shm_cleanup.remove_unmapped(self.segments)
        if returncode != 0 and self.stopping is None:
            write_all(2, RankExit.from_returncode(self.rank, returncode).report_line().encode())
        elif returncode == 0:
            write_all(2, finished_line(self.rank).encode())
        return returncode if returncode >= 0 else 128 - returncode

    def _relay(self) -> None:
        child = self.child
        assert child is not None and child.stdout is not None and child.stderr is not None
        prefix = f"[{self.rank}] ".encode()
        clock = horovod_timestamp if self.timestamps else None
        copies = self.copies or (None, None)
        streams = {
            child.stdout.fileno(): (1, copies[0], LinePrefixer(prefix, clock=clock)),
            child.stderr.fileno(): (2, copies[1], LinePrefixer(prefix, clock=clock)),
        }
        selector = selectors.DefaultSelector()
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        exit_fd = _pidfd(child.pid)
        if exit_fd is not None:
            selector.register(exit_fd, selectors.EVENT_READ)
        reports_fd = self.reports.fileno() if self.reports is not None else None
        if reports_fd is not None:
            selector.register(reports_fd, selectors.EVENT_READ)
        drain_until: Optional[float] = None
        open_streams = set(streams)
        started = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if child.poll() is not None:
                    if not open_streams:
                        break
                    # Grandchildren may hold the pipes open; don't wait on them for long.
                    if drain_until is None:
                        drain_until = now + 1.0
                    elif now >= drain_until:
                        break
                else:
                    if now >= self._next_look:
                        new = shm_cleanup.segments_mapped_by(child.pid) - self.segments
                        if new:  # told to scaleoutrun, which removes them should this die
                            self.segments |= new
                            write_all(
                                2, segments_line(self.rank, socket.gethostname(), new).encode()
                            )
                        every = next(e for until, e in SEGMENT_LOOKS if now - started < until)
                        self._next_look = now + every
                    if self.kill_at is not None and now >= self.kill_at:
                        _kill(child.pid, signal.SIGKILL)
                        self.kill_at = None
                timeout = 0.1 if exit_fd is None else 1.0
                look = self._next_look if drain_until is None else None
                for deadline in (drain_until, self.kill_at, look):
                    if deadline is not None:
                        timeout = min(timeout, max(0.0, deadline - now))
                for key, _ in selector.select(timeout):
                    if key.fd == exit_fd:
                        selector.unregister(exit_fd)
                        continue
                    if key.fd == reports_fd:
                        self._forward_reports()
                        continue
                    out_fd, copy_fd, prefixer = streams[key.fd]
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        _write(out_fd, copy_fd, prefixer.feed(data))
                    else:
                        selector.unregister(key.fd)
                        open_streams.discard(key.fd)
        finally:
            for out_fd, copy_fd, prefixer in streams.values():
                _write(out_fd, copy_fd, prefixer.finish())
            selector.close()
            # Before the end is reported: what the child sent last says why it ended.
            self._forward_reports()
            if self.reports is not None:
                self.reports.close()
                self.reports = None
            if exit_fd is not None:
                os.close(exit_fd)


def _write(out_fd: int, copy_fd: Optional[int], data: bytes) -> None:
    write_all(out_fd, data)
    if copy_fd is not None and data:
        write_all(copy_fd, data)


def _open_copies(directory: str, rank: str, size: int) -> tuple[int, int]:
    """The rank's --output-filename files, created (or emptied) now."""
    where = rank_output_dir(directory, int(rank), size)
    os.makedirs(where, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    return (
        os.open(os.path.join(where, "stdout"), flags, 0o644),
        os.open(os.path.join(where, "stderr"), flags, 0o644),
    )


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rank_exec", allow_abbrev=False)
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="end (SIGTERM) when the process that started the wrapper dies",
    )
    parser.add_argument("--kill-grace", type=float, default=DEFAULT_KILL_GRACE)
    parser.add_argument(
        "--ignore-notices",
        action="store_true",
        help="start the command with SIGUSR1 and SIGUSR2 ignored (Hydra's "
        "notices of a process's end, under -disable-auto-cleanup)",
    )
    parser.add_argument(
        "--timestamp-output",
        action="store_true",
        help="start each line with the local time, as horovodrun does",
    )
    parser.add_argument(
        "--output-dir", default=None, help="also write the lines to DIR/1/rank.N/{stdout,stderr}"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="the number of ranks (pads N in --output-dir's names)",
    )
    parser.add_argument(
        "--report-variable",
        default=None,
        help="name the socket the command may send records to in this "
        "variable, and forward them (Note [Rank reports])",
    )
    # The placement request, as PlacementRequest.to_args writes it.
    parser.add_argument("--bind-to", default=None)
    parser.add_argument("--map-by", default="socket")
    parser.add_argument("--ep-servers", type=int, default=None)
    parser.add_argument("--ep-affinity", default=None)
    parser.add_argument("--threads-per-rank", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


def _place(args: argparse.Namespace, rank: str) -> tuple[Optional[set[int]], dict[str, str]]:
    """This rank's CPU mask and variables, planned on this node's own topology."""
    local_rank, local_size = local_rank_and_size(os.environ)
    if local_rank is None or local_size is None or local_rank >= local_size:
        write_all(
            2,
            f"scaleoutrun: rank {rank}: the MPI launcher did not say which local rank "
            "this is; not binding it\n".encode(),
        )
        return None, {}
    request = PlacementRequest(
        bind_to=args.bind_to,
        map_by=args.map_by,
        ep_servers=args.ep_servers,
        ep_affinity=parse_ep_affinity(args.ep_affinity) if args.ep_affinity else None,
        threads_per_rank=args.threads_per_rank,
    )
    mine = plan_node(detect(), local_size, request).ranks[local_rank]
    return (set(mine.cpus) or None), rank_environment(mine, os.environ)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    rank = rank_from_environment(os.environ)
    if rank.isdigit():  # scaleoutrun's --start-timeout waits for this line
        write_all(2, started_line(rank, socket.gethostname()).encode())
    if args.exit_with_parent:
        prctl = _prctl()
        parent = os.getppid()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl took effect
            return 128 + signal.SIGTERM
    env = dict(os.environ)
    env.update(torch_rank_environment(os.environ))
    env.update(horovod_rank_environment(os.environ))
    cpus: Optional[set[int]] = None
    if args.bind_to is not None:
        try:
            cpus, placement_env = _place(args, rank)
        except PlacementError as exc:
            write_all(
                2,
                f"scaleoutrun: rank {rank} cannot be placed on "
                f"{socket.gethostname()}: {exc}\n".encode(),
            )
            write_all(2, RankExit(rank, code=2).report_line().encode())
            return 2
        env.update(placement_env)
    copies = None
    if args.output_dir is not None:
        if not rank.isdigit():
            write_all(
                2,
                f"scaleoutrun: rank {rank}: the MPI launcher did not say which rank "
                "this is; its output goes to the terminal only\n".encode(),
            )
        else:
            try:
                copies = _open_copies(args.output_dir, rank, args.world_size)
            except OSError as exc:
                write_all(
                    2,
                    f"scaleoutrun: rank {rank} cannot write its output files under "
                    f"{args.output_dir} on {socket.gethostname()}: "
                    f"{exc.strerror or exc}\n".encode(),
                )
                write_all(2, RankExit(rank, code=1).report_line().encode())
                return 1
    return RankRunner(
        rank,
        args.command,
        env,
        cpus,
        args.kill_grace,
        timestamps=args.timestamp_output,
        copies=copies,
        ignore_notices=args.ignore_notices,
        report_variable=args.report_variable,
    ).run()


if __name__ == "__main__":
    sys.exit(main())
