"""Elastic training end to end on this machine: scaleoutrun's elastic driver (Note [Elastic
driver]) running examples/elastic_pytorch_digits.py on real ranks, with `kill -9` from outside.

localhost, 127.0.0.1 and this machine's name are three names of one machine, which MPICH's
launcher and scaleoutrun treat as separate hosts: a rank killed on one of them gets that host
blacklisted, as on a cluster, and the job goes on on the others. The two-host version with
real network namespaces is tests/test_multihost_elastic.py.

Every job counts, in its committed state, how often each training sample was trained on: after
restarts every sample must have been trained on once per epoch (a few once more: the padding
that gives every rank the same number of batches)."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from _elastic_job import EXAMPLE, ElasticJob, digits_result  # noqa: E402
from conftest import scaleoutrun  # noqa: E402

EPOCHS = 4
MP = Path(__file__).resolve().parent / "mp"


def example(*args: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--count-samples", "--epochs", str(EPOCHS), *args]


def check_every_sample_trained(stdout: str, most_ranks: int, reshards: int) -> float:
    """Every sample trained on EPOCHS times, but for padding: at most most_ranks - 1 samples
    per sharding of an epoch (one per epoch, one more per restart). Returns the accuracy."""
    accuracy, counts = digits_result(stdout)
    assert min(counts) == EPOCHS, counts
    extra = sum((times - EPOCHS) * samples for times, samples in counts.items())
    assert extra <= (most_ranks - 1) * (EPOCHS + reshards), counts
    return accuracy


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> float:
    """The same elastic job at 3 ranks with no failure: its accuracy."""
    job = ElasticJob(
        tmp_path_factory.mktemp("undisturbed"),
        "localhost:2\n127.0.0.1:1\n",
        ["-np", "3", "--min-np", "2"],
        example(),
    )
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert "generation 1" not in done.stderr, job.output()
    assert not job.store.exists() or not any(job.store.iterdir()), "commits left after success"
    return check_every_sample_trained(done.stdout, 3, 0)


def test_a_killed_rank_leaves_and_the_job_finishes_at_two(tmp_path, undisturbed):
    job = ElasticJob(
        tmp_path, "localhost:2\n127.0.0.1:1\n", ["-np", "3", "--min-np", "2"], example()
    )
    job.wait_for_commit(12)  # mid-epoch: an epoch is about 29 batches at 3 ranks
    job.kill_rank(2, generation=0)
    done = job.finish()
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert "rank 2 (on 127.0.0.1, was killed by SIGKILL) failed" in err, job.output()
    assert "blacklisted 127.0.0.1 for good" in err
    assert "generation 1: 2 ranks on localhost:2" in err
    assert "2 ranks at the end" in done.stdout
    accuracy = check_every_sample_trained(done.stdout, 3, 1)
    assert abs(accuracy - undisturbed) <= 0.03, (accuracy, undisturbed)


def test_rank_0_killed(tmp_path):
    # rank 0 alone on 127.0.0.1: when it dies, ranks 0 and 1 go on on localhost. Autotuning is
    # on (Note [Autotune]): its tuner dies with rank 0, and the next generation's rank 0 tunes
    # afresh, its log beginning again.
    log = tmp_path / "autotune.csv"
    tune = ["--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples", "0"]
    tune += ["--autotune-steps-per-sample", "1", "--autotune-bayes-opt-max-samples", "4"]
    job = ElasticJob(
        tmp_path, "127.0.0.1:1\nlocalhost:2\n", ["-np", "3", "--min-np", "2", *tune], example()
    )
    job.wait_for_commit(8)
    job.kill_rank(0, generation=0)
    # Note [horovodrun's rank variables]: the survivors keep their worker's HOROVOD_RANK and
    # HOROVOD_HOSTNAME (Horovod's identity of a worker) while their rank becomes 0 and 1; the
    # generation's size is theirs.
    for rank, number in ((0, "1"), (1, "2")):
        mine = job.rank_variables(rank, generation=1)
        names = ("RANK", "HOSTNAME", "SIZE", "LOCAL_RANK", "ELASTIC")
        got = [mine.get(f"HOROVOD_{name}") for name in names]
        assert got == [number, "localhost", "2", str(rank), "1"], (rank, mine)
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert "rank 0 (on 127.0.0.1, was killed by SIGKILL) failed" in done.stderr, job.output()
    assert "generation 1: 2 ranks on localhost:2" in done.stderr
    check_every_sample_trained(done.stdout, 3, 1)
    # Each generation's rank 0 tuned (4 samples of 1 step) and said so; the log is the last one's
    # (a header, 4 samples, the kept row).
    before, after = done.stderr.split("generation 1: 2 ranks on localhost:2", 1)
    assert "autotune: done after 4 steps" in before and "autotune: done after 4 steps" in after
    rows = log.read_text().splitlines()
    assert rows[0].startswith("hierarchical_allreduce,") and len(rows) == 6, rows


@pytest.mark.parametrize("np_", [3, 2], ids=["np3", "np2-hostname"])
def test_a_worker_that_raises_is_a_failure_of_its_host(tmp_path, np_):
    """As in Horovod: the host of a worker that raises is blacklisted and the others go on.
    The script picks the raising worker by HOROVOD_RANK, which stays the worker's through the
    restart: with the generation's rank instead, the next generation's rank 0 would raise too,
    and with both hosts blacklisted the job would end. At 2 ranks the other host is this
    machine's own name."""
    script = [sys.executable, str(MP / "elastic_numpy.py")]
    others = "localhost:2" if np_ == 3 else f"{socket.gethostname()}:1"
    job = ElasticJob(
        tmp_path,
        f"127.0.0.1:1\n{others}\n",
        ["-np", str(np_), "--min-np", str(np_ - 1)],
        script,
        env={"RAISE": "0:4"},
    )
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert done.stderr.count("RuntimeError: worker 0 (rank 0) raises at step 4") == 1, job.output()
    # (with its exit code when its wrapper's report came before the launcher ended)
    ended = r"generation 0 ended: rank 0 \(on 127\.0\.0\.1(, exited with code 1)?\) failed"
    assert re.search(ended, done.stderr), job.output()
    assert "blacklisted 127.0.0.1 for good" in done.stderr
    survivors = np_ - 1
    assert f"generation 1: {survivors} rank{'s' * (survivors > 1)} on {others}" in done.stderr
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["step"] == 24 and result["sizes"] == [np_] * 4 + [survivors] * 20, result


