"""From a planned job to the command that starts it: the MPI launcher's command line (built by
mpi_launcher for its family), each rank's wrapper command (rank_exec.py with the rank's placement
and output options), and the environment; PreparedJob runs it under the supervisor."""

from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from scaleout import _rank_report

from .config import LaunchConfig
from .elastic_notifier import driver_addresses
from .errors import UsageError
from .hosts import is_local_host
from .mpi_launcher import (
    Flavour,
    LaunchError,
    LaunchRequest,
    MPIExec,
    MPIFamily,
    binding_environment,
    build_command,
    exported_names,
    find_launcher,
    interface_environment,
    launcher_variables,
    liveness_environment,
    probe_library,
    ranks_python,
    rewritten_by_prrte,
    survivor_args,
    yield_environment,
)
from .plan import (
    JobPlan,
    horovod_slots_environment,
    job_hosts,
    placement_request,
    plan_placement,
    torch_store_environment,
)
from .rank_env import HOROVOD_NUMBERS
from .report import JobOutcome
from .supervisor import HostProbe, run_job
from .topology import detect
from .unreachable import probe_hosts

__all__ = ["PreparedJob", "prepare_job", "resolve_launcher", "RANK_EXEC", "DEFAULT_START_TIMEOUT"]

RANK_EXEC = Path(__file__).resolve().with_name("rank_exec.py")
DEFAULT_START_TIMEOUT = 60.0


def _rank_command(
    config: LaunchConfig,
    launcher: MPIExec,
    placement_args: Sequence[str],
    np: int,
    output_dir: Optional[str],
    keep_survivors: bool,
) -> tuple[str, ...]:
    # The wrapper cannot import scaleout: it is told the variable its program's records go by.
    wrapper = [sys.executable, str(RANK_EXEC), "--report-variable", _rank_report.VARIABLE]
    if launcher.family is MPIFamily.HYDRA:
        # Hydra's proxy starts ranks from its one thread and does not always clean up after a
        # rank that never called MPI_Init, so the wrapper ends with it.
        wrapper.append("--exit-with-parent")
        if keep_survivors:  # Hydra then sends SIGUSR1 to the survivors of a rank's end
            wrapper.append("--ignore-notices")
    if config.prefix_output_with_timestamp:
        wrapper.append("--timestamp-output")
    if output_dir is not None:
        wrapper += ["--output-dir", output_dir, "--world-size", str(np)]
    return tuple(wrapper) + _joined(placement_args) + ("--",) + config.command


def _free_port() -> int:
    """A TCP port free on this machine now, for torch's store."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _joined(args: Sequence[str]) -> tuple[str, ...]:
    """`--flag value` pairs as `--flag=value`: PRRTE rewrites `--map-by X` and `--bind-to X`
    even after the program's name (Note [Launcher flavours])."""
    out: list[str] = []
    for word in args:
        if out and out[-1].startswith("--") and "=" not in out[-1] and not word.startswith("--"):
            out[-1] += "=" + word
        else:
            out.append(word)
    return tuple(out)


def resolve_launcher(config: LaunchConfig, environ: Mapping[str, str]) -> MPIExec:
    """The launcher of the MPI the ranks load, checked against it (Note [Launcher flavours]);
    refuses before launch what that launcher cannot do."""
    python = ranks_python(config.command, sys.executable, environ)
    launcher = find_launcher(config.mpiexec, probe_library(python, environ), python, environ)
    if launcher.kind is Flavour.PRRTE:
        rewritten = rewritten_by_prrte(config.command[1:])
        if rewritten:
            raise LaunchError(
                f"{launcher.describe()} rewrites {', '.join(dict.fromkeys(rewritten))} in the "
                "program's own arguments (to --mapby and so on) before the program sees them; "
                "write them as --option=VALUE"
            )
    return launcher


def _output_dir(config: LaunchConfig) -> Optional[str]:
    """--output-filename as an absolute path (ranks may start elsewhere), created here so that
    a directory that cannot be made is reported before anything starts."""
    if config.output_filename is None:
        return None
    directory = os.path.abspath(os.path.expanduser(config.output_filename))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--output-filename {config.output_filename}: cannot create "
            f"{directory}: {exc.strerror or exc}"
        ) from None
    return directory


