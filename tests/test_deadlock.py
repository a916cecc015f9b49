"""Deadlock detection on real ranks (tests/mp/deadlock.py), the numpy front end at 2 and 3 ranks
and torch's at 3. The subprocess timeout is the hang guard: without detection these scripts
never end."""

import pytest
from conftest import run_mpi


# The detection is the core's; the torch front end's submit path at 3 ranks.
@pytest.mark.parametrize(
    "nranks,front",
    [(2, "numpy"), (3, "numpy"), (3, "torch")],
    ids=["np2-numpy", "np3-numpy", "np3-torch"],
)
def test_deadlocks_are_reported_on_every_rank_and_the_job_goes_on(nranks, front):
    if front == "torch":
        pytest.importorskip("torch")
    proc = run_mpi(
        "deadlock.py", nranks, front, timeout=180, env={"SCALEOUT_STALL_CHECK_TIME_SECONDS": "60"}
    )
    assert proc.stdout.count("all checks passed") == nranks
    assert "deadlock: every rank is waiting" in proc.stderr  # rank 0 logs it too
