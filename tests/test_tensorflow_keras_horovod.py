"""scaleout.tensorflow.keras behaves as Horovod 0.28.1's Keras API
(tests/mp/tf_keras_horovod_compat.py), at 3 ranks (2: the TensorFlow test's; conftest.one_size)."""

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import one_size, run_mpi  # noqa: E402


@one_size(3)
def test_keras_behaves_as_horovods(nranks, tmp_path):
    proc = run_mpi("tf_keras_horovod_compat.py", nranks, str(tmp_path), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
    # LearningRateWarmupCallback(verbose=1) on rank 0 only prints one line at the warmup's end
    assert proc.stdout.count("warmup finished") == 1, proc.stdout
