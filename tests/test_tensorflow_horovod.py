"""scaleout.tensorflow behaves as Horovod 0.28.1's horovod.tensorflow
(tests/mp/tf_horovod_compat.py), at 2 ranks (3: the Keras test's; conftest.one_size)."""

import pytest

pytest.importorskip("tensorflow")

from conftest import one_size, run_mpi  # noqa: E402


@one_size(2)
def test_tensorflow_behaves_as_horovods(nranks):
    proc = run_mpi("tf_horovod_compat.py", nranks, timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
