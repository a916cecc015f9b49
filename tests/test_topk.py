"""Compression.topk (Note [Top-k sparsification]): the selection against a full sort, the
exchange and error feedback at the numpy level, torch's DistributedOptimizer and TensorFlow's
tape and Keras optimizer on real ranks, and the digits example at 1% density reaching dense
training's test accuracy (means over seeds)."""

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_size, run_mpi

from scaleout._errors import InvalidArgumentError
from scaleout._topk import TopK, select_topk, topk_count

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("n", [1, 5, 100, 32768, 32769, 200_000, 1_000_003])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
def test_selection_takes_the_k_largest_magnitudes(n, density):
    rng = np.random.default_rng(n)
    for x in (
        rng.standard_normal(n),  # smooth
        rng.standard_normal(n) * (rng.random(n) < 0.05),  # mostly zeros: ties at 0
        np.where(rng.random(n) < 0.5, 1.0, -1.0) * rng.integers(1, 4, n),
    ):  # few levels
        x = x.astype(np.float32)
        k = topk_count(n, density)
        chosen = select_topk(x, k, seed=n)
        assert len(chosen) == k and len(np.unique(chosen)) == k
        # The same magnitudes as a full sort's first k (ties may pick other entries).
        want = np.sort(np.abs(x))[::-1][:k]
        np.testing.assert_array_equal(np.sort(np.abs(x[chosen]))[::-1], want)


def test_count_is_at_least_one_and_at_most_n():
    assert topk_count(10, 0.01) == 1
    assert topk_count(1000, 0.01) == 10
    assert topk_count(1001, 0.01) == 11
    assert topk_count(5, 1.0) == 5


@pytest.mark.parametrize(
    "bad",
    [
        dict(density=0),
        dict(density=1.5),
        dict(density="0.1"),
        dict(density=True),
        dict(warmup_steps=-1),
        dict(warmup_steps=2.0),
        dict(momentum_correction=1.0),
        dict(momentum_correction="yes"),
        dict(hierarchical=True),
    ],
)
def test_bad_arguments_are_named(bad):
    with pytest.raises(InvalidArgumentError) as info:
        TopK(**{"density": 0.01, **bad})
    assert next(iter(bad)) in str(info.value)


@pytest.mark.parametrize("np_", [2, 3, 4], ids=lambda n: f"np{n}")
def test_exchange_and_error_feedback(np_):
    proc = run_mpi("topk.py", np_, timeout=180)
    assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


@pytest.mark.parametrize("np_", [3], ids=lambda n: f"np{n}")  # (conftest.one_size)
def test_torch_distributed_optimizer(np_):
    pytest.importorskip("torch")
    proc = run_mpi("torch_topk.py", np_, timeout=180)
    assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


@one_size(2)
def test_tensorflow_tape_and_keras(nranks, tmp_path):
    pytest.importorskip("tensorflow")
    proc = run_mpi("tf_topk.py", nranks, str(tmp_path), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


def _accuracies(np_: int, *runs: tuple) -> list:
    """The digits example's test accuracy after 40 epochs for each argument tuple, every run
    in one job (tests/mp/example_runs.py: ranks start and import torch once)."""
    argv = []
    for args in runs:
        argv += ["--", "--epochs", "40", *args]
    proc = run_mpi(
        "example_runs.py", np_, str(EXAMPLES / "pytorch_digits.py"), *argv[1:], timeout=300
    )
    found = re.findall(r"test accuracy ([0-9.]+)", proc.stdout)
    assert len(found) == len(runs), proc.stdout
    return [float(a) for a in found]


def test_digits_at_one_percent_density_reach_dense_accuracy():
    """The issue's proof: the same epochs, 1% of each gradient sent, test accuracy within one
    percentage point of dense training, at 2 ranks. One run's accuracy on the 450 test images
    moves by a point with the seed (and with the CPU's rounding: seed 42 gave 0.9867 dense and
    0.9756 sparse on one machine; seeds 1-3 gave -0.2, -0.2 and +0.4 points), so means over two
    seeds are compared: plain error feedback (seed 1) and with momentum correction (seed 2),
    each also within a point and a half. (4 ranks reached 0.9800, 0.9756 and 0.9844 at seeds
    1-3, dense 0.9822, 0.9800 and 0.9822, by hand; the 4-rank exchange and error feedback are
    test_exchange_and_error_feedback's.)"""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    dense1, dense2, sparse1, sparse2 = _accuracies(
        2,
        ("--seed", "1"),
        ("--seed", "2"),
        ("--seed", "1", "--topk", "0.01"),
        ("--seed", "2", "--topk", "0.01", "--momentum-correction"),
    )
    dense, sparse = [dense1, dense2], [sparse1, sparse2]
    assert min(dense) > 0.97, dense
    mean_dense = sum(dense) / 2
    assert sum(sparse) / 2 >= mean_dense - 0.01, (dense, sparse)
    assert min(sparse) >= mean_dense - 0.015, (dense, sparse)


@pytest.mark.parametrize("n", [1000, 200_000])
def test_a_nan_is_selected_not_kept_for_ever(n):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x[n // 3] = np.nan
    assert n // 3 in set(select_topk(x, topk_count(n, 0.01), seed=1).tolist())
