"""scaleout for TensorFlow 2 (>= 2.16, Keras 3), with Horovod's names:
`import scaleout.tensorflow as hvd`.

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)     # averaged across ranks
    hvd.broadcast_variables(model.weights, root_rank=0)

Nothing is compiled against TensorFlow: collectives run through scaleout's numpy-level API,
eagerly or as `tf.numpy_function` ops inside tf.function and tf.compat.v1 graphs, so any
TensorFlow 2.x from 2.16 on works as installed. Tensors are host (CPU) tensors; GPU tensors are
not supported yet. XLA-compiled functions (`jit_compile=True`) cannot contain these ops: see
_op_runner.py. Errors are scaleout's classes and also the tf.errors classes Horovod raises
(_errors.py). Keras: `scaleout.tensorflow.keras`.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "scaleout.tensorflow needs TensorFlow: pip install tensorflow-cpu "
        "(or pip install 'scaleout[tensorflow]')"
    ) from exc

from scaleout import _frontend_api
from scaleout._frontend_api import *  # noqa: F401,F403
from scaleout.tensorflow._collectives import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_variables,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._gradients import DistributedGradientTape, PartialDistributedGradientTape
from scaleout.tensorflow._local_sgd import LocalSGD
from scaleout.tensorflow._optimizer import DistributedOptimizer
from scaleout.tensorflow._queries import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from scaleout.tensorflow._sync_batch_norm import SyncBatchNormalization
from scaleout.tensorflow._v1 import (
    BroadcastGlobalVariablesHook,
    broadcast_global_variables,
    broadcast_object_fn,
)
from scaleout.tensorflow._v1 import (
    allgather_object as allgather_object,  # TensorFlow's, in place of the numpy one
)
from scaleout.tensorflow._v1 import (
    broadcast_object as broadcast_object,  # TensorFlow's, in place of the numpy one
)

__all__ = _frontend_api.__all__ + [
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "join",
    "barrier",
    "broadcast_variables",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
    "broadcast_object_fn",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "LocalSGD",
    "SyncBatchNormalization",
    "Compression",
]


def __getattr__(name: str):
    # `hvd.elastic` (Horovod's attribute): imported when first used.
    if name == "elastic":
        import importlib

        return importlib.import_module("scaleout.tensorflow.elastic")
    raise AttributeError(f"module 'scaleout.tensorflow' has no attribute {name!r}")
