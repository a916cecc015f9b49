"""Deadlock detection on real ranks (tests/mp/deadlock.py), numpy and torch front ends, at 2 and
3 ranks. The subprocess timeout is the hang guard: without detection these scripts never end."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("front", ["numpy", "torch"])
@pytest.mark.parametrize("nranks", [2, 3], ids=["np2", "np3"])
def test_deadlocks_are_reported_on_every_rank_and_the_job_goes_on(nranks, front):
    if front == "torch":
        pytest.importorskip("torch")
    proc = run_mpi(
        "deadlock.py", nranks, front, timeout=180, env={"SCALEOUT_STALL_CHECK_TIME_SECONDS": "60"}
    )
    assert proc.stdout.count("all checks passed") == nranks
    assert "deadlock: every rank is waiting" in proc.stderr  # rank 0 logs it too
