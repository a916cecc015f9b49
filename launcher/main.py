"""scaleoutrun: parse the arguments, plan the job, launch it through the MPI's own launcher.

    scaleoutrun -np 4 python train.py --epochs 3
    scaleoutrun -H host1:2,host2:2 python train.py          (over ssh)
    scaleoutrun python train.py       (in a Slurm allocation: its nodes and tasks, through srun)
    scaleoutrun --check-build

Exit status: the failing rank's (its code, or 128 + the signal that killed it); 2 for a usage
error; 1 when the job could not be started.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from .check_build import check_build
from .config import LaunchConfig, UsageError, parse_config
from .hosts import HostSlots, is_local_host
from .job import run_job
from .mpi_launcher import (LaunchError, LaunchRequest, MPIExec, MPIFamily, build_command,
                           exported_names, find_mpiexec, interface_environment,
                           launcher_variables, probe_family, yield_environment)
from .placement_table import format_placement
from .plan import placement_request, plan_job, plan_placement, resolve_hosts
from .topology import detect
from .unreachable import probe_hosts

__all__ = ["main"]

RANK_EXEC = Path(__file__).resolve().with_name("rank_exec.py")
DEFAULT_START_TIMEOUT = 60.0


def _error(message: str) -> None:
    print(f"scaleoutrun: error: {message}", file=sys.stderr)


def _rank_command(config: LaunchConfig, launcher: MPIExec,
                  placement_args: Sequence[str]) -> tuple[str, ...]:
    wrapper = [sys.executable, str(RANK_EXEC)]
    if launcher.family is MPIFamily.HYDRA:
        # Hydra's proxy starts ranks from its one thread and does not always clean up after a
        # rank that never called MPI_Init, so the wrapper ends with it.
        wrapper.append("--exit-with-parent")
    return tuple(wrapper) + tuple(placement_args) + ("--",) + config.command


def launch(config: LaunchConfig) -> int:
    environ = dict(os.environ)
    plan = plan_job(config, len(os.sched_getaffinity(0)), resolve_hosts(config, environ))
    placement = placement_request(config)
    topology = detect()
    placements = plan_placement(plan, placement, topology, include_remote=config.print_placement)
    if config.print_placement:
        sys.stdout.write(format_placement(placements, topology, placement))
        return 0

    launcher = probe_family(find_mpiexec(config.mpiexec, sys.executable, environ))
    added = {**plan.environment,
             **yield_environment(launcher.family, config.mpi_yield, plan.oversubscribed, environ),
             **interface_environment(config.network_interface, environ)}
    env = {**environ, **added}
    hydra = launcher.family is MPIFamily.HYDRA
    request = LaunchRequest(
        np=plan.np, rank_command=_rank_command(config, launcher, placement.to_args()),
        hosts=plan.hosts, oversubscribed=plan.oversubscribed,
        exported=() if hydra else exported_names(env),
        running_as_root=os.geteuid() == 0, ssh_port=config.ssh_port,
        network_interface=config.network_interface,
        remote_launch=plan.remote_launch or "ssh",
        environment=tuple(sorted(added.items())) if hydra else ())
    command = build_command(launcher, request)
    launcher_env = launcher_variables(launcher, request, environ)
    env.update(launcher_env)
    if config.verbose:
        # What the command line does not show: variables for the launcher itself, and (for
        # Open MPI, whose -x names only) the values of those scaleoutrun adds for the ranks.
        shown_vars = {**launcher_env, **({} if hydra else added)}
        shown = "".join(f"{name}={shlex.quote(value)} "
                        for name, value in sorted(shown_vars.items()))
        print(f"scaleoutrun: {shown}{shlex.join(command)}", file=sys.stderr, flush=True)

    hosts = plan.hosts or (HostSlots("localhost", plan.np),)
    rank_hosts = [entry.host for entry in hosts for _ in range(entry.slots)]
    start_timeout = DEFAULT_START_TIMEOUT if config.start_timeout is None else config.start_timeout
    sys.stdout.flush()
    probe = None
    if plan.hosts and request.remote_launch == "ssh":
        # Hydra and mpirun start a host that is this machine without ssh.
        def probe(hosts):
            return probe_hosts([host for host in hosts if not is_local_host(host)],
                               config.ssh_port)
    outcome = run_job(command, env, rank_hosts, start_timeout, probe=probe)
    if outcome.message:
        print(outcome.message, file=sys.stderr, flush=True)
    return outcome.exit_status


def _launcher_description(config: LaunchConfig) -> Optional[str]:
    try:
        found = probe_family(find_mpiexec(config.mpiexec, sys.executable, os.environ))
    except LaunchError:
        return None
    return f"{found.path} ({found.family.value}{', ' + found.version if found.version else ''})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except UsageError as exc:
        _error(f"{exc}\nusage: scaleoutrun [options] [--] command [args...]  "
               "(scaleoutrun --help lists the options)")
        return 2
    if config.check_build:
        return check_build(launcher=_launcher_description(config))
    try:
        return launch(config)
    except UsageError as exc:
        _error(str(exc))
        return 2
    except LaunchError as exc:
        _error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
