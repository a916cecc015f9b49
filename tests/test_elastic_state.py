"""TorchState (groundwork of issue 14): commit, restore, sync, host-update interrupts, reset
callbacks; a job resumes from another job's durable commit at another number of ranks."""
import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("first, second", [(3, 2), (2, 3)])
def test_state_commits_restores_and_resumes_at_another_size(tmp_path, first, second):
    for phase, np_ in (("first", first), ("second", second)):
        proc = run_mpi("torch_elastic_state.py", np_, phase, str(tmp_path))
        assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr
