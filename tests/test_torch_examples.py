"""The PyTorch examples run as the README says, and the digits example reaches the accuracy of
one process."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def accuracy(proc) -> float:
    found = re.findall(r"test accuracy ([0-9.]+)", proc.stdout)
    assert len(found) == 1, proc.stdout
    return float(found[0])


def test_digits_on_two_ranks_reaches_single_process_accuracy():
    pytest.importorskip("sklearn")
    script = str(EXAMPLES / "pytorch_digits.py")  # an absolute path: run_mpi takes it as is
    single = accuracy(run_mpi(script, 1, "--epochs", "12"))
    double = accuracy(run_mpi(script, 2, "--epochs", "12"))
    assert single > 0.9
    # Synchronous SGD on the same global batches: the same model up to rounding, so at most
    # one of the 450 test images may come out differently.
    assert double >= single - 1.5 / 450, (single, double)


def test_synthetic_benchmark_reports_images_per_second():
    proc = run_mpi(
        str(EXAMPLES / "pytorch_synthetic_benchmark.py"),
        2,
        "--model",
        "mlp",
        "--num-warmup-batches",
        "1",
        "--num-batches-per-iter",
        "2",
        "--num-iters",
        "2",
        "--fp16-allreduce",
    )
    assert re.search(r"Img/sec per rank: [0-9.]+ \+-[0-9.]+", proc.stdout), proc.stdout
    assert re.search(r"Total img/sec on 2 rank\(s\): [0-9.]+", proc.stdout), proc.stdout
