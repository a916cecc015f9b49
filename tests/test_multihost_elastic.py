"""Elastic training across hosts made of network namespaces (tests/_hosts.py), over ssh:
examples/elastic_pytorch_digits.py loses a whole host mid-epoch (everything running on it, its
sshd, the MPI launcher's daemon and its ranks, is killed at once) and goes on on the others
from its last commit; every sample is still trained once per epoch (a few more: padding).
 - scaleoutrun on hostA, ranks on hostA (2) and hostB (1): hostB is lost;
 - scaleoutrun on hostC, ranks on hostA (1: rank 0) and hostB (1): rank 0's host is lost;
 - scaleoutrun on hostC, ranks on hostA (1) and hostB (1): hostB's worker raises an exception
   (tests/mp/elastic_numpy.py), and its host is left out as a lost one would be."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from _elastic_job import EXAMPLE, ElasticJob, digits_result  # noqa: E402
from _hosts import INTERFACE, NETWORK_ENV, SSH_PORT, HostsUnavailable, made_hosts  # noqa: E402
from conftest import MP  # noqa: E402

EPOCHS = 4


def check_samples(stdout: str, most_ranks: int) -> None:
    accuracy, counts = digits_result(stdout)
    assert min(counts) == EPOCHS, counts
    extra = sum((times - EPOCHS) * n for times, n in counts.items())
    assert extra <= (most_ranks - 1) * (EPOCHS + 1), counts
    assert accuracy > 0.85


def lose_a_host(
    tmp_path, count: int, driver: str, hosts_text: str, min_np: int, lost: str, survivors=None
):
    """The example on `hosts_text` of `count` namespace hosts, scaleoutrun on `driver`; `lost`
    is lost whole after commit 10, and `survivors(job)`, if given, looks at the next generation.
    Returns the job and how it ended."""
    try:
        (tmp_path / "hosts").mkdir()
        with made_hosts(tmp_path / "hosts", count) as hosts:
            (tmp_path / "job").mkdir()
            np_ = sum(int(line.split(":")[1]) for line in hosts_text.split())
            job = ElasticJob(
                tmp_path / "job",
                hosts_text,
                [
                    "-np",
                    str(np_),
                    "--min-np",
                    str(min_np),
                    "--ssh-port",
                    str(SSH_PORT),
                    "--network-interface",
                    INTERFACE,
                ],
                [sys.executable, str(EXAMPLE), "--count-samples", "--epochs", str(EPOCHS)],
                env={**NETWORK_ENV, "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30"},
                runner=hosts._enter(driver) + [sys.executable],
            )
            job.wait_for_commit(10)
            hosts.kill_host(lost)
            if survivors is not None:
                survivors(job)
            return job, job.finish()
    except HostsUnavailable as exc:
        pytest.skip(f"{count}-host test: {exc}")


def test_losing_a_whole_host(tmp_path):
    job, done = lose_a_host(tmp_path, 2, "hostA", "hostA:2\nhostB:1\n", 2, lost="hostB")
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert "generation 0: 3 ranks on hostA:2,hostB:1" in err, job.output()
    assert "rank 2 (on hostB) failed" in err and "blacklisted hostB" in err, job.output()
    assert "generation 1: 2 ranks on hostA:2" in err
    check_samples(done.stdout, 3)


def test_losing_rank_0s_host(tmp_path):
    def survivor_keeps_its_identity(job):
        # hostB's worker is rank 0 now, and still Horovod's worker 1 on hostB (Note
        # [horovodrun's rank variables]).
        mine = job.rank_variables(0, generation=1)
        assert (mine.get("HOROVOD_RANK"), mine.get("HOROVOD_HOSTNAME")) == ("1", "hostB"), mine

    job, done = lose_a_host(
        tmp_path, 3, "hostC", "hostA:1\nhostB:1\n", 1, "hostA", survivor_keeps_its_identity
    )
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert "generation 0: 2 ranks on hostA:1,hostB:1" in err, job.output()
    assert "rank 0 (on hostA) failed" in err and "blacklisted hostA" in err, job.output()
    assert "generation 1: 1 rank on hostB:1" in err
    check_samples(done.stdout, 2)


def test_a_worker_that_raises_on_a_host(tmp_path):
    """As in Horovod: a worker that raises is a failure of its host, which is blacklisted; the
    worker is picked by HOROVOD_RANK, its identity across restarts."""
    script = [sys.executable, str(MP / "elastic_numpy.py")]
    try:
        (tmp_path / "hosts").mkdir()
        with made_hosts(tmp_path / "hosts", 3) as hosts:
            (tmp_path / "job").mkdir()
            job = ElasticJob(
                tmp_path / "job",
                "hostA:1\nhostB:1\n",
                ["-np", "2", "--min-np", "1", "--ssh-port", str(SSH_PORT)]
                + ["--network-interface", INTERFACE],
                script,
                env={**NETWORK_ENV, "RAISE": "1:4"},
                runner=hosts._enter("hostC") + [sys.executable],
            )
            done = job.finish()
    except HostsUnavailable as exc:
        pytest.skip(f"3-host test: {exc}")
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert err.count("RuntimeError: worker 1 (rank 1) raises at step 4") == 1, job.output()
    assert "rank 1 (on hostB" in err and "blacklisted hostB" in err, job.output()
    assert "generation 1: 1 rank on hostA:1" in err, job.output()
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["step"] == 24 and result["sizes"] == [2] * 4 + [1] * 20, result
