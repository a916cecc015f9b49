"""scaleout.tensorflow.keras on real ranks: model.fit with DistributedOptimizer equals one process
with the whole batch, callbacks, save/load, and the jit_compile error."""

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import one_size, run_mpi  # noqa: E402


@one_size(2)
def test_keras_fit_callbacks_save_load(nranks, tmp_path):
    proc = run_mpi("tf_keras.py", nranks, str(tmp_path), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
