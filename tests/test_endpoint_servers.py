"""Endpoint servers (Note [Endpoint servers]): K = 1, 2, 3 give identical results."""
import pytest

from conftest import run_mpi


@pytest.mark.parametrize("k", [1, 2, 3])
def test_results_identical_for_any_number_of_endpoint_servers(k, nranks):
    # The servers split MPI allreduces; on one machine allreduces otherwise go through shared
    # memory, so the test turns that off.
    proc = run_mpi("endpoints.py", nranks, str(k),
                   env={"SCALEOUT_EP_SERVERS": str(k), "SCALEOUT_SHM": "0"})
    assert proc.stdout.count("all checks passed") == nranks


@pytest.mark.parametrize("variable", ["SCALEOUT_EP_SERVERS", "SCALEOUT_SHM", "SCALEOUT_SHM_AREA"])
def test_ranks_must_agree_on_how_they_communicate(variable):
    proc = run_mpi("setting_mismatch.py", 2, variable, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"{variable} differs across ranks") == 2, proc.stdout + proc.stderr
