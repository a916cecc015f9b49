"""The TensorFlow examples run as users run them (a Horovod Keras script with one import
changed)."""

import re
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from conftest import run_mpi  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_keras_digits_example_learns_on_two_ranks():
    proc = run_mpi(
        str(EXAMPLES / "tensorflow2_keras_digits.py"), 2, "--epochs", "12", timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"ranks: 2, per-rank batch: 32, test accuracy: ([0-9.]+)", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) >= 0.93  # one process: 0.967 after 12 epochs, 0.976 after 30
