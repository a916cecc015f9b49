"""Collectives on real MPI ranks (2 and 4, the latter oversubscribing this 2-core machine)."""
from conftest import run_mpi


def test_every_collective_op_and_dtype(nranks):
    proc = run_mpi("collectives.py", nranks)
    assert proc.stdout.count("all checks passed") == nranks
