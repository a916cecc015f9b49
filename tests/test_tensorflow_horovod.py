"""scaleout.tensorflow behaves as Horovod 0.28.1's horovod.tensorflow
(tests/mp/tf_horovod_compat.py), at 2 and 3 ranks."""

import pytest

pytest.importorskip("tensorflow")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("nranks", [2, 3], ids=["np2", "np3"])
def test_tensorflow_behaves_as_horovods(nranks):
    proc = run_mpi("tf_horovod_compat.py", nranks, timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
