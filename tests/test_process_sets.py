"""Process sets on the numpy-level API (tests/mp/process_sets.py): disjoint sets running
concurrently, an overlapping set, a set of one rank (at 3 ranks), sets registered at init and
added and removed later, and the errors (not a member, a root outside the set, a removed set, a
busy set's removal, a duplicate, a mismatch inside a set), through shared memory and MPI; the
same through scaleout.torch (tests/mp/torch_process_sets.py, at 3 ranks)."""

import pytest
from conftest import run_mpi, run_python


@pytest.mark.parametrize("shm", ["1", "0"], ids=["shm", "mpi"])
@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_process_sets(nranks, shm):
    proc = run_mpi("process_sets.py", nranks, env={"SCALEOUT_SHM": shm}, timeout=120)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_process_sets_from_communicators_at_init_only(nranks):
    proc = run_mpi("process_sets_static.py", nranks, timeout=60)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


def test_a_set_given_twice_at_init_is_a_value_error(nranks):
    proc = run_mpi("process_sets_duplicate.py", nranks, timeout=60)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


def test_importing_scaleout_does_not_start_mpi():
    # scaleoutrun imports the package; MPI must start only in the ranks, at init (making
    # global_process_set once started MPI at import).
    code = "import sys, scaleout; print('mpi4py.MPI' in sys.modules)"
    out = run_python(code)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("nranks", [3], ids=["np3"])  # 4 (two pairs): the numpy test's
def test_torch_on_process_sets(nranks):
    # Every torch collective and its gradient on a set, DistributedOptimizer and the broadcast
    # helpers on two disjoint sets at once, and Horovod's local step outside the set.
    proc = run_mpi("torch_process_sets.py", nranks, timeout=120)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_a_stall_inside_a_set_is_reported_on_its_ranks_naming_job_ranks(nranks):
    # The set is ranks 1..n-1; its last rank is late; rank 0, outside, goes on undisturbed.
    proc = run_mpi("stall.py", nranks, "set", env={"SCALEOUT_STALL_CHECK_TIME_SECONDS": "1"})
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
    early = list(range(1, nranks - 1))
    submitted = f"submitted by rank{'s' if len(early) > 1 else ''} " + ", ".join(map(str, early))
    where = (
        f"(in process set 1, whose ranks {', '.join(map(str, range(nranks - 1)))} are "
        f"ranks {', '.join(map(str, range(1, nranks)))} of the job)"
    )
    lines = proc.stderr.splitlines()
    for rank in range(1, nranks):
        assert any(
            f"WARNING (rank {rank}): allreduce 'late.tensor' has waited" in line
            and f"{submitted}, still missing on rank {nranks - 1} " in line
            and line.endswith(where)
            for line in lines
        ), (rank, proc.stderr)
    assert "WARNING (rank 0)" not in proc.stderr, proc.stderr
