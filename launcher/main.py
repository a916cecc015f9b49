"""scaleoutrun, its stages in order: the arguments (config), the plan (plan), the command
(command), the run (supervisor) and what is said at the end (report); an elastic job runs
generations of them (elastic_driver).

    scaleoutrun -np 4 python train.py --epochs 3
    scaleoutrun -H host1:2,host2:2 python train.py          (over ssh)
    scaleoutrun python train.py       (in a Slurm allocation: its nodes and tasks, through srun)
    scaleoutrun --check-build
    scaleoutrun --version

Exit status: the failing rank's (its code, or 128 + the signal that killed it); 2 for a usage
error; 1 when the job could not be started.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from .check_build import check_build
from .command import prepare_job, resolve_launcher
from .config import LaunchConfig, parse_config
from .elastic_driver import run_elastic
from .errors import UsageError
from .mpi_launcher import LaunchError, OtherMPILauncher
from .placement_table import format_placement
from .plan import placement_request, plan_job, plan_placement, resolve_hosts
from .topology import detect, local_cpus

__all__ = ["main"]


def _error(message: str) -> None:
    print(f"scaleoutrun: error: {message}", file=sys.stderr)


def _version() -> str:
    # From the installed distribution's metadata: importing scaleout would load the core.
    # (importlib.metadata is imported here: it costs every launch 50 ms.)
    import importlib.metadata

    try:
        return importlib.metadata.version("scaleout")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (scaleout is not installed as a distribution)"


def launch(config: LaunchConfig) -> int:
    if config.elastic:
        return run_elastic(config)
    environ = dict(os.environ)
    plan = plan_job(config, local_cpus(), resolve_hosts(config, environ))
    if config.print_placement:
        placement = placement_request(config)
        topology = detect()
        placements = plan_placement(plan, placement, topology, include_remote=True)
        sys.stdout.write(format_placement(placements, topology, placement))
        return 0
    outcome = prepare_job(config, plan, environ).run()
    if outcome.message:
        print(outcome.message, file=sys.stderr, flush=True)
    return outcome.exit_status


def _launcher_description(config: LaunchConfig) -> tuple[Optional[str], Optional[str]]:
    """(the launcher a job would use, described; why the launchers found cannot start the
    ranks' MPI). Neither when none is found: a job may be started by srun or an operator."""
    try:
        return resolve_launcher(config, os.environ).describe(), None
    except OtherMPILauncher as exc:
        return None, str(exc)
    except LaunchError:
        return None, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
    except UsageError as exc:
        _error(
            f"{exc}\nusage: scaleoutrun [options] [--] command [args...]  "
            "(scaleoutrun --help lists the options)"
        )
        return 2
    if config.version:
        print(_version())
        return 0
    if config.check_build:
        launcher, problem = _launcher_description(config)
        return check_build(launcher=launcher, launcher_problem=problem)
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
