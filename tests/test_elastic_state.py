"""TorchState (groundwork of issue 14): commit, restore, sync, host-update interrupts, reset
callbacks; a job resumes from another job's durable commit at another number of ranks."""
import pytest

pytest.importorskip("torch")

from conftest import MP, mpiexec, run_job, run_mpi  # noqa: E402


@pytest.mark.parametrize("first, second", [(3, 2), (2, 3)])
def test_state_commits_restores_and_resumes_at_another_size(tmp_path, first, second):
    for phase, np_ in (("first", first), ("second", second)):
        proc = run_mpi("torch_elastic_state.py", np_, phase, str(tmp_path))
        assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


def test_a_killed_rank_stops_the_generation_and_the_next_one_resumes(tmp_path):
    """Note [Elastic restarts], the worker's side, with the test as the driver: generation 0 at
    3 ranks loses rank 2 (SIGKILL) before its 4th commit; the survivors stop with the restart
    code; generation 1 at 2 ranks resumes from the last commit and finishes the epoch: every
    sample trained once in committed batches (padding aside), the reset callback saw the new
    size."""
    import json
    import re
    env = {"SCALEOUT_ELASTIC_JOB": "test", "SCALEOUT_ELASTIC_DIR": str(tmp_path)}
    # Without -disable-auto-cleanup, MPICH's launcher kills the survivors as soon as one rank
    # dies, often before they see the death (the elastic driver will pass it too). The script
    # records the code each rank's os._exit is given (the launcher may drop a rank's last line).
    import sys
    exits_file = tmp_path / "exits.txt"
    first = run_job([mpiexec(), "-disable-auto-cleanup", "-n", "3", sys.executable,
                     str(MP / "elastic_train.py")], "generation 0 on 3 ranks", 120,
                    {**env, "KILL": "2:3", "EXITS_FILE": str(exits_file)})
    assert first.returncode != 0
    # the survivors stop for a restart (75); rank 2, killed, records nothing
    assert sorted(exits_file.read_text().split("\n")[:-1]) == ["0 75", "1 75"], \
        first.stdout + first.stderr
    second = run_mpi("elastic_train.py", 2, env=env)
    result = json.loads(re.search(r"RESULT (.*)", second.stdout).group(1))
    seen = result["seen"]
    assert sorted(set(seen)) == list(range(96)), seen
    assert len(seen) - len(set(seen)) <= 1  # at 2 ranks: at most one sample of padding
    assert result["sizes"] == [3, ["reset", 2], 2], result["sizes"]