def _identity_file(config: LaunchConfig) -> Optional[str]:
    """--ssh-identity-file as an absolute path, checked: ssh itself only warns about a key it
    cannot read, and then fails to log in for what looks like another reason."""
    if config.ssh_identity_file is None:
        return None
    path = os.path.abspath(os.path.expanduser(config.ssh_identity_file))
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise UsageError(
            f"--ssh-identity-file {config.ssh_identity_file}: no readable file at {path}"
        )
    return path


@dataclass(frozen=True)
class PreparedJob:
    """A job ready to start: the launcher's command line, its environment, and where each
    rank runs (by rank)."""

    command: list[str]
    env: dict[str, str]
    rank_hosts: list[str]
    start_timeout: float
    probe: Optional[HostProbe]

    def run(self, survivor_grace: Optional[float] = None) -> JobOutcome:
        sys.stdout.flush()
        return run_job(
            self.command,
            self.env,
            self.rank_hosts,
            self.start_timeout,
            probe=self.probe,
            survivor_grace=survivor_grace,
        )


def prepare_job(
    config: LaunchConfig,
    plan: JobPlan,
    environ: Mapping[str, str],
    launcher: Optional[MPIExec] = None,
    rank_env: Mapping[str, str] = {},
    keep_survivors: bool = False,
) -> PreparedJob:
    """The command line and environment for `plan`. rank_env: more variables for every rank.
    keep_survivors: the launcher lets the other ranks run on when one dies (an elastic
    generation's survivors must stop for a restart by themselves)."""
    placement = placement_request(config)
    plan_placement(plan, placement, detect(), include_remote=False)  # refuses what cannot be
    identity_file = _identity_file(config)
    output_dir = _output_dir(config)
    if launcher is None:
        launcher = resolve_launcher(config, environ)
    added = {
        **plan.environment,
        **yield_environment(
            launcher.family, config.mpi_yield, plan.oversubscribed, environ, launcher.kind
        ),
        **interface_environment(config.network_interfaces, environ),
        **binding_environment(launcher, environ),
        **liveness_environment(launcher, environ),
        **torch_store_environment(
            plan, _free_port, lambda: driver_addresses(config.network_interfaces)[0]
        ),
        **horovod_slots_environment(plan),
        **rank_env,
    }
    env = {**environ, **added}
    if HOROVOD_NUMBERS not in added:  # a job started from inside an elastic one's rank
        env.pop(HOROVOD_NUMBERS, None)
    hydra = launcher.family is MPIFamily.HYDRA
    # Both Hydras and PRRTE end every rank once one dies, unless told not to.
    survivors = survivor_args(launcher) if keep_survivors else ()
    request = LaunchRequest(
        np=plan.np,
        rank_command=_rank_command(
            config, launcher, placement.to_args(), plan.np, output_dir, keep_survivors
        ),
        hosts=plan.hosts,
        oversubscribed=plan.oversubscribed,
        exported=() if hydra else exported_names(env),
        running_as_root=os.geteuid() == 0,
        ssh_port=config.ssh_port,
        ssh_identity_file=identity_file,
        network_interfaces=config.network_interfaces,
        remote_launch=plan.remote_launch or "ssh",
        environment=tuple(sorted(added.items())) if hydra else (),
        extra_args=survivors + config.mpi_args,
    )
    command = build_command(launcher, request)
    launcher_env = launcher_variables(launcher, request, environ)
    env.update(launcher_env)
    if config.verbose:
        # What the command line does not show: variables for the launcher itself, and (for
        # Open MPI, whose -x names only) the values of those scaleoutrun adds for the ranks.
        shown_vars = {**launcher_env, **({} if hydra else added)}
        shown = "".join(
            f"{name}={shlex.quote(value)} " for name, value in sorted(shown_vars.items())
        )
        print(f"scaleoutrun: {shown}{shlex.join(command)}", file=sys.stderr, flush=True)

    hosts = job_hosts(plan)
    rank_hosts = [entry.host for entry in hosts for _ in range(entry.slots)]
    start_timeout = DEFAULT_START_TIMEOUT if config.start_timeout is None else config.start_timeout
    probe = None
    if plan.hosts and request.remote_launch == "ssh":
        # Hydra and mpirun start a host that is this machine without ssh.
        def probe(hosts):
            return probe_hosts(
                [host for host in hosts if not is_local_host(host)], config.ssh_port, identity_file
            )

    return PreparedJob(command, env, rank_hosts, start_timeout, probe)
