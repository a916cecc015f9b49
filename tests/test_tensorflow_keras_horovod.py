"""scaleout.tensorflow.keras behaves as Horovod 0.28.1's Keras API
(tests/mp/tf_keras_horovod_compat.py), at 2 and 3 ranks."""

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("nranks", [2, 3], ids=["np2", "np3"])
def test_keras_behaves_as_horovods(nranks, tmp_path):
    proc = run_mpi("tf_keras_horovod_compat.py", nranks, str(tmp_path), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
    # LearningRateWarmupCallback(verbose=1) on rank 0 only prints one line at the warmup's end
    assert proc.stdout.count("warmup finished") == 1, proc.stdout
