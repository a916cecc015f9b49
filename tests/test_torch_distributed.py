"""The "scaleout" torch.distributed backend (Note [torch.distributed backend],
docs/torch-distributed.md): its collectives, async work, DDP and FSDP2 training equal to one
process, in jobs started by scaleoutrun with init_process_group("scaleout") and no arguments;
a size or rank other than the job's refused on every rank."""

import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import run_mpi, scaleoutrun  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "mp" / "torch_distributed.py"


def _store_env() -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


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
