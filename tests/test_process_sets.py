"""Process sets on the numpy-level API (tests/mp/process_sets.py): disjoint sets running
concurrently, an overlapping set, a set of one rank (at 3 ranks), sets registered at init and
added and removed later, and the errors (not a member, a root outside the set, a removed set, a
busy set's removal, a duplicate, a mismatch inside a set), through shared memory and MPI; the
same through scaleout.torch (tests/mp/torch_process_sets.py)."""
import pytest

from conftest import run_mpi


@pytest.mark.parametrize("shm", ["1", "0"], ids=["shm", "mpi"])
@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_process_sets(nranks, shm):
    proc = run_mpi("process_sets.py", nranks, env={"SCALEOUT_SHM": shm}, timeout=120)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_process_sets_from_communicators_at_init_only(nranks):
    proc = run_mpi("process_sets_static.py", nranks, timeout=60)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


def test_importing_scaleout_does_not_start_mpi():
    # scaleoutrun imports the package; MPI must start only in the ranks, at init (making
    # global_process_set once started MPI at import).
    import subprocess
    import sys
    code = "import sys, scaleout; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_torch_on_process_sets(nranks):
    # Every torch collective and its gradient on a set, DistributedOptimizer and the broadcast
    # helpers on two disjoint sets at once, and Horovod's local step outside the set.
    proc = run_mpi("torch_process_sets.py", nranks, timeout=120)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
