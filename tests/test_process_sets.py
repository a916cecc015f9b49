"""Process sets on the numpy-level API (tests/mp/process_sets.py): disjoint sets running
concurrently, an overlapping set, a set of one rank (at 3 ranks), sets registered at init and
added and removed later, and the errors (not a member, a root outside the set, a removed set, a
busy set's removal, a duplicate, a mismatch inside a set), through shared memory and MPI."""
import pytest

from conftest import run_mpi


@pytest.mark.parametrize("shm", ["1", "0"], ids=["shm", "mpi"])
@pytest.mark.parametrize("nranks", [3, 4], ids=["np3", "np4"])
def test_process_sets(nranks, shm):
    proc = run_mpi("process_sets.py", nranks, env={"SCALEOUT_SHM": shm}, timeout=120)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
