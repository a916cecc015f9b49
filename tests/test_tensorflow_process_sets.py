"""Process sets through scaleout.tensorflow and its Keras module (tests/mp/tf_process_sets.py),
at 3 ranks (4, two pairs, is the numpy test's): every collective on a subset of the ranks,
eagerly and in tf.function, with its gradient on the same set; the query ops and object
helpers; the errors of a rank outside the set; DistributedGradientTape and the TF1
DistributedOptimizer on a set; Keras DistributedOptimizer training on two disjoint sets at once
(with loss scaling)."""

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("nranks", [3], ids=["np3"])  # 4 (two pairs): the numpy test's
def test_tensorflow_on_process_sets(nranks):
    # A backward pass sent to the wrong set leaves ranks waiting on two sets at once, which the
    # core's deadlock check (per set) does not see: the stall shutdown turns that into an error
    # naming the collective instead of a hang.
    proc = run_mpi(
        "tf_process_sets.py",
        nranks,
        timeout=150,
        env={"SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": "60"},
    )
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
