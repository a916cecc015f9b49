"""scaleout.tensorflow: collectives, gradients and DistributedGradientTape on real ranks (2, and 3
oversubscribing this 2-core machine), plus the pieces that need no ranks."""

import pytest

pytest.importorskip("tensorflow")

from conftest import one_size, run_mpi  # noqa: E402


@one_size(3)
def test_ops_eager_and_in_tf_function_with_gradients_and_errors(nranks):
    proc = run_mpi("tf_ops.py", nranks, timeout=240)
    assert proc.stdout.count("all checks passed") == nranks


@one_size(2)
def test_gradient_tape_and_custom_loop_equals_single_process(nranks):
    proc = run_mpi("tf_training.py", nranks, timeout=240)
    assert proc.stdout.count("all checks passed") == nranks


def test_compression_casts_floats_only():
    import tensorflow as tf

    from scaleout.tensorflow import Compression

    wire, ctx = Compression.fp16.compress(tf.constant([1.0, 2.0], tf.float64))
    assert wire.dtype == tf.float16
    assert Compression.fp16.decompress(wire, ctx).dtype == tf.float64
    wire, ctx = Compression.bf16.compress(tf.constant([1.0]))
    assert wire.dtype == tf.bfloat16
    ints = tf.constant([1, 2])
    assert Compression.fp16.compress(ints)[0] is ints
    assert Compression.none.compress(ints)[0] is ints


def test_gpu_placement_is_refused_with_a_clear_message():
    from scaleout import InvalidArgumentError
    from scaleout.tensorflow._arguments import check_device

    check_device("")
    check_device("/job:localhost/replica:0/task:0/device:CPU:0")
    with pytest.raises(InvalidArgumentError, match="GPU tensors are not supported yet"):
        check_device("/job:localhost/replica:0/task:0/device:GPU:0", "allreduce")
    with pytest.raises(InvalidArgumentError, match="not supported"):
        check_device("/device:TPU:0")


def test_collectives_before_init_say_so():
    import tensorflow as tf

    import scaleout
    import scaleout.tensorflow as hvd

    if scaleout.is_initialized():
        pytest.skip("scaleout was initialized in this process by another test")
    with pytest.raises(scaleout.NotInitializedError, match="init"):
        hvd.allreduce(tf.ones(2))
    # At trace time, not inside the graph. Autograph re-raises errors from a traced function as
    # its StagingError unless the exception class keeps Exception.__init__: accept both.
    with pytest.raises(Exception, match="not initialized") as info:
        tf.function(lambda: hvd.allreduce(tf.ones(2)))()
    assert isinstance(info.value, scaleout.NotInitializedError) or "NotInitializedError" in str(
        info.value
    )
