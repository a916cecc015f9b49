"""Collectives on real MPI ranks (2 and 4, the latter oversubscribing this 2-core machine)."""

import pytest
from conftest import run_mpi, run_python

# The allreduce data paths on one machine: shared memory (with its default staging area, and
# with the smallest, so that every tensor but the tiniest takes several rounds), and MPI.
PATHS = {"shm": {}, "shm-4KiB-rounds": {"SCALEOUT_SHM_AREA": "4096"}, "mpi": {"SCALEOUT_SHM": "0"}}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_collective_op_and_dtype(nranks, path):
    proc = run_mpi("collectives.py", nranks, "mpi" if path == "mpi" else "shm", env=PATHS[path])
    assert proc.stdout.count("all checks passed") == nranks


def test_without_room_for_shared_memory_allreduces_go_through_mpi(nranks):
    # Staging areas of 1 TB each cannot be reserved in /dev/shm: every rank says so and goes on.
    proc = run_mpi("collectives.py", nranks, "mpi", env={"SCALEOUT_SHM_AREA": "1e12"})
    assert proc.stdout.count("all checks passed") == nranks
    assert "shared memory unavailable (reserving " in proc.stderr, proc.stderr
    assert proc.stderr.count("shared memory unavailable") == nranks, proc.stderr


def test_sub_communicator_user_mpi_threads_and_buffer_inputs(nranks):
    proc = run_mpi("comm_and_buffers.py", nranks)
    assert proc.stdout.count("all checks passed") == nranks


def test_missing_mpi_gives_one_clear_message():
    """With mpi4py unimportable, init() names what is missing and how to install it."""
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "import scaleout\n"
        "try:\n    scaleout.init()\n"
        "except scaleout.MPINotFoundError as e:\n    print('MESSAGE', e)\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "MESSAGE" in out.stdout and "pip install mpich mpi4py" in out.stdout
    assert "Traceback" not in out.stderr
