"""scaleoutrun's elastic driver: runs an elastic job generation after generation.

Note [Elastic driver]
An MPI job cannot lose a rank and go on, nor take in new ones, so an elastic job is a series
of generations, each an ordinary job of the hosts there are at its start (Note [Elastic
restarts] in scaleout/_elastic_run.py is the ranks' side):
  - the hosts come from the discovery script, run every second (or, with --min-np and no
    script, from -H/--hostfile, at least two hosts), less the blacklisted ones, in the order
    they first appeared, capped at --max-np slots (elastic_plan.py);
  - a generation starts once there are -np slots (the first) or --min-np (later ones), waiting
    up to --elastic-timeout; it runs with every slot there is then, with the ranks' variables
    SCALEOUT_ELASTIC_JOB (the job's id: where its commits are kept), _GENERATION, and _DRIVER
    and _TOKEN, where rank 0 connects to hear of host changes;
  - when a rank fails, the others stop by themselves with RESTART_EXIT_CODE once they see it
    (the launcher is told to leave them running, and they get SURVIVOR_GRACE seconds before
    they are stopped);
  - when the hosts change while a generation runs (slots added, removed, or a blacklisted
    host's cooldown over) so that the next generation would differ, rank 0 is told, and the
    ranks' next commit() or check_host_updates() raises HostsUpdatedInterrupt on every rank,
    and they stop for a restart;
  - after a generation, elastic_plan.judge_generation decides, in Horovod's order: done, or
    blacklist the failed ranks' hosts and go on (a reset, counted against --reset-limit).
A job that cannot go on says why, and where its last commit is kept, so that it can be resumed
by running the same command with SCALEOUT_ELASTIC_JOB set to the job's id.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time
from typing import Callable, Optional, Sequence

from scaleout import _elastic_protocol as protocol
from scaleout._commit_store import CommitStore

from .command import prepare_job, resolve_launcher
from .config import LaunchConfig
from .elastic_discovery import DISCOVERY_INTERVAL, Discovery, DiscoveryError, HostWatch, say
from .elastic_notifier import Notifier, driver_addresses
from .elastic_plan import (
    Blacklist,
    End,
    assign_slots,
    classify_ends,
    host_update,
    judge_generation,
    worker_numbers,
)
from .errors import UsageError
from .hosts import HostSlots, format_host_list, is_local_host
from .mpi_launcher import LaunchError
from .plan import HostSource, plan_job
from .rank_env import HOROVOD_NUMBERS
from .report import JobOutcome
from .topology import local_cpus
from .unreachable import planned_host

__all__ = ["run_elastic", "DEFAULT_ELASTIC_TIMEOUT", "SURVIVOR_GRACE"]

DEFAULT_ELASTIC_TIMEOUT = 600.0  # seconds, as Horovod's
# After a rank fails, how long the others get to see it and stop for a restart by themselves.
SURVIVOR_GRACE = 10.0


def _new_job_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}-{os.getpid()}"


@dataclasses.dataclass
class _Run:
    """The driver's state across generations."""

    config: LaunchConfig
    environ: dict[str, str]
    job: str
    blacklist: Blacklist
    hosts_used: dict[str, None] = dataclasses.field(default_factory=dict)  # ordered set
    numbers_used: int = 0  # worker numbers handed out (elastic_plan.worker_numbers)

    def commit_note(self) -> str:
        """Where the job's commits are, for a message when it cannot go on."""
        directory = protocol.job_directory(self.job, self.environ)
        # The copies on this machine: those of its hosts (remote ones are not looked at).
        found = [
            CommitStore(directory / host).newest_complete()
            for host in self.hosts_used
            if (directory / host).is_dir()
        ]
        newest = max((n for n in found if n is not None), default=None)
        where = ", ".join(self.hosts_used) or "no host"
        if newest is None:
            what = (
                f"no commit of it is on this machine; any host's ({where}) is in {directory}/<host>"
            )
        else:
            what = (
                f"its last commit (commit {newest}) is kept in {directory}/<host> on each "
                f"host that ran its ranks ({where})"
            )
        return f"{what}; run the same command with {protocol.JOB}={self.job} to resume from it"


def _one_machine_environment(hosts: Sequence[HostSlots], environ: dict[str, str]) -> dict[str, str]:
    """Where several hosts of a generation are names of this machine (localhost, 127.0.0.1,
    its name), UCX still sees one machine and copies between their ranks straight from each
    other's memory (its cma transport), which aborts the rank reading when the other has died:
    a survivor would look like a second failure. UCX's other transports fail softly. A UCX_TLS
    the user set is left alone."""
    if "UCX_TLS" in environ or sum(is_local_host(h.host) for h in hosts) < 2:
        return {}
    return {"UCX_TLS": "^cma"}


