"""Horovod's helpers for TF1-style graphs (tf.compat.v1, run by a Session) and its object
collectives with TensorFlow's signatures.

The object collectives take Horovod's `session` argument and ignore it: scaleout sends objects
through its numpy-level path at once, in graph mode as eagerly, so no session is needed.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from scaleout import _objects
from scaleout._process_sets import global_process_set
from scaleout.tensorflow._arguments import check_device, set_id
from scaleout.tensorflow._collectives import broadcast_variables
from scaleout.tensorflow._errors import tf_errors

__all__ = [
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
]


def broadcast_global_variables(root_rank: int):
    """The op that assigns root_rank's values to every global variable of the default graph
    (tf.compat.v1.global_variables()), as Horovod's. Eagerly there are no global variables: a
    RuntimeError says to use broadcast_variables, as Horovod's does."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() does not support eager execution; use "
            "broadcast_variables(<model and optimizer variables>, root_rank) "
            "instead"
        )
    return broadcast_variables(
        tf.compat.v1.global_variables(), root_rank, name="broadcast_global_variables"
    )


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook (tf.compat.v1.train.MonitoredTrainingSession, Estimator) that broadcasts
    every global variable from root_rank once the session is created, as Horovod's.
    `device`: '' or a CPU device."""

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        check_device(device, "BroadcastGlobalVariablesHook")
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


@tf_errors
def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session=None,
    name: Optional[str] = None,
    process_set=global_process_set,
) -> Any:
    """root_rank's `obj` on every rank of `process_set` (Horovod's signature; `session` is not
    needed; root_rank is the job's rank)."""
    set_id(process_set, "broadcast_object")
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


@tf_errors
def broadcast_object_fn(
    root_rank: int = 0, session=None, name: Optional[str] = None, process_set=global_process_set
) -> Callable[[Any], Any]:
    """A function obj -> root_rank's obj, as Horovod's (which builds its graph once)."""
    set_id(process_set, "broadcast_object_fn")
    return tf_errors(
        lambda obj: _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)
    )


@tf_errors
def allgather_object(
    obj: Any, session=None, name: Optional[str] = None, process_set=global_process_set
) -> List[Any]:
    """Every rank's `obj` of `process_set`, in the set's rank order (Horovod's signature;
    `session` is not needed)."""
    set_id(process_set, "allgather_object")
    return _objects.allgather_object(obj, name=name, process_set=process_set)
