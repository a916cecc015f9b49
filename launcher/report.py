"""What scaleoutrun says at the end of a job, and the status it exits with (JobOutcome): which
rank failed first in cause (blame), an unreachable host, ranks that never started, an
interruption, a rank that left early, or the MPI launcher's own failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .exit_report import RankExit, signal_name
from .relay import StderrRelay
from .unreachable import planned_host

__all__ = ["JobOutcome", "summarize", "not_started", "ranks_text"]


@dataclass(frozen=True)
class JobOutcome:
    exit_status: int
    failure: Optional[RankExit] = None  # the first rank that ended badly
    message: Optional[str] = None  # what scaleoutrun prints last, when not success
    relay: Optional[StderrRelay] = None  # what the ranks said of their starts and ends
    interrupted: bool = False  # scaleoutrun was interrupted (Ctrl-C, SIGTERM, ...)


def ranks_text(ranks: Sequence[int], rank_hosts: Sequence[str]) -> str:
    hosts = sorted({rank_hosts[rank] for rank in ranks if rank < len(rank_hosts)})
    listed = ", ".join(map(str, ranks[:16])) + (", ..." if len(ranks) > 16 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}" + (
        f" (on {', '.join(hosts)})" if hosts else ""
    )


def not_started(relay: StderrRelay, rank_hosts: Sequence[str]) -> list[int]:
    """The ranks whose wrapper never said it started."""
    return [rank for rank in range(len(rank_hosts)) if rank not in relay.started]


def summarize(
    relay: StderrRelay,
    rank_hosts: Sequence[str],
    returncode: int,
    *,
    stopped: bool,
    start_timed_out: bool,
    start_timeout: float,
    interrupted: Optional[int],
) -> JobOutcome:
    """The outcome of a job whose launcher ended with `returncode`, from what the ranks said.
    stopped: scaleoutrun asked the launcher to stop the job; interrupted: the signal that
    interrupted scaleoutrun, if one did."""
    reports = relay.reports
    # An unreachable host comes first: the ranks elsewhere only end because of it.
    if relay.unreachable:
        return JobOutcome(1, None, _unreachable_message(relay, rank_hosts))
    if reports:
        return _failure_of(relay, reports, "; the other ranks were stopped" if stopped else "")
    if start_timed_out:
        missing = ranks_text(not_started(relay, rank_hosts), rank_hosts)
        return JobOutcome(
            1,
            None,
            f"scaleoutrun: {missing} did not start within "
            f"{start_timeout:g} s (--start-timeout); "
            "the job was stopped",
        )
    if interrupted is not None:
        return JobOutcome(
            128 + interrupted,
            None,
            f"scaleoutrun: interrupted by {signal_name(interrupted)}; the ranks were stopped",
        )
    finished = set(relay.finished)
    unfinished = [r for r in range(len(rank_hosts)) if r not in finished]
    if finished and unfinished and not not_started(relay, rank_hosts):
        # A rank ended (with code 0) while others still ran: MPI launchers then end the
        # others, MPICH's even with exit code 0 and no message.
        early = ranks_text(relay.finished, [])
        how = (
            ""
            if returncode == 0
            else f" (it exited with code {returncode})"
            if returncode > 0
            else f" (it was killed by {signal_name(-returncode)})"
        )
        return JobOutcome(
            returncode if returncode > 0 else 1 if returncode == 0 else 128 - returncode,
            None,
            f"scaleoutrun: job failed: {early} ended with code 0 while "
            f"{ranks_text(unfinished, [])} still ran, and the MPI launcher "
            f"then ended {'it' if len(unfinished) == 1 else 'them'}{how}: a "
            f"rank that leaves before the others (without MPI_Finalize) ends "
            f"the whole job",
        )
    if returncode != 0:
        how = (
            f"was killed by {signal_name(-returncode)}"
            if returncode < 0
            else f"exited with code {returncode}"
        )
        missing = not_started(relay, rank_hosts)
        never = f"; {ranks_text(missing, rank_hosts)} never started" if missing else ""
        return JobOutcome(
            returncode if returncode > 0 else 128 - returncode,
            None,
            f"scaleoutrun: the MPI launcher {how} without a rank reporting a "
            f"failure{never}; see its messages above",
        )
    return JobOutcome(0)


def _unreachable_message(relay: StderrRelay, rank_hosts: Sequence[str]) -> str:
    hosts: dict[str, str] = {}  # planned host -> the first line about it
    for failure in relay.unreachable:
        hosts.setdefault(planned_host(failure.host, rank_hosts), failure.line)
    parts = []
    for host, line in hosts.items():
        ranks = [rank for rank, where in enumerate(rank_hosts) if where == host]
        verb = "was" if len(ranks) == 1 else "were"
        planned = f" ({ranks_text(ranks, [])} {verb} to run there)" if ranks else ""
        parts.append(f"host {host} could not be reached{planned}: {line}")
    return "scaleoutrun: " + "; ".join(parts) + "; the job was stopped"


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
        return JobOutcome(
            cause.exit_status,
            cause,
            f"scaleoutrun: job failed: {cause.describe()}{stopped}"
            + _last_lines_text(relay, cause.rank),
        )
    blamed = relay.blamed[first.rank]
    them = "it" if len(blamed) == 1 else "them"
    how = (
        f"ended with code 0 while the others still needed {them} (without shutting scaleout down)"
        if all(rank in relay.finished for rank in blamed)
        else f"failed first (the errors of the others name {them})"
    )
    return JobOutcome(
        first.exit_status,
        first,
        f"scaleoutrun: job failed: {ranks_text(blamed, [])} {how}; then "
        f"{first.describe()}{stopped}"
        + "".join(_last_lines_text(relay, str(rank)) for rank in blamed)
        + _last_lines_text(relay, first.rank),
    )