def _wait_for_slots(
    watch: HostWatch, run: _Run, previous: Sequence[str], needed: int, timeout: float
) -> Optional[list[HostSlots]]:
    """The next generation's hosts, once they have `needed` slots; None after `timeout` s."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        hosts = assign_slots(previous, watch.hosts(), run.blacklist, time.time(), run.config.max_np)
        have = sum(h.slots for h in hosts)
        if have >= needed:
            return hosts
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not said:
            say(f"waiting up to {left:.0f} s for {needed} slots (there are {have})")
            said = True
        watch.wait(min(left, DISCOVERY_INTERVAL))


def _describe(ends: dict, outcome: JobOutcome) -> str:
    """One line on how a generation's ranks ended."""
    by_kind: dict[End, list[int]] = {}
    for rank, (_, kind) in sorted(ends.items()):
        by_kind.setdefault(kind, []).append(rank)
    parts = []
    reports = {
        int(r.rank): r for r in (outcome.relay.reports if outcome.relay else ()) if r.rank.isdigit()
    }
    for kind, ranks in by_kind.items():
        listed = ", ".join(
            f"{rank} (on {ends[rank][0]}"
            + (f", {reports[rank].how()}" if kind is End.FAILED and rank in reports else "")
            + ")"
            for rank in ranks
        )
        verb = kind.value if len(ranks) == 1 else kind.value.replace("was ", "were ")
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {listed} {verb}")
    return "; ".join(parts)


def run_elastic(config: LaunchConfig) -> int:
    """Runs an elastic job (Note [Elastic driver]); returns scaleoutrun's exit status."""
    environ = dict(os.environ)
    start_np = config.np if config.np is not None else config.min_np
    if start_np is None:
        raise UsageError("an elastic job needs -np N (the ranks to start with) or --min-np N")
    min_np = config.min_np if config.min_np is not None else start_np
    # As Horovod's (`timeout or ... or 600`): 0 means the default.
    timeout = config.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT
    discovery = Discovery.from_config(config)
    try:
        first = discovery.find()
    except DiscoveryError as exc:  # as Horovod: a script failing on its first run is fatal
        print(f"scaleoutrun: error: {exc}", file=sys.stderr, flush=True)
        return 1
    launcher = resolve_launcher(config, environ)
    run = _Run(
        config,
        environ,
        protocol.job_id(environ) or _new_job_id(),
        Blacklist(config.blacklist_cooldown),
    )
    watch = HostWatch(discovery, first)
    notifier = Notifier(driver_addresses(config.network_interfaces))
    watch.start()
    say(f"job {run.job}")
    # Between generations (waiting for slots), a SIGTERM ends the driver as Ctrl-C does;
    # while one runs, the job's supervisor handles both (supervisor.py).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _generations(run, watch, notifier, launcher, start_np, min_np, timeout)
    except KeyboardInterrupt:
        say(f"interrupted; the job was stopped; {run.commit_note()}")
        return 130
    except (UsageError, LaunchError) as exc:  # a later generation that cannot be launched
        if not run.hosts_used:
            raise
        print(f"scaleoutrun: error: {exc}", file=sys.stderr, flush=True)
        say(f"the job was stopped; {run.commit_note()}")
        return 2 if isinstance(exc, UsageError) else 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        watch.on_run = None
        watch.stop()
        notifier.close()


