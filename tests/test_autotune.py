"""Autotuning with Horovod's variables (Note [Autotune]; docs/autotune.md): rank 0 tries settings
sample by sample while the job trains correctly, then keeps the best, writes Horovod's CSV and
names the settings to keep; bad settings and a log that cannot be written fail init on every
rank. The search itself is tested in native/tests/test_autotuner.cc."""

import csv
import re

import pytest
from conftest import run_mpi

HEADER = [
    "hierarchical_allreduce",
    "hierarchical_allgather",
    "torus_allreduce",
    "cache_enabled",
    "cycle_time_ms",
    "tensor_fusion_threshold",
    "score",
]


def test_autotune_tries_settings_then_keeps_the_best(tmp_path, nranks):
    log = tmp_path / "autotune.csv"
    env = {
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": str(log),
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6",
    }
    # (1 warm-up + 6 samples) x 2 steps: tuning is over by step 15 of 24.
    proc = run_mpi("autotune.py", nranks, "train", "24", env=env)
    assert proc.stdout.count("all checks passed") == nranks
    rows = list(csv.reader(log.read_text().splitlines()))
    assert rows[0] == HEADER
    samples, best = rows[1:-1], rows[-1]
    assert len(samples) == 6, rows
    # The configured settings are tried first (defaults: 1 ms, 64 MiB), then others.
    assert samples[0][4:6] == ["1", "64"], samples
    assert len({tuple(r[4:6]) for r in samples}) >= 4, samples
    assert all(float(r[6]) > 0 for r in samples), samples
    assert best[:4] == ["0", "0", "0", "1"] and tuple(best[4:6]) in {tuple(r[4:6]) for r in samples}
    done = [line for line in proc.stderr.splitlines() if "autotune: done" in line]
    assert len(done) == 1 and "NOTICE (rank 0)" in done[0], proc.stderr
    keep = re.search(r"SCALEOUT_FUSION_THRESHOLD=(\d+) SCALEOUT_CYCLE_TIME=([\d.]+)", done[0])
    assert keep, done[0]
    assert float(keep.group(2)) == float(best[4])
    assert int(keep.group(1)) / 2**20 == pytest.approx(float(best[5]), rel=1e-5)


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "/nonexistent/dir/tune.csv"},
            "HOROVOD_AUTOTUNE_LOG='/nonexistent/dir/tune.csv' cannot be written on rank 0: "
            "No such file or directory",
        ),
        (
            {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "0"},
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE='0' is not a whole number from 1",
        ),
    ],
    ids=["unwritable-log", "zero-steps"],
)
def test_bad_autotune_settings_fail_init_on_every_rank(env, message):
    proc = run_mpi("autotune.py", 2, "bad", message, env=env)
    assert proc.stdout.count("all checks passed") == 2
