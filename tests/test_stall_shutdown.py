"""SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS (or HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): a collective
that a rank never submits fails on every rank, naming the tensor and the missing rank, instead of
waiting forever (Note [Stall shutdown])."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize(
    "nranks,prefix",
    [(2, "SCALEOUT"), (3, "HOROVOD")],
    ids=["np2-scaleout-vars", "np3-horovod-vars"],
)
def test_a_skipped_collective_fails_on_every_rank_after_the_shutdown_time(nranks, prefix):
    # Every rank waits here, which deadlock detection would end first (Note [Deadlock]): turned
    # off, so that the stall shutdown is what ends it.
    env = {
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": "",
        f"{prefix}_STALL_CHECK_TIME_SECONDS": "1",
        f"{prefix}_STALL_SHUTDOWN_TIME_SECONDS": "2",
        "SCALEOUT_DEADLOCK_CHECK_SECONDS": "0",
    }
    proc = run_mpi("stall_shutdown.py", nranks, env=env, timeout=90)
    assert proc.stdout.count("all checks passed") == nranks
    logged = [
        line for line in proc.stderr.splitlines() if "ERROR" in line and "stall shutdown" in line
    ]
    assert len(logged) == 1 and "(rank 0)" in logged[0], proc.stderr
    assert f"{prefix}_STALL_SHUTDOWN_TIME_SECONDS=2 s" in logged[0]


def test_no_stall_shutdown_when_the_check_is_disabled():
    # With the check off nothing shuts down (Horovod's rule), so the late rank still completes.
    env = {
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": "1",
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": "1",
        "SCALEOUT_STALL_CHECK_DISABLE": "1",
    }
    proc = run_mpi("stall.py", 2, env=env)
    assert proc.stdout.count("all checks passed") == 2
    assert "has waited" not in proc.stderr and "stall shutdown" not in proc.stderr
