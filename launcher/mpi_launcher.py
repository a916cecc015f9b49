"""The MPI's own launcher: finding mpiexec, telling Hydra from Open MPI, and its command line.

Everything but find_mpiexec and probe_family is pure, so the command lines for both families
are tested without either installed.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .hosts import HostSlots, format_host_list

__all__ = [
    "MPIFamily",
    "MPIExec",
    "LaunchError",
    "find_mpiexec",
    "detect_family",
    "probe_family",
    "LaunchRequest",
    "build_command",
    "launcher_variables",
    "interface_environment",
    "yield_environment",
    "exported_names",
]


class LaunchError(Exception):
    """The job could not be started (no MPI launcher, an unknown one, ...): exit status 1."""


class MPIFamily(enum.Enum):
    HYDRA = "hydra"  # MPICH, Intel MPI, MVAPICH: mpiexec.hydra
    OPEN_MPI = "openmpi"  # Open MPI's mpirun (ORTE in 4.x, PRRTE in 5.x)


@dataclass(frozen=True)
class MPIExec:
    path: str
    family: MPIFamily
    version: str = ""


def find_mpiexec(explicit: Optional[str], python: str, environ: Mapping[str, str]) -> str:
    """The launcher to use: the one asked for, else the one beside this Python (where the
    mpich wheel installs it, and so the MPI that mpi4py and the core load), else PATH's."""
    if explicit:
        resolved = (
            shutil.which(explicit, path=environ.get("PATH")) if os.sep not in explicit else explicit
        )
        if not resolved or not os.access(resolved, os.X_OK):
            raise LaunchError(
                f"the MPI launcher {explicit!r} (--mpiexec / SCALEOUT_MPIEXEC) "
                "does not exist or is not executable"
            )
        return resolved
    looked = []
    beside = Path(python).parent
    for name in ("mpiexec", "mpirun"):
        candidate = beside / name
        looked.append(str(candidate))
        if os.access(candidate, os.X_OK):
            return str(candidate)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=environ.get("PATH"))
        if found:
            return found
    looked.append("mpiexec and mpirun on PATH")
    raise LaunchError(
        "no MPI launcher found (looked for " + ", ".join(looked) + "). Install the "
        "MPICH wheel with `pip install mpich`, load your cluster's MPI, or name the "
        "launcher with --mpiexec PATH or SCALEOUT_MPIEXEC."
    )


def detect_family(version_text: str) -> Optional[MPIFamily]:
    """The launcher family from the output of `mpiexec --version`."""
    if re.search(r"HYDRA|Intel\(R\) MPI|MPICH|MVAPICH", version_text):
        return MPIFamily.HYDRA
    if re.search(r"Open MPI|OpenRTE|PRRTE|prterun", version_text):
        return MPIFamily.OPEN_MPI
    return None


def probe_family(path: str) -> MPIExec:
    """Runs `path --version` to learn which launcher it is."""
    try:
        result = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"could not run `{path} --version`: {exc}") from None
    text = result.stdout + result.stderr
    family = detect_family(text)
    if family is None:
        first = text.strip().splitlines()[:1]
        raise LaunchError(
            f"{path} is neither MPICH's Hydra nor Open MPI's mpirun "
            f"(`--version` said: {first[0] if first else 'nothing'}); scaleoutrun "
            "knows how to drive those two. Name another with --mpiexec PATH."
        )
    version = next(
        (line.strip() for line in text.splitlines() if "Version:" in line or "Open MPI" in line), ""
    )
    return MPIExec(path, family, version.replace("Version:", "").strip())


@dataclass(frozen=True)
class LaunchRequest:
    """What the launcher command line says: how many ranks, where, and what each runs."""

    np: int
    rank_command: tuple[str, ...]
    hosts: Optional[tuple[HostSlots, ...]] = None  # None: all ranks on this machine
    oversubscribed: bool = False
    exported: tuple[str, ...] = ()  # variables Open MPI must be told to pass
    running_as_root: bool = False
    ssh_port: Optional[int] = None  # for remote hosts
    ssh_identity_file: Optional[str] = None  # for remote hosts: ssh's -i
    network_interfaces: tuple[str, ...] = ()  # the launcher's and MPI's TCP traffic
    remote_launch: str = "ssh"  # how hosts are reached: ssh or slurm
    # Variables scaleoutrun sets for every rank, named on Hydra's command line (-genv) so that
    # they reach remote ranks whatever a site's Hydra configuration says about the environment.
    environment: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = field(default=())  # --mpi-args, before the rank command

    def ssh_args(self) -> Optional[str]:
        """ssh's own arguments for reaching the hosts, as one string (both launchers split
        theirs on spaces); None when there are none or ssh is not how hosts are reached."""
        if self.remote_launch != "ssh":
            return None
        args = []
        if self.ssh_port is not None:
            args.append(f"-p {self.ssh_port}")
        if self.ssh_identity_file is not None:
            args.append(f"-i {self.ssh_identity_file}")
        return " ".join(args) or None


