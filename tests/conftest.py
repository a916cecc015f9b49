"""The one harness that starts jobs and processes for the tests: a script under MPI with N real
processes (run_mpi), scaleoutrun (scaleoutrun, SCALEOUTRUN for runs elsewhere), a fresh Python
(run_python), and the programs and stand-ins the launcher tests hand it (rank_program,
fake_mpiexec). Every run is bounded by a timeout that fails the test and ends every process the
run started."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MP = TESTS / "mp"

# The launcher as `python -m` runs it; a list, for the tests that start it elsewhere (another
# host's namespace, another runner).
SCALEOUTRUN_MODULE = "scaleout.launcher.main"
SCALEOUTRUN = [sys.executable, "-m", SCALEOUTRUN_MODULE]
SCALEOUTRUN_LIMIT = 60  # seconds one scaleoutrun may take unless a test says otherwise

# A rank's number in a rank program, under any MPI's launcher, before scaleout is imported.
RANK = 'int(os.environ.get("PMI_RANK") or os.environ["OMPI_COMM_WORLD_RANK"])'


def mpiexec() -> str:
    for candidate in (Path(sys.executable).parent / "mpiexec", shutil.which("mpiexec")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.skip("no mpiexec found (pip install mpich)")


# Open MPI's launchers refuse root without the first two, and more ranks than cores without the
# last (tests that run jobs on Open MPI: tests/test_wheel.py, tests/test_other_mpis.py).
OPEN_MPI_AS_ROOT = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}


# PRRTE (Open MPI 5's launcher) sometimes fails to start its PMIx server here, before any rank
# starts: seen once in a fresh-clone CI (2026-11-26), in test_other_mpis.py's Open MPI part after
# the namespace tests; reported elsewhere too (lfortran#8610). run_mpi tries such a job again.
LAUNCHER_DID_NOT_START = "The PMIx server's listener thread failed to start"


def survivor_flags() -> list[str]:
    """mpiexec()'s flags that keep the other ranks running when one dies (Hydra's
    -disable-auto-cleanup, PRRTE's recoverable runtime: Note [Launcher flavours])."""
    from scaleout.launcher.mpi_launcher import probe_family, survivor_args

    return list(survivor_args(probe_family(mpiexec())))


def run_job(
    cmd: list, what: str, timeout: float, env: dict | None = None, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """Runs a command that starts ranks (mpiexec, scaleoutrun) with the tests' environment; a
    hang fails the test after `timeout` s, ending every process the command started."""
    full_env = dict(os.environ)
    full_env.setdefault("SCALEOUT_STALL_CHECK_TIME_SECONDS", "20")
    full_env.update(env or {})
    # A session of its own, so that a hang can be ended with every rank it started; no stdin,
    # so that a rank reading it ends instead of waiting on the terminal.
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        pytest.fail(f"{what} did not finish in {timeout} s (a hang)\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def run_mpi(
    script: str,
    np: int,
    *args: str,
    timeout: float = 120,
    env: dict | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Runs tests/mp/<script> on `np` ranks; fails the test with the output if a rank fails."""
    cmd = [mpiexec(), "-n", str(np), sys.executable, str(MP / script), *args]
    proc = run_job(cmd, f"{script} on {np} ranks", timeout, env)
    for _ in range(2):
        if proc.returncode == 0 or LAUNCHER_DID_NOT_START not in proc.stderr:
            break
        # Open MPI's launcher failed before starting any rank (nothing of ours ran): again.
        proc = run_job(cmd, f"{script} on {np} ranks", timeout, env)
    if check and proc.returncode != 0:
        pytest.fail(
            f"{script} on {np} ranks exited {proc.returncode}\n--- stdout\n{proc.stdout}"
            f"\n--- stderr\n{proc.stderr}"
        )
    return proc


def scaleoutrun(
    *args: str,
    env: dict | None = None,
    cwd: str | Path | None = None,
    timeout: float = SCALEOUTRUN_LIMIT,
    installed: bool = False,
) -> subprocess.CompletedProcess:
    """Runs scaleoutrun with `args` (python -m, or with `installed` the console script beside
    this Python, skipping the test where it is not installed); returns what it exited with and
    wrote. The caller checks the exit code: many tests expect a failure."""
    if installed:
        launcher = Path(sys.executable).parent / "scaleoutrun"
        if not launcher.exists():
            pytest.skip("scaleoutrun is not installed beside this Python")
        cmd = [str(launcher), *args]
    else:
        cmd = [*SCALEOUTRUN, *args]
    return run_job(cmd, f"scaleoutrun {' '.join(args)}", timeout, env, cwd)


def run_python(
    code: str, *args: str, env: dict | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python (`python -c code args`), for what only a new process shows:
    what an import starts, a failure before init. The caller checks the exit code."""
    return run_job([sys.executable, "-c", code, *args], "python -c <code>", timeout, env)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, for a server a test's processes start (torch's store):
    below the kernel's ephemeral range, so that no connection another test opens meanwhile can
    be given it (a port the kernel picks with bind(0) comes from that range), above Ray's
    default worker ports (10002-19999) where the range leaves room, and chosen at random, so
    that two tests running at once (pytest-xdist) do not pick the same one."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = max(20000, low - 8192) if low > 21000 else 1024
    for _ in range(100):
        port = random.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {low} on 127.0.0.1")


def rank_program(tmp_path: Path, body: str) -> str:
    """Writes `body` (dedented) as the program every rank of a launcher test runs."""
    path = tmp_path / "rank_program.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def fake_mpiexec(tmp_path: Path, body: str) -> str:
    """A stand-in for the MPI's launcher that says it is Hydra and then runs the shell `body`."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/sh\n"
        "if [ \"$1\" = --version ]; then echo 'HYDRA build details:'; exit 0; fi\n" + body
    )
    fake.chmod(0o755)
    return str(fake)


# Two ranks, and three (oversubscribed on a 2-core machine, and not a power of two): a fourth
# rank adds a quarter to each job's time; the tests that need four (2x2 hosts, two disjoint
# pairs, Adasum's power-of-two levels) choose their own counts.
@pytest.fixture(params=[2, 3], ids=lambda n: f"np{n}")
def nranks(request) -> int:
    return request.param


def one_size(n: int):
    """For a test of a framework's front end: `nranks` is n alone. Those tests run at one size
    each, 2 or 3 ranks in turn (TensorFlow's: tests/test_tensorflow*.py, test_one_path,
    test_topk, test_adasum, test_errors_and_lifecycle's every-front-end test; torch's training
    tests in test_torch, test_topk and test_dlrm), so that every size runs each front end's
    paths while CI stays within its time: importing TensorFlow costs each rank about 6.5 s of
    CPU on this 2-core machine, torch 2.7 s and its first optimizer 2 s more. The core under
    them runs at both sizes in the numpy tests, and torch's collectives, semantics and errors at
    both in test_torch."""
    return pytest.mark.parametrize("nranks", [n], ids=[f"np{n}"])
