"""Error paths, join, shutdown and re-init, and a crashing rank, on real ranks."""

import time

import pytest
from conftest import run_mpi


def test_mismatches_and_bad_input_raise_on_every_rank(nranks):
    proc = run_mpi("errors.py", nranks)
    assert proc.stdout.count("all checks passed") == nranks


def test_join_with_uneven_steps(nranks):
    proc = run_mpi("join.py", nranks)
    assert proc.stdout.count("all checks passed") == nranks


def test_shutdown_and_init_again(nranks):
    proc = run_mpi("lifecycle.py", nranks)
    assert proc.stdout.count("all checks passed") == nranks


def test_a_crashing_rank_ends_the_job(nranks):
    start = time.monotonic()
    proc = run_mpi("crash.py", nranks, timeout=60, check=False)
    assert proc.returncode != 0
    assert "unreachable" not in proc.stdout
    assert time.monotonic() - start < 30


def test_stalled_collective_is_reported_with_the_missing_rank(nranks):
    proc = run_mpi("stall.py", nranks, env={"SCALEOUT_STALL_CHECK_TIME_SECONDS": "1"})
    assert proc.stdout.count("all checks passed") == nranks
    last = nranks - 1
    assert "allreduce 'late.tensor' has waited" in proc.stderr
    assert f"still missing on rank {last}" in proc.stderr
    # every rank names the missing rank, not rank 0 only
    for rank in range(nranks):
        assert f"WARNING (rank {rank}): allreduce 'late.tensor' has waited" in proc.stderr, rank


def test_ctrl_c_interrupts_a_blocked_wait():
    proc = run_mpi("interrupt.py", 2, timeout=60)
    assert "interrupted while waiting" in proc.stdout


@pytest.mark.parametrize("np_", [3], ids=["np3"])  # TensorFlow's front end: conftest.one_size
def test_bad_arguments_are_invalid_argument_errors_in_every_front_end(np_):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    proc = run_mpi("bad_arguments.py", np_, timeout=240)
    assert proc.stdout.count("all checks passed") == np_