def build_command(launcher: MPIExec, request: LaunchRequest) -> list[str]:
    """The full launcher command line for one job.

    With hosts, the launcher starts its per-host daemons over ssh (or through Slurm's srun) and
    those start the ranks; a host that is this machine is started without ssh by both.
    """
    if launcher.family is MPIFamily.HYDRA:
        # Hydra binds nothing unless asked; binding is the rank wrapper's job.
        args = [launcher.path, "-n", str(request.np)]
        if request.hosts:
            args += ["-launcher", request.remote_launch, "-hosts", format_host_list(request.hosts)]
        if request.network_interfaces:
            # Hydra's -iface takes a single interface.
            args += ["-iface", request.network_interfaces[0]]
        # -genvall is Hydra's default, said explicitly for the same reason as -genv.
        args.append("-genvall")
        for name, value in request.environment:
            args += ["-genv", name, value]
    else:
        args = [launcher.path, "-np", str(request.np)]
        if request.running_as_root:
            args.append("--allow-run-as-root")
        if request.hosts:
            args += [
                "--host",
                format_host_list(request.hosts),
                "--mca",
                "plm",
                "slurm" if request.remote_launch == "slurm" else "rsh",
            ]
        # Open MPI binds to cores by default (for 2 ranks or fewer), which would fight the rank
        # wrapper's own binding; and it refuses more ranks than cores unless told.
        args += [
            "--bind-to",
            "none",
            "--map-by",
            "slot:OVERSUBSCRIBE" if request.oversubscribed else "slot",
        ]
        ssh_args = request.ssh_args()
        if ssh_args is not None:
            args += ["--mca", "plm_rsh_args", ssh_args]
        if request.network_interfaces:
            interfaces = ",".join(request.network_interfaces)
            args += [
                "--mca",
                "btl_tcp_if_include",
                interfaces,
                "--mca",
                "oob_tcp_if_include",
                interfaces,
            ]
        # Open MPI passes only the variables it is told to (Hydra passes them all).
        for name in request.exported:
            args += ["-x", name]
    return args + list(request.extra_args) + list(request.rank_command)


# Hydra's ssh launcher splits these on spaces and adds them to its ssh command line (its
# -launcher-exec takes a program, not a command line: "ssh -p 2222" is not found). Intel MPI's
# Hydra reads the second name.
_HYDRA_SSH_ARGS = ("HYDRA_LAUNCHER_EXTRA_ARGS", "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS")


def launcher_variables(
    launcher: MPIExec, request: LaunchRequest, environ: Mapping[str, str]
) -> dict[str, str]:
    """Settings the launcher takes from its environment rather than its command line. ssh
    arguments the user already gives Hydra this way are kept, ours added after them."""
    ours = request.ssh_args()
    if launcher.family is not MPIFamily.HYDRA or ours is None:
        return {}
    return {
        name: f"{environ[name]} {ours}" if environ.get(name, "").strip() else ours
        for name in _HYDRA_SSH_ARGS
    }


def interface_environment(interfaces: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Variables that keep the MPI's own traffic on the chosen interfaces, which -iface and
    tcp_if_include do not reach when the MPI runs over UCX (MPICH's ch4:ucx, as in the mpich
    wheel) or libfabric's tcp provider. UCX takes a list; libfabric's tcp provider one
    interface, the first. SCALEOUT_NETWORK_INTERFACE puts the ranks' own liveness connections
    (Note [Liveness]: rank 0 listens, every other rank connects) on the first too. A value the
    user set is left alone."""
    if not interfaces:
        return {}
    wanted = {
        "UCX_NET_DEVICES": ",".join(interfaces),
        "FI_TCP_IFACE": interfaces[0],
        "SCALEOUT_NETWORK_INTERFACE": interfaces[0],
    }
    return {name: value for name, value in wanted.items() if name not in environ}


def yield_environment(
    family: MPIFamily, mode: str, oversubscribed: bool, environ: Mapping[str, str]
) -> dict[str, str]:
    """Variables that make ranks waiting in MPI give their core to ranks with work to do.

    MPICH's ch4 device busy-polls, and its periodic sched_yield does little under Linux's CFS:
    with more ranks than cores a waiting rank takes CPU time from one that computes.
    MPIR_CVAR_ENABLE_HEAVY_YIELD makes the wait loop sleep briefly (nanosleep) instead.
    Measured on 2 cores, 4 ranks, mpi4py: when rank 0 computes 10 ms before each allreduce,
    20.5 ms per step by default and 10.5 ms with it (the waiting ranks' CPU time falls from 68%
    to 20%); back-to-back 4 KiB allreduces go from 43 us to about 390 us; balanced steps and
    16 MiB allreduces are unchanged. Training steps compute between collectives, so it is on
    when oversubscribed. Open MPI has the same switch as an MCA parameter. A value the user set
    is left alone.
    """
    if mode == "off" or (mode == "auto" and not oversubscribed):
        return {}
    if family is MPIFamily.HYDRA:
        wanted = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    else:
        wanted = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    return {name: value for name, value in wanted.items() if name not in environ}


_EXPORTABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LAUNCHER_OWN = ("OMPI_", "PMIX_", "PRTE_", "ORTE_", "OPAL_", "BASH_FUNC_")


def exported_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The variables to hand to Open MPI's -x so that the user's environment reaches remote
    ranks (Hydra passes everything by itself). The launcher's own variables stay out."""
    return tuple(
        sorted(
            name
            for name in environ
            if _EXPORTABLE.match(name) and not name.startswith(_LAUNCHER_OWN)
        )
    )
