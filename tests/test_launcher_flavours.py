"""scaleoutrun's launcher flavours without starting a job (Note [Launcher flavours]): which
launcher a version text is, which launcher serves the ranks' MPI (over stand-in launchers that
print a real launcher's `--version`), what is refused, and each flavour's command line. The
same on real MPIs: tests/test_mpi_flavours.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scaleout._mpi_library import MpiLibrary
from scaleout.launcher.command import RANK_EXEC
from scaleout.launcher.hosts import HostSlots
from scaleout.launcher.mpi_launcher import (
    Flavour,
    LaunchError,
    LaunchRequest,
    MPIExec,
    MPIFamily,
    binding_environment,
    build_command,
    detect_flavour,
    find_launcher,
    library_mismatch,
    liveness_environment,
    probe_family,
    ranks_python,
    rewritten_by_prrte,
    survivor_args,
    yield_environment,
)

# --- choosing the launcher, over stand-ins -------------------------------------------------

VERSIONS = {
    "mpich": "HYDRA build details:\n    Version:                                 5.0.2\n",
    "intel": "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b)\n",
    "ompi5": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/\n",
    "prrte": "prterun (PRRTE) 3.0.14\n\nReport bugs to: https://github.com/openpmix/prrte\n",
    "ompi4": "mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community\n",
}


def stand_in(directory: Path, name: str, says: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    lines = "".join(f"printf '%s\\n' '{line}'\n" for line in VERSIONS[says].splitlines())
    path.write_text("#!/bin/sh\n" + lines)  # shell builtins only: PATH may be empty
    path.chmod(0o755)
    return str(path)


def library(root: Path, family: str) -> MpiLibrary:
    abi, soname = ("openmpi", "libmpi.so.40") if family == "Open MPI" else ("mpich", "libmpi.so.12")
    return MpiLibrary(str(root / "lib" / soname), abi, family, f"{family} 9.9")


def test_flavours_from_version_texts():
    assert detect_flavour(VERSIONS["mpich"]) is Flavour.MPICH_HYDRA
    assert detect_flavour(VERSIONS["intel"]) is Flavour.INTEL_HYDRA
    assert detect_flavour(VERSIONS["ompi5"]) is Flavour.PRRTE
    assert detect_flavour(VERSIONS["prrte"]) is Flavour.PRRTE
    assert detect_flavour(VERSIONS["ompi4"]) is Flavour.ORTE
    # prterun from a relocated tree without PRTE_PREFIX cannot find its help text.
    assert (
        detect_flavour("But I couldn't open the help file:\n /x/help-prterun.txt") is Flavour.PRRTE
    )


def test_the_launcher_of_the_ranks_mpi_is_taken_beside_its_library(tmp_path):
    # An Open MPI tree whose mpirun and mpiexec the mpich wheel replaced (the venv):
    # its prterun is the one launcher there that belongs to its library.
    root = tmp_path / "venv"
    stand_in(root / "bin", "mpirun", "mpich")
    stand_in(root / "bin", "mpiexec", "mpich")
    prterun = stand_in(root / "bin", "prterun", "prrte")
    empty = {"PATH": str(tmp_path / "nothing")}
    found = find_launcher(None, library(root, "Open MPI"), str(root / "bin" / "python"), empty)
    assert (found.path, found.kind) == (prterun, Flavour.PRRTE)
    # An MPICH library there is served by that mpiexec.
    found = find_launcher(None, library(root, "MPICH"), str(root / "bin" / "python"), empty)
    assert (found.path, found.kind) == (str(root / "bin" / "mpiexec"), Flavour.MPICH_HYDRA)
    # Intel MPI's: none of its launchers anywhere; every one found is named.
    with pytest.raises(LaunchError) as refused:
        find_launcher(None, library(root, "Intel MPI"), str(root / "bin" / "python"), empty)
    assert "no launcher of Intel MPI found" in str(refused.value)
    assert "(MPICH Hydra 5.0.2)" in str(refused.value)
    # On PATH, when the library's tree has none (a system library, a module's launcher).
    other = tmp_path / "opt" / "intel" / "bin"
    intel = stand_in(other, "mpiexec.hydra", "intel")
    found = find_launcher(
        None, library(tmp_path / "sys", "Intel MPI"), "/usr/bin/python3", {"PATH": str(other)}
    )
    assert (found.path, found.kind) == (intel, Flavour.INTEL_HYDRA)


def test_a_named_launcher_of_another_mpi_is_refused(tmp_path):
    root = tmp_path / "venv"
    hydra = stand_in(root / "bin", "mpiexec", "mpich")
    with pytest.raises(LaunchError, match=r"belongs to MPICH, but the ranks load Open MPI's"):
        find_launcher(hydra, library(root, "Open MPI"), sys.executable, {})
    # MVAPICH's library is driven by an MPICH Hydra; an unknown library by anything.
    assert find_launcher(hydra, library(root, "MVAPICH"), sys.executable, {}).path == hydra
    assert library_mismatch(probe_family(hydra), None) is None


def test_the_ranks_python_is_the_commands_own(tmp_path):
    other = tmp_path / "bin" / "python3.11"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    env = {"PATH": str(other.parent)}
    assert ranks_python([str(other), "train.py"], "/me/python", env) == str(other)
    assert ranks_python(["python3.11", "train.py"], "/me/python", env) == str(other)
    assert ranks_python(["./train.sh"], "/me/python", env) == "/me/python"


def test_the_early_probe_answers_only_the_question_it_was_started_for(tmp_path):
    """scaleoutrun starts the probe of the ranks' MPI before its own imports are done
    (launcher/main.py); its answer serves the same Python in the same environment only, and a
    probe nobody asked for is stopped and reaped."""
    import os

    from scaleout import _mpi_library
    from scaleout.launcher import mpi_launcher

    env = {**os.environ, "SCALEOUT_MPI_PROBE_CACHE": "0"}  # a probe process every time
    mpi_launcher.start_early_probe(sys.executable, env)
    started = mpi_launcher._early
    assert mpi_launcher.probe_library(sys.executable, env) == _mpi_library.probe(
        sys.executable, env
    )
    assert mpi_launcher._early is None and started.proc.returncode == 0
    # Asked about another environment (where mpi4py cannot load): that one is probed.
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text("raise ImportError('no MPI here')\n")
    other = {**env, "PYTHONPATH": str(tmp_path)}
    mpi_launcher.start_early_probe(sys.executable, env)
    started = mpi_launcher._early
    assert mpi_launcher.probe_library(sys.executable, other) is None
    mpi_launcher.discard_early_probe()
    assert mpi_launcher._early is None and started.proc.returncode is not None


def test_the_probe_cache_answers_until_what_the_answer_depends_on_changes(tmp_path):
    """Note [Probe cache]: the second launch with the same Python and variables takes the first
    one's answer without starting a probe; a package added to a directory on that Python's
    sys.path, or other variables, make it probe again."""
    import os

    from scaleout import _mpi_library

    extra = tmp_path / "extra"
    extra.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(extra)}
    env.pop("SCALEOUT_MPI_PROBE_CACHE", None)
    first = _mpi_library.StartedProbe(sys.executable, env)
    assert first.proc is not None
    library = first.result()
    assert len(list((tmp_path / "cache" / "scaleout").glob("mpi-probe-*.json"))) == 1
    again = _mpi_library.StartedProbe(sys.executable, env)
    assert again.proc is None and again.result() == library
    (extra / "mpi4py").mkdir()  # a package appears where that Python looks first
    (extra / "mpi4py" / "__init__.py").write_text("raise ImportError('no MPI here')\n")
    changed = _mpi_library.StartedProbe(sys.executable, env)
    assert changed.proc is not None
    with pytest.raises(_mpi_library.ProbeError, match="no MPI here"):
        changed.result()
    other = _mpi_library.StartedProbe(sys.executable, {**env, "MPI4PY_LIBMPI": "libmpi.so.12"})
    assert other.proc is not None
    other.cancel()
    off = _mpi_library.StartedProbe(sys.executable, {**env, "SCALEOUT_MPI_PROBE_CACHE": "0"})
    assert off.proc is not None
    off.cancel()


# --- each flavour's command line, without starting it --------------------------------------

RANK = ("/venv/bin/python", "/x/rank_exec.py", "--", "python", "train.py")
TWO_HOSTS = (HostSlots("h1", 2), HostSlots("h2", 1))


def test_prrte_command_line():
    prterun = MPIExec("/o/bin/prterun", MPIFamily.OPEN_MPI, "3.0.14", Flavour.PRRTE)
    request = LaunchRequest(
        np=3, rank_command=RANK, hosts=TWO_HOSTS, ssh_port=2222, running_as_root=True
    )
    line = " ".join(build_command(prterun, request))
    assert line.startswith("/o/bin/prterun -np 3 --personality ompi --allow-run-as-root ")
    assert "--host h1:2,h2:1 --mca plm ssh " in line
    assert "--mca plm_ssh_args -p 2222" in line
    assert "--prefix /o" in line  # where the remote daemons are
    assert line.endswith(" ".join(RANK))
    # Open MPI's mpirun says --personality ompi itself.
    mpirun = MPIExec("/o/bin/mpirun", MPIFamily.OPEN_MPI, "5.0.11", Flavour.PRRTE)
    assert "--personality" not in build_command(mpirun, request)
    assert survivor_args(mpirun) == (
        "--runtime-options",
        "recoverable,error-nonzero-status=false",
        "--mca",
        "mpi_ft_enable",
        "1",
    )


def test_intel_hydra_command_line():
    intel = MPIExec("/i/bin/mpiexec.hydra", MPIFamily.HYDRA, "2021.18", Flavour.INTEL_HYDRA)
    local = build_command(intel, LaunchRequest(np=2, rank_command=RANK))
    assert local == ["/i/bin/mpiexec.hydra", "-n", "2", "-genvall", *RANK]
    request = LaunchRequest(
        np=3, rank_command=RANK, hosts=TWO_HOSTS, environment=(("A", "1"),), extra_args=("-v",)
    )
    # One MPMD section per host: Intel's -hosts takes "h1:2" for a host name.
    assert build_command(intel, request) == [
        "/i/bin/mpiexec.hydra",
        "-launcher",
        "ssh",
        "-genvall",
        "-genv",
        "A",
        "1",
        "-v",
        *("-n", "2", "-host", "h1", *RANK),
        ":",
        *("-n", "1", "-host", "h2", *RANK),
    ]
    assert survivor_args(intel) == ("-disable-auto-cleanup",)
    assert binding_environment(intel, {}) == {"I_MPI_PIN": "off"}
    assert yield_environment(intel.family, "auto", True, {}, intel.kind) == {
        "I_MPI_THREAD_YIELD": "3"
    }
    assert yield_environment(intel.family, "auto", False, {}, intel.kind) == {}
    assert binding_environment(intel, {"I_MPI_PIN": "on"}) == {}  # the user's choice
    mpich = MPIExec("/m/bin/mpiexec", MPIFamily.HYDRA, "5.0.2", Flavour.MPICH_HYDRA)
    assert binding_environment(mpich, {}) == {}
    # Note [Intel MPI and dead peers]: for every rank, unless the user chose.
    assert liveness_environment(intel, {}) == {"I_MPI_SHM_CMA": "0"}
    assert liveness_environment(intel, {"I_MPI_SHM_CMA": "1"}) == {}
    assert liveness_environment(mpich, {}) == {}
    assert "-hosts" in build_command(mpich, request)


def test_the_rank_wrappers_options_reach_it_whole(tmp_path):
    """PRRTE rewrites `--map-by X` after the program's name too; `--map-by=X` it leaves."""
    from scaleout.launcher.command import prepare_job
    from scaleout.launcher.config import parse_config
    from scaleout.launcher.plan import plan_job

    prterun = MPIExec("/o/bin/prterun", MPIFamily.OPEN_MPI, "3.0.14", Flavour.PRRTE)
    config = parse_config(["-np", "1", "--bind-to", "none", "python", "x.py"], {})
    job = prepare_job(config, plan_job(config, 1), {"PATH": "/bin"}, launcher=prterun)
    wrapper = job.command[job.command.index(str(RANK_EXEC)) :]
    assert "--bind-to=none" in wrapper and "--map-by=socket" in wrapper, wrapper
    assert not rewritten_by_prrte(wrapper[: wrapper.index("--")])
    assert rewritten_by_prrte(["--map-by", "x", "--bind-to=y", "--rank-by"]) == [
        "--map-by",
        "--rank-by",
    ]
