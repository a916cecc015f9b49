"""Elastic training with TensorFlow and Keras (scaleout.tensorflow.elastic,
scaleout.tensorflow.keras.elastic): the states, the Keras callbacks, and restarts after a rank
dies, under scaleoutrun's elastic driver (Note [Elastic driver])."""

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from _elastic_job import ElasticJob  # noqa: E402
from conftest import MP, run_mpi  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_states_commit_restore_sync_and_resume_at_another_size(tmp_path):
    """Phase 1 on 3 ranks: commit, restore and sync of KerasState (model, Adam's slots,
    attributes; top-k residuals, seed states and aggregation sums per rank), TensorFlowState
    (eager and TF1), ObjectState; durable commits. Phase 2 on 2 fresh ranks resumes the last
    commit and takes the step the committed optimizer would."""
    # The script checks that a restored state takes the same update again bit for bit. At 3 ranks
    # a sum's bits depend on which rank reduces each element (its own block first, see
    # Note [Staged allreduce]), which depends on where fusion put the element: each tensor
    # travels alone here so that the same update is the same arithmetic.
    for phase, np_ in (("first", 3), ("second", 2)):
        proc = run_mpi(
            "tf_elastic_state.py", np_, phase, str(tmp_path), env={"SCALEOUT_FUSION_THRESHOLD": "0"}
        )
        assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


def test_keras_callbacks_commit_count_and_shorten_the_resumed_epoch():
    proc = run_mpi("tf_elastic_callbacks.py", 2)
    assert proc.stdout.count("all checks passed") == 2, proc.stdout + proc.stderr


def _result(stdout):
    found = re.search(r"RESULT (.*)", stdout)
    assert found, stdout
    return json.loads(found.group(1))


def test_a_killed_rank_stops_keras_fit_and_two_ranks_finish_it(tmp_path):
    """Under scaleoutrun's elastic driver, generation 0 at 3 ranks: rank 2 dies (SIGKILL) after
    batch 3 of epoch 1, before that batch's commit; the survivors stop for a restart.
    Generation 1 at 2 ranks resumes from the commit after batch 2 of epoch 1 (9 optimizer
    steps), runs that epoch's remaining 6 - 2 batches (Horovod's count: batch 2 again) and the
    last epoch, and ends with the same weights on every rank."""
    job = ElasticJob(
        tmp_path,
        "localhost:2\n127.0.0.1:1\n",
        ["-np", "3", "--min-np", "2"],
        [sys.executable, str(MP / "tf_elastic_train.py")],
        env={"KILL": "2:1:3"},
    )
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert "ranks 0 (on localhost), 1 (on localhost) stopped for a restart" in done.stderr
    result = _result(done.stdout)
    assert result["sizes"] == [3, ["reset", 2, 1, 2, 9], 2], result
    assert result["batches"] == [4, 6], result  # this generation's epochs
    assert (result["epoch"], result["batch"], result["iterations"]) == (3, 0, 19), result
    assert result["same_weights"], result


def test_elastic_keras_digits_example_survives_a_lost_rank(tmp_path):
    """The example under scaleoutrun's elastic driver: 3 ranks, one of which is killed from
    outside once commit 6 is complete; the job goes on at 2 ranks from the last commit and
    finishes the training, which learns."""
    pytest.importorskip("sklearn")
    job = ElasticJob(
        tmp_path,
        "localhost:2\n127.0.0.1:1\n",
        ["-np", "3", "--min-np", "2"],
        [sys.executable, str(EXAMPLES / "elastic_keras_digits.py")],
    )
    job.wait_for_commit(6)
    job.kill_rank(2, generation=0)
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert done.stderr.count("stopped for a restart") == 1, job.output()  # one line, 2 ranks
    assert "generation 1: 2 ranks on localhost:2" in done.stderr
    assert re.search(r"resumed at epoch \d+, batch \d+ on 2 ranks", done.stdout), done.stdout
    found = re.search(r"ranks: 2, test accuracy: ([0-9.]+)", done.stdout)
    assert found, job.output()
    assert float(found.group(1)) >= 0.9
