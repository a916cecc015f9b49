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

from .config import LaunchConfig, parse_config
from .errors import UsageError
from .mpi_launcher import (
    LaunchError,
    OtherMPILauncher,
    discard_early_probe,
    ranks_python,
    start_early_probe,
)

# The rest of the launcher is imported by the functions that use it, once main() has started
# the probe of the ranks' MPI: the probe (a Python that imports mpi4py, about 0.14 s here) then
# runs while those imports (about 0.1 s) do, instead of after them.

__all__ = ["main"]


def _error(message: str) -> None:
    print(f"scaleoutrun: error: {message}", file=sys.stderr)


def _version() -> str:
    # From the installed distribution's metadata: importing scaleout would load the core.
    import importlib.metadata  # noqa: PLC0415  (50 ms: here, not in every launch)

    try:
        return importlib.metadata.version("scaleout")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (scaleout is not installed as a distribution)"


def launch(config: LaunchConfig) -> int:
    from .command import prepare_job  # noqa: PLC0415  (see the imports above)
    from .elastic_driver import run_elastic  # noqa: PLC0415
    from .placement_table import format_placement  # noqa: PLC0415
    from .plan import placement_request, plan_job, plan_placement, resolve_hosts  # noqa: PLC0415
    from .topology import detect, local_cpus  # noqa: PLC0415

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
    from .command import resolve_launcher  # noqa: PLC0415  (see the imports above)

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
    if not config.print_placement:  # every other path asks which MPI the ranks load
        start_early_probe(ranks_python(config.command, sys.executable, os.environ), os.environ)
    try:
        if config.check_build:
            from .check_build import check_build  # noqa: PLC0415  (see the imports above)

            launcher, problem = _launcher_description(config)
            return check_build(launcher=launcher, launcher_problem=problem)
        return launch(config)
    except UsageError as exc:
        _error(str(exc))
        return 2
    except LaunchError as exc:
        _error(str(exc))
        return 1
    finally:
        discard_early_probe()


if __name__ == "__main__":
    sys.exit(main())
