"""Endpoint servers (Note [Endpoint servers]): K = 1, 2, 3 give identical results."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("k", [1, 2, 3])
def test_results_identical_for_any_number_of_endpoint_servers(k, nranks):
    # The servers split MPI allreduces; on one machine allreduces otherwise go through shared
    # memory, so the test turns that off.
    proc = run_mpi(
        "endpoints.py", nranks, str(k), env={"SCALEOUT_EP_SERVERS": str(k), "SCALEOUT_SHM": "0"}
    )
    assert proc.stdout.count("all checks passed") == nranks


@pytest.mark.parametrize(
    "variable, ranks, names",
    [
        ("SCALEOUT_EP_SERVERS", 2, "1 on rank 0; 2 on rank 1"),
        ("SCALEOUT_SHM", 2, "0 on rank 0; 1 on rank 1"),
        ("SCALEOUT_SHM_AREA", 2, "4096 on rank 0; 8192 on rank 1"),
        ("SCALEOUT_HIERARCHICAL_ALLREDUCE", 3, "auto on rank 0; 0 on rank 1; 1 on rank 2"),
        ("SCALEOUT_HIERARCHICAL_ALLGATHER", 3, "auto on rank 1; 0 on ranks 0, 2"),
    ],
)
def test_ranks_must_agree_on_how_they_communicate(variable, ranks, names):
    # Every rank is told, with who has which value.
    proc = run_mpi("setting_mismatch.py", ranks, variable, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"{variable} differs across ranks ({names})") == ranks, (
        proc.stdout + proc.stderr
    )
