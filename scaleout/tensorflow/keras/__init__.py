"""scaleout for Keras 3 on TensorFlow, with Horovod's names:
`import scaleout.tensorflow.keras as hvd`.

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=False)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

As Horovod's, BroadcastGlobalVariablesCallback broadcasts at the end of the first batch; call
`hvd.broadcast_variables(model.weights, root_rank=0)` before fit() for an identical first step.

Saved models load with `hvd.load_model` (optimizer distributed again) or, for inference without
scaleout, with plain `keras.models.load_model`. XLA (`jit_compile=True`) is not supported: Keras's
default `jit_compile="auto"` picks False on CPU-only machines; elsewhere pass jit_compile=False.
"""

try:
    import keras as _keras
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "scaleout.tensorflow.keras needs TensorFlow with Keras 3: pip install tensorflow-cpu"
    ) from exc
if not _keras.__version__.startswith("3."):  # pragma: no cover
    raise ImportError(
        f"scaleout.tensorflow.keras supports Keras 3 (TensorFlow >= 2.16), "
        f"found Keras {_keras.__version__}"
    )

from scaleout import _frontend_api
from scaleout._frontend_api import *  # noqa: F401,F403
from scaleout._native import Average
from scaleout.tensorflow import _collectives as _tf_ops
from scaleout.tensorflow import _v1 as _tf_v1
from scaleout.tensorflow._collectives import alltoall, barrier, broadcast_variables, join
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow.keras import callbacks
from scaleout.tensorflow.keras._optimizer import (
    DistributedOptimizer,
    PartialDistributedOptimizer,
    is_distributed,
    load_model,
)


# Horovod's Keras module orders these arguments differently from its TensorFlow module
# (name comes second), so they are thin wrappers rather than re-exports.
def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """Reduces a tensor-compatible value across ranks (default Average); returns a tensor."""
    return _tf_ops.allreduce(
        value,
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )


def allgather(value, name=None):
    """Concatenates every rank's value along the first dimension; returns a tensor."""
    return _tf_ops.allgather(value, name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's value on every rank; returns a tensor."""
    return _tf_ops.broadcast(value, root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """Reduces across ranks and returns this rank's slice of the first dimension."""
    return _tf_ops.reducescatter(value, op=op, name=name)


def broadcast_global_variables(root_rank):
    """Horovod's TF1 helper: broadcasts every global variable of the default graph.

    Keras 3 runs eagerly (its train step is a tf.function, not a session), where there are no
    global-variable collections; as in Horovod under eager execution this raises RuntimeError.
    Use `hvd.broadcast_variables(model.weights, root_rank)` or
    `hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)` instead. Inside a TF1 graph
    (tf.compat.v1) it is scaleout.tensorflow's broadcast_global_variables, where that exists.
    """
    tf_version = getattr(_tf_v1, "broadcast_global_variables", None)
    if tf_version is not None:
        return tf_version(root_rank)
    raise RuntimeError(
        "broadcast_global_variables() does not support eager execution (Keras 3 "
        "always runs eagerly); use hvd.broadcast_variables(model.weights, "
        "root_rank) or hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)"
    )


def __getattr__(name):
    # `hvd.elastic` (Horovod's attribute): imported when first used.
    if name == "elastic":
        import importlib

        return importlib.import_module("scaleout.tensorflow.keras.elastic")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = _frontend_api.__all__ + [
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "alltoall",
    "join",
    "barrier",
    "broadcast_variables",
    "broadcast_global_variables",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "is_distributed",
    "load_model",
    "callbacks",
    "Compression",
]
