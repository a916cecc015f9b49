"""TorchState (groundwork of issue 14): commit, restore, sync, host-update interrupts, reset
callbacks; a job resumes from another job's durable commit at another number of ranks."""

import pytest

pytest.importorskip("torch")

from conftest import MP, run_mpi  # noqa: E402


@pytest.mark.parametrize("first, second", [(3, 2), (2, 3)])
def test_state_commits_restores_and_resumes_at_another_size(tmp_path, first, second):
    for phase, np_ in (("first", first), ("second", second)):
        proc = run_mpi("torch_elastic_state.py", np_, phase, str(tmp_path))
        assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


def test_a_killed_rank_stops_the_generation_and_the_next_one_resumes(tmp_path):
    """Note [Elastic restarts], under scaleoutrun's elastic driver: generation 0 at 3 ranks
    loses rank 2 (SIGKILL) before its 4th commit; the survivors stop for a restart; generation
    1 at 2 ranks resumes from the last commit and finishes the epoch: every sample trained once
    in committed batches (padding aside), the reset callback saw the new size."""
    import json
    import re
    import sys

    from _elastic_job import ElasticJob

    job = ElasticJob(
        tmp_path,
        "localhost:2\n127.0.0.1:1\n",
        ["-np", "3", "--min-np", "2"],
        [sys.executable, str(MP / "elastic_train.py")],
        env={"KILL": "2:3"},
    )
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert "ranks 0 (on localhost), 1 (on localhost) stopped for a restart" in done.stderr
    result = json.loads(re.search(r"RESULT (.*)", done.stdout).group(1))
    seen = result["seen"]
    assert sorted(set(seen)) == list(range(96)), seen
    assert len(seen) - len(set(seen)) <= 1  # at 2 ranks: at most one sample of padding
    assert result["sizes"] == [3, ["reset", 2], 2], result["sizes"]
