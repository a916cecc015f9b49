"""The "scaleout" torch.distributed backend (Note [torch.distributed backend],
docs/torch-distributed.md): its collectives, async work, DDP and FSDP2 training equal to one
process, in jobs started by scaleoutrun with init_process_group("scaleout") and no arguments;
a size or rank other than the job's refused on every rank. Ranks that torchrun or a shell
started, with no MPI launcher, joined through torch's store (Note [PMI bootstrap]), on each MPI
that can (MPICH, Intel MPI) and refused by name on the one that cannot (Open MPI)."""

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import free_port, run_job, run_mpi, scaleoutrun  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "mp" / "torch_distributed.py"
TORCHRUN_SCRIPT = Path(__file__).resolve().parent / "mp" / "torch_torchrun.py"


def _store_env() -> dict:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def test_collectives_and_ddp_through_the_backend(nranks):
    # No MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE from the test: scaleoutrun's.
    env = {"MASTER_ADDR": "", "MASTER_PORT": "", "RANK": "", "WORLD_SIZE": ""}
    proc = scaleoutrun("-np", str(nranks), sys.executable, str(SCRIPT), "run", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("all checks passed") == nranks


@pytest.mark.parametrize("mode", ["bad-size", "bad-rank"])
def test_a_size_or_rank_other_than_the_jobs_is_refused(mode):
    proc = run_mpi("torch_distributed.py", 2, mode, env=_store_env())
    assert proc.stdout.count("all checks passed") == 2


def _torchrun(python: str, n: int, mode: str, env: dict | None = None, *flags: str):
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(n), *flags]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += [str(TORCHRUN_SCRIPT), mode]
    return run_job(cmd, f"torchrun of {n} ranks ({mode})", 180, env)


@pytest.mark.parametrize("n", [2, 3])
def test_torchrun_starts_the_ranks(n):
    proc = _torchrun(sys.executable, n, "ddp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("all checks passed") == n, proc.stdout + proc.stderr[-3000:]


def test_a_killed_torchrun_worker_is_named_by_every_survivor():
    # torchrun ends the other workers once one fails; its monitor looks every 5 s here, so that
    # the survivors' own error (within 5 s of the step's start) is what the test sees first.
    n = 3
    proc = _torchrun(sys.executable, n, "killed", None, "--monitor-interval", "5")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert proc.stdout.count("all checks passed") == n - 1, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count(f"rank {n - 1} (pid") == n - 1, proc.stdout


def test_horovod_style_init_under_torchrun():
    proc = _torchrun(sys.executable, 2, "horovod")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("all checks passed") == 2, proc.stdout + proc.stderr[-3000:]


# Starts argv[3] copies of `python script mode` with torch's variables, as a shell would; the
# first to fail ends the others (a rank left waiting for the store of one that failed would
# otherwise wait out torch's timeout).
LAUNCH = """
import os, subprocess, sys
python, script, mode, n, port = sys.argv[1:6]
procs = [
    subprocess.Popen(
        [python, script, mode],
        env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                 WORLD_SIZE=n),
    )
    for r in range(int(n))
]
codes = {}
while len(codes) < len(procs):
    pid, status = os.wait()
    codes[pid] = os.waitstatus_to_exitcode(status)
    if codes[pid] != 0:
        for p in procs:
            if p.pid not in codes:
                p.kill()
sys.exit(max(abs(c) for c in codes.values()))
"""


@pytest.mark.parametrize("mode", ["ddp", "refused"])
def test_processes_given_torch_variables(mode):
    # "ddp": init_process_group's env:// store joins them; "refused": scaleout.init() has no
    # store to join them through, and must not run them as jobs of one.
    n = 2
    cmd = [sys.executable, "-c", LAUNCH, sys.executable, str(TORCHRUN_SCRIPT), mode, str(n)]
    cmd.append(str(free_port()))
    proc = run_job(cmd, f"{n} processes ({mode})", 120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("all checks passed") == n, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize(
    "variable,family",
    [("SCALEOUT_TEST_VENV_IMPI", "Intel MPI"), ("SCALEOUT_TEST_VENV_OMPI", "Open MPI")],
)
def test_torchrun_on_other_mpis(variable, family):
    """Intel MPI reads PMI-1 as MPICH does; Open MPI does not, and every rank says so."""
    venv = Path(os.environ.get(variable, "/nonexistent"))
    python = venv / "bin" / "python"
    if not (venv / "lib").exists() or not python.exists():
        pytest.skip(f"no {family} environment ({variable}; tools/make_mpi_envs.sh makes it)")
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    proc = _torchrun(str(python), 2, "ddp", env)
    if family == "Intel MPI":
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stdout.count("all checks passed") == 2, proc.stdout + proc.stderr[-3000:]
    else:
        assert proc.returncode != 0, proc.stdout[-3000:]
        refusal = "its MPI is Open MPI"
        assert proc.stderr.count(refusal) >= 2, proc.stderr[-4000:]
        assert "Start the job with scaleoutrun" in proc.stderr, proc.stderr[-4000:]


def test_a_failed_collective_gives_its_turn_back():
    # Pure logic of the backend's names (Note [torch.distributed backend]): a collective that
    # failed everywhere gives its turn back, so the next call of its signature has the name it
    # would have had; one whose signature was called again meanwhile leaves the group's names
    # out of step, and every later call raises rather than pair up with another rank's wrong one.
    import torch.distributed as dist

    import scaleout
    from scaleout.torch._process_group import _WINDOW, _Names

    names = _Names("torch.g")
    sig = ("allreduce", "float32", 4)
    first, first_turn = names.take(sig)
    second, second_turn = names.take(sig)
    assert first != second and first.startswith("torch.g.allreduce.")
    names.failed([second_turn], scaleout.DeadlockError("deadlock"))
    assert names.take(sig)[0] == second
    assert len({names.take(sig)[0] for _ in range(3 * _WINDOW)}) == _WINDOW  # names come round
    names.failed([first_turn], scaleout.DeadlockError("deadlock"))
    with pytest.raises(dist.DistBackendError, match="can no longer be matched"):
        names.take(sig)
    with pytest.raises(scaleout.MismatchError):
        names.one_off("alltoall")
