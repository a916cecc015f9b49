"""Elastic training across two hosts made of network namespaces (tests/_hosts.py): scaleoutrun
runs on hostA and starts examples/elastic_pytorch_digits.py on hostA (2 ranks) and hostB (1),
over ssh. Mid-epoch, hostB is lost: everything running on it (its sshd, the MPI launcher's
daemon, its rank) is killed at once. The job goes on at 2 ranks on hostA from its last commit,
and every sample is still trained once per epoch (a few more: padding)."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from _elastic_job import EXAMPLE, ElasticJob, digits_result  # noqa: E402
from _hosts import INTERFACE, NETWORK_ENV, SSH_PORT, HostsUnavailable, made_hosts  # noqa: E402

EPOCHS = 4


def test_losing_a_whole_host(tmp_path):
    try:
        (tmp_path / "hosts").mkdir()
        with made_hosts(tmp_path / "hosts", 2) as hosts:
            (tmp_path / "job").mkdir()
            job = ElasticJob(
                tmp_path / "job", "hostA:2\nhostB:1\n",
                ["-np", "3", "--min-np", "2", "--ssh-port", str(SSH_PORT),
                 "--network-interface", INTERFACE],
                [sys.executable, str(EXAMPLE), "--count-samples", "--epochs", str(EPOCHS)],
                env={**NETWORK_ENV, "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30"},
                runner=hosts._enter("hostA") + [sys.executable])
            job.wait_for_commit(10)
            hosts.kill_host("hostB")
            done = job.finish()
    except HostsUnavailable as exc:
        pytest.skip(f"two-host test: {exc}")
    assert done.returncode == 0, job.output()
    err = done.stderr
    assert "generation 0: 3 ranks on hostA:2,hostB:1" in err, job.output()
    assert "rank 2 (on hostB) failed" in err and "blacklisted hostB" in err, job.output()
    assert "generation 1: 2 ranks on hostA:2" in err
    accuracy, counts = digits_result(done.stdout)
    assert min(counts) == EPOCHS, counts
    assert sum((times - EPOCHS) * n for times, n in counts.items()) <= 2 * (EPOCHS + 1), counts
    assert accuracy > 0.85