def _interrupt(number: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {number}")


def _generations(
    run: _Run,
    watch: HostWatch,
    notifier: Notifier,
    launcher,
    start_np: int,
    min_np: int,
    timeout: float,
) -> int:
    config, previous, resets, generation = run.config, [], 0, 0
    numbers: dict[tuple[str, int], int] = {}  # the last generation's worker numbers
    failed: tuple[str, ...] = ()  # the last generation's failed hosts
    while True:
        needed = start_np if generation == 0 else min_np
        if config.max_np is not None:  # as Horovod: -np above --max-np starts at --max-np
            needed = min(needed, config.max_np)
        hosts = _wait_for_slots(watch, run, previous, needed, timeout)
        if hosts is None:
            say(
                f"timed out waiting for the minimum number of slots to become available: "
                f"fewer than {needed} for {timeout:g} s (--elastic-timeout); the job was "
                f"stopped; {run.commit_note()}"
            )
            return 1
        names = [h.host for h in hosts]
        if previous and not set(previous) & set(names):
            # As Horovod's driver: the job's state lives on the hosts that ran it.
            say(
                f"none of the hosts of the last generation ({', '.join(previous)}) is left to "
                f"hand the job's state on: the job was stopped; {run.commit_note()}"
            )
            return 1
        world = sum(h.slots for h in hosts)
        source = HostSource(tuple(hosts), "the elastic job's hosts", "ssh")
        shape = dataclasses.replace(config, np=world, hosts=None, hostfile=None, slurm="off")
        plan = plan_job(shape, local_cpus(), source)
        numbers = worker_numbers(hosts, numbers, failed, run.numbers_used)
        by_rank = [numbers[h.host, slot] for h in hosts for slot in range(h.slots)]
        run.numbers_used = max([run.numbers_used, *(number + 1 for number in by_rank)])
        rank_env = {
            **protocol.job_environment(run.job, [(h.host, h.slots) for h in hosts]),
            HOROVOD_NUMBERS: ",".join(map(str, by_rank)),
            "HOROVOD_ELASTIC": "1",  # as horovodrun's elastic workers (scripts read it)
            **notifier.rank_environment(generation),
            **_one_machine_environment(hosts, run.environ),
        }
        job = prepare_job(config, plan, run.environ, launcher, rank_env, keep_survivors=True)
        run.hosts_used.update(dict.fromkeys(names))
        say(
            f"generation {generation}: {world} rank{'s' if world > 1 else ''} on "
            f"{format_host_list(hosts)}"
        )
        notifier.start_generation(generation)
        watch.on_run = _change_watcher(run, notifier, hosts, generation)
        outcome = job.run(survivor_grace=SURVIVOR_GRACE)
        watch.on_run = None

        if outcome.interrupted:
            print(outcome.message, file=sys.stderr, flush=True)
            say(f"the job was interrupted; {run.commit_note()}")
            return outcome.exit_status
        ends = _ends(outcome, job)
        verdict = judge_generation(ends, resets, config.reset_limit)
        now = time.time()
        failed = verdict.failed_hosts
        for host in verdict.failed_hosts:
            run.blacklist.add(host, now)
        summary = _describe(ends, outcome)
        if verdict.failed_hosts:
            how_long = (
                "for good"
                if config.blacklist_cooldown is None
                else "until "
                + ", ".join(
                    f"{h} in {run.blacklist.until[h] - now:.0f} s" for h in verdict.failed_hosts
                )
            )
            summary += f"; blacklisted {', '.join(verdict.failed_hosts)} {how_long}"
        say(f"generation {generation} ended: {summary}")
        if verdict.done:
            kinds = [kind for _, kind in ends.values()]
            if verdict.message is None and all(kind is End.DONE for kind in kinds):
                return 0
            if outcome.message:
                print(outcome.message, file=sys.stderr, flush=True)
            say(f"{verdict.message or 'the job cannot go on'}; {run.commit_note()}")
            # The program's own failure (every rank failed, or the launch did) keeps its
            # status, as in a job that is not elastic; the driver's decisions to stop are 1.
            program = verdict.message is None or all(kind is End.FAILED for kind in kinds)
            return (outcome.exit_status or 1) if program else 1
        resets += 1
        generation += 1
        previous = names
        limit = "" if config.reset_limit is None else f" of at most {config.reset_limit}"
        say(f"restarting (reset {resets}{limit}) from the last commit")


def _ends(outcome: JobOutcome, job) -> dict:
    """Each rank's (host, End). Where ranks ended without a word and no failure explains it
    (the launcher itself failed, taking ranks down before they could say why: Hydra does when a
    host's daemon is lost), those of their remote hosts that ssh cannot reach now are lost."""
    relay = outcome.relay
    reports = [(int(r.rank), r.code, r.signal) for r in relay.reports if r.rank.isdigit()]
    blamed = [rank for culprits in relay.blamed.values() for rank in culprits]
    unreachable = [planned_host(u.host, job.rank_hosts) for u in relay.unreachable]
    ends = classify_ends(job.rank_hosts, relay.finished, reports, blamed, unreachable)
    kinds = [kind for _, kind in ends.values()]
    if job.probe is not None and End.STOPPED in kinds and End.FAILED not in kinds:
        silent = [host for host, kind in ends.values() if kind is End.STOPPED]
        lost = [
            planned_host(failure.host, job.rank_hosts)
            for failure in job.probe(list(dict.fromkeys(silent)))
        ]
        ends = classify_ends(job.rank_hosts, relay.finished, reports, blamed, lost)
    return ends


def _change_watcher(
    run: _Run, notifier: Notifier, running: Sequence[HostSlots], generation: int
) -> Callable[[list[HostSlots]], None]:
    """While a generation runs: after each discovery, tell rank 0 when the next generation
    would have other hosts than this one (once per change)."""
    considered = [list(running)]

    def check(found: list[HostSlots]) -> None:
        order = [h.host for h in running]
        upcoming = assign_slots(order, found, run.blacklist, time.time(), run.config.max_np)
        if upcoming == considered[0]:
            return
        considered[0] = upcoming
        flags = host_update(running, upcoming)
        if flags:
            say(
                f"hosts changed ({format_host_list(upcoming) or 'none left'}): asking the ranks "
                "to stop for a restart at their next commit"
            )
            notifier.notify(flags, generation)

    return check