def test_a_rank_killed_while_it_writes_a_commit(tmp_path):
    """Rank 0 writes this machine's copy of each commit: killed half-way through writing
    commit 10, the job goes on from commit 9, and the torn file is never read."""
    script = [
        sys.executable,
        str(MP / "elastic_commit_kill.py"),
        "10",
        str(EXAMPLE),
        "--count-samples",
        "--epochs",
        str(EPOCHS),
    ]
    job = ElasticJob(tmp_path, "127.0.0.1:1\nlocalhost:2\n", ["-np", "3", "--min-np", "2"], script)
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert "killing itself while writing commit 10" in done.stdout, job.output()
    assert "rank 0 (on 127.0.0.1, was killed by SIGKILL) failed" in done.stderr
    check_every_sample_trained(done.stdout, 3, 1)


def test_the_job_grows_when_the_discovery_script_adds_a_slot(tmp_path):
    job = ElasticJob(tmp_path, "localhost:2\n", ["-np", "2", "--max-np", "3"], example())
    # As soon as its ranks run (the whole training takes about as long as the driver's
    # discovery takes to see a change, so the change comes early): the driver tells rank 0,
    # and a commit soon after interrupts generation 0.
    job.wait_for("rank 0 of generation 0", lambda: job.rank_pid(0, 0) is not None)
    job.set_hosts("localhost:2\n127.0.0.1:1\n")
    done = job.finish()
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert "hosts changed (localhost:2,127.0.0.1:1)" in err, job.output()
    assert "ranks 0 (on localhost), 1 (on localhost) stopped for a restart" in err
    assert "generation 1: 3 ranks on localhost:2,127.0.0.1:1" in err
    assert "3 ranks at the end" in done.stdout
    check_every_sample_trained(done.stdout, 3, 1)


def test_the_reset_limit_ends_the_job_and_keeps_the_last_commit_to_resume(tmp_path):
    three = f"localhost:1\n127.0.0.1:1\n{socket.gethostname()}:1\n"
    job = ElasticJob(
        tmp_path, three, ["-np", "3", "--min-np", "1", "--reset-limit", "1"], example()
    )
    job.wait_for_commit(5)
    job.kill_rank(2, generation=0)
    job.kill_rank(1, generation=1)
    done = job.finish()
    assert done.returncode == 1, job.output()
    err = done.stderr
    assert "generation 1: 2 ranks on localhost:1,127.0.0.1:1" in err, job.output()
    assert (
        "the job was stopped because the number of resets during the elastic job exceeded "
        "the limit: 1"
    ) in err
    assert f"is kept in {job.store}/<host>" in err and f"SCALEOUT_ELASTIC_JOB={job.job}" in err
    assert job.newest_commit() >= 5  # left on disk, to resume from
    # ... as the message says: the same command, the same job's id
    (tmp_path / "again").mkdir()
    again = ElasticJob(
        tmp_path / "again", "localhost:2\n", ["-np", "2"], example(), job=job.job, store=job.store
    )
    resumed = again.finish()
    assert resumed.returncode == 0, again.output()
    check_every_sample_trained(resumed.stdout, 3, 3)


def test_too_few_slots_for_too_long_ends_the_job(tmp_path):
    job = ElasticJob(
        tmp_path, "localhost:1\n127.0.0.1:1\n", ["-np", "2", "--elastic-timeout", "2"], example()
    )
    job.wait_for_commit(3)
    job.kill_rank(1, generation=0)
    done = job.finish()
    assert done.returncode == 1, job.output()
    assert (
        "timed out waiting for the minimum number of slots to become available: fewer "
        "than 2 for 2 s (--elastic-timeout)"
    ) in done.stderr, job.output()
    assert job.newest_commit() >= 3


@pytest.mark.parametrize(
    "hosts, message",
    [("exit 3", "exited with code 3"), ("echo 'bad host'", "'bad host' is not a host name")],
)
def test_a_discovery_script_that_fails_at_once_ends_the_job(tmp_path, hosts, message):
    done = scaleoutrun("-np", "2", "--host-discovery-script", hosts, sys.executable, "-c", "pass")
    assert done.returncode == 1 and message in done.stderr, done.stderr


def test_an_elastic_job_over_fixed_hosts_needs_two(tmp_path):
    done = scaleoutrun(
        "-np", "2", "--min-np", "1", "-H", "localhost:2", sys.executable, "-c", "pass"
    )
    assert done.returncode == 2 and "at least two hosts" in done.stderr, done.stderr
