"""A part of the suite on Open MPI and on Intel MPI (the whole suite runs on MPICH): every
collective, dtype and op on both data paths, liveness, the torch optimizer and the MPI checks
(and on Open MPI every collective on process sets; on MPICH's library of the MPI 5 standard ABI
the MPI checks and every collective), at 3 ranks (every count runs on MPICH), each file run by
the pytest of an environment that holds the prebuilt wheel and that MPI (`tools/make_mpi_envs.sh`,
which .ci/run runs; without it these tests skip and say so).

The inner run starts outside the source tree, so that its `import scaleout` is the wheel's, and
SCALEOUT_TEST_EXPECT_MPI makes tests/test_mpi_abi.py check that the MPI it runs on is that one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import OPEN_MPI_AS_ROOT, run_job

ROOT = Path(__file__).resolve().parent.parent
# Open MPI (another ABI, another shim) runs more of the suite than Intel MPI, whose ABI and shim
# are MPICH's, which the whole suite runs on.
COMMON = [
    "tests/test_mpi_abi.py",
    "tests/test_collectives.py",
    "tests/test_liveness.py",
    "tests/test_torch.py::test_distributed_optimizer_broadcasts_and_join",
]
TESTS = {
    "openmpi": COMMON
    + [
        # every collective on sets (their communicators come from the shim's MPI_Comm_split
        # and MPI_Comm_create_group); the rest of the file is the front ends' and the core's
        "tests/test_process_sets.py::test_process_sets"
    ],
    # (torch on Intel MPI: test_torch_distributed's torchrun test runs there)
    "intelmpi": [t for t in COMMON if "test_torch" not in t],
    # The standard ABI's shim: MPICH's libmpi_abi under mpi4py compiled for it (no torch there).
    "mpiabi": ["tests/test_mpi_abi.py", "tests/test_collectives.py"],
}
MPIS = {
    "openmpi": ("SCALEOUT_TEST_VENV_OMPI", "Open MPI"),
    "intelmpi": ("SCALEOUT_TEST_VENV_IMPI", "Intel MPI"),
    "mpiabi": ("SCALEOUT_TEST_VENV_MPIABI", "MPICH"),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mpi", list(MPIS))
def test_the_suite_passes_on(mpi, tmp_path):
    variable, family = MPIS[mpi]
    venv = Path(os.environ.get(variable, "/nonexistent"))
    if not (venv / "bin" / "pytest").exists():
        pytest.skip(
            f"no {family} environment with the wheel and pytest ({variable}; "
            '`eval "$(bash tools/make_mpi_envs.sh DIR)"` makes it)'
        )
    env = {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": "",
        "SCALEOUT_TEST_EXPECT_MPI": family,
        **OPEN_MPI_AS_ROOT,
    }
    # One rank count per test there: 3 ranks (oversubscribed on 2 cores), which takes the
    # paths 2 ranks do and more; the whole suite runs every count on MPICH.
    cmd = [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "-rs"]
    cmd += ["-k", "not np2 and not np4"]
    cmd += [str(ROOT / t) for t in TESTS[mpi]]
    if mpi == "mpiabi":
        env["SCALEOUT_TEST_EXPECT_ABI"] = "mpiabi"
    res = run_job(cmd, f"the suite's part on {family}", 840, env, cwd=tmp_path)
    summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, res.stdout[-3000:]
    assert "skipped" not in summary, f"a test skipped on {family}:\n{res.stdout[-3000:]}"
