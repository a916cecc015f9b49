"""scaleout for TensorFlow 2 (>= 2.16, Keras 3), with Horovod's names:
`import scaleout.tensorflow as hvd`.

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)     # averaged across ranks
    hvd.broadcast_variables(model.variables, root_rank=0)

Nothing is compiled against TensorFlow: collectives run through scaleout's numpy-level API,
eagerly or as `tf.numpy_function` ops inside tf.function, so any TensorFlow 2.x from 2.16 on
works as installed. Tensors are host (CPU) tensors; GPU tensors are not supported yet.
XLA-compiled functions (`jit_compile=True`) cannot contain these ops: see _collectives.py.
Keras: `scaleout.tensorflow.keras`.
"""
try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("scaleout.tensorflow needs TensorFlow: pip install tensorflow-cpu "
                      "(or pip install 'scaleout[tensorflow]')") from exc

from scaleout import _common
from scaleout._common import *  # noqa: F401,F403
from scaleout.tensorflow._collectives import (allgather, allreduce, alltoall, barrier, broadcast,
                                              broadcast_variables, grouped_allreduce, join,
                                              reducescatter)
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._gradients import DistributedGradientTape

__all__ = _common.__all__ + [
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "join", "barrier", "broadcast_variables", "DistributedGradientTape", "Compression",
]
