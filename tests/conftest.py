"""Shared test helpers: running a script under MPI with N real processes."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MP = TESTS / "mp"


def mpiexec() -> str:
    for candidate in (Path(sys.executable).parent / "mpiexec", shutil.which("mpiexec")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.skip("no mpiexec found (pip install mpich)")


def run_job(cmd: list, what: str, timeout: float, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """Runs a command that starts ranks (mpiexec, scaleoutrun) with the tests' environment; a
    hang fails the test after `timeout` s, ending every process the command started."""
    full_env = dict(os.environ)
    full_env.setdefault("SCALEOUT_STALL_CHECK_TIME_SECONDS", "20")
    full_env.update(env or {})
    # A session of its own, so that a hang can be ended with every rank it started.
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=full_env, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        pytest.fail(f"{what} did not finish in {timeout} s (a hang)\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def run_mpi(script: str, np: int, *args: str, timeout: float = 120, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Runs tests/mp/<script> on `np` ranks; fails the test with the output if a rank fails."""
    cmd = [mpiexec(), "-n", str(np), sys.executable, str(MP / script), *args]
    proc = run_job(cmd, f"{script} on {np} ranks", timeout, env)
    if check and proc.returncode != 0:
        pytest.fail(f"{script} on {np} ranks exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                    f"\n--- stderr\n{proc.stderr}")
    return proc


@pytest.fixture(params=[2, 4], ids=lambda n: f"np{n}")
def nranks(request) -> int:
    return request.param
