"""Setup shared by the TensorFlow scripts: quiet logs and one thread per rank (the ranks share
two cores), imported before TensorFlow is."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")

from _harness import check, failures  # noqa: E402

import scaleout as so  # noqa: E402


def expect_graph_error(fn, *fragments, what=""):
    """Errors raised while a tf.function is traced reach the caller as the scaleout error, or as
    autograph's StagingError carrying its message; errors raised while the graph runs arrive as
    a tf.errors.OpError whose message holds the scaleout error. Either way: the message."""
    try:
        fn()
    except (so.ScaleoutError, tf.errors.OpError, Exception) as e:  # noqa: B014
        msg = str(e)
        for f in fragments:
            check(f in msg, f"{what}: message lacks {f!r}: {msg[-600:]!r}")
        return type(e), msg
    check(False, f"{what}: raised nothing")
    return None, ""


__all__ = ["tf", "so", "check", "failures", "expect_graph_error"]
