"""Horovod's graph-time queries (size_op, rank_op, ...): values read when the op runs, not when
it is built."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._process_sets import set_rank, set_size
from scaleout.tensorflow._errors import tf_errors, typed
from scaleout.tensorflow._op_runner import not_converted

__all__ = ["size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op"]


def _query_op(fn: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    def typed_fn():
        try:
            return np.int32(fn())
        except ScaleoutError as e:  # its class name travels in the graph error's message
            raise typed(e) from None

    if tf.executing_eagerly():
        return tf.constant(typed_fn(), tf.int32)
    out = tf.numpy_function(
        not_converted(typed_fn), [], tf.int32, stateful=True, name=name or "scaleout_query"
    )
    out.set_shape([])
    return out


# Horovod's code for an unknown process set (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET), which its
# process_set_included_op returns instead of 0 or 1.
PROCESS_SET_ERROR_UNKNOWN_SET = -3


def _query_set_id(process_set_id, what: str) -> int:
    """Horovod's query ops take the set's integer id (`ps.process_set_id`), not the set."""
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, (int, np.integer)):
        raise InvalidArgumentError(
            f"{what}: process_set_id must be a process set's integer id "
            f"(ProcessSet.process_set_id; 0: the global set), not "
            f"{process_set_id!r}"
        )
    return int(process_set_id)


def _described(process_set_id: int):
    """(this rank's place in the set or -1, the set's size), or None for an unknown id."""
    try:
        return set_rank(process_set_id), set_size(process_set_id)
    except InvalidArgumentError:
        return None


@tf_errors
def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks of the job, or of the process set with id `process_set_id`, as an
    int32 op evaluated when it runs (an unknown id then raises InvalidArgumentError, where
    Horovod's returns a negative error code as the size)."""
    set_id_ = _query_set_id(process_set_id, "size_op")

    def size() -> int:
        if set_id_ == 0:
            return _so.size()
        described = _described(set_id_)
        if described is None:
            raise InvalidArgumentError(f"size_op: there is no process set with id {set_id_}")
        return described[1]

    return _query_op(size, name)


@tf_errors
def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this machine, as an int32 op evaluated when it runs."""
    return _query_op(_so.local_size, name)


@tf_errors
def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 op evaluated when it runs."""
    return _query_op(_so.rank, name)


@tf_errors
def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its machine, as an int32 op evaluated when it runs (Horovod
    0.28.1's; releases before it returned the global rank, a bug fixed in 0.28.1)."""
    return _query_op(_so.local_rank, name)


@tf_errors
def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this rank belongs to the process set with id `process_set_id` (every rank belongs
    to the global one, id 0), else 0; for an id no set has, -3 (Horovod's
    HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET). An int32 op evaluated when it runs."""
    set_id_ = _query_set_id(process_set_id, "process_set_included_op")

    def included() -> int:
        _so.size()  # NotInitializedError before init, as Horovod's op fails then
        if set_id_ == 0:
            return 1
        described = _described(set_id_)
        if described is None:
            return PROCESS_SET_ERROR_UNKNOWN_SET
        return int(described[0] >= 0)

    return _query_op(included, name)
