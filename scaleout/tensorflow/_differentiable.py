"""The differentiable forms of the collectives: each forward is one op (_op_runner.py) with a
custom gradient.

The rules are scaleout._gradient_rules' (Horovod's definitions, shared with scaleout.torch); each
gradient that needs more than one collective runs them in one op, on numpy arrays.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np
import tensorflow as tf

from scaleout import _gradient_rules, _naming
from scaleout._arrays import splits_array, submit_owned
from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._native import ALLTOALL, synchronize
from scaleout._process_sets import set_size
from scaleout.tensorflow._errors import typed
from scaleout.tensorflow._op_runner import call, out_shape, request, run_batch

__all__ = [
    "differentiable_allreduce",
    "differentiable_allgather",
    "differentiable_reducescatter",
    "differentiable_broadcast",
    "differentiable_alltoall",
]


def _gradient_op(
    what: str, process_set: int, dy: tf.Tensor, tensors: Sequence[tf.Tensor], result_shape, *args
) -> tf.Tensor:
    """One op applying collective `what`'s gradient rule: rule(ops, dy, *args, *tensors), with
    dy and `tensors` as numpy arrays (scalars as Python ints), on the forward's process set."""
    rule = _gradient_rules.gradient(what)
    ops = _gradient_rules.numpy_ops(process_set)

    def np_fn(g, *more):
        more = [int(m) if np.ndim(m) == 0 else m for m in more]
        return [np.asarray(rule(ops, g, *args, *more))]

    return call(np_fn, [dy, *tensors], [dy.dtype], [result_shape], f"scaleout_{what}_grad")[0]


def _typed_gradient(grad_fn):
    """A custom gradient function whose scaleout errors (raised while TensorFlow builds or runs
    the backward pass) leave as their TensorFlow-typed classes."""

    def wrapper(*args, **kwargs):
        try:
            return grad_fn(*args, **kwargs)
        except ScaleoutError as e:
            raise typed(e) from None

    return wrapper


def differentiable_allreduce(
    tensors: List[tf.Tensor],
    names: List[str],
    op: int,
    prescale: float,
    postscale: float,
    process_set: int = 0,
) -> List[tf.Tensor]:
    # The total loss is the sum of every rank's loss, so the gradient of a Sum (Average) is the
    # Sum (Average) of the incoming gradients, with the same scale factors, on the same set.
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch(
            [request("allreduce", n, op, prescale, postscale, 0, process_set) for n in names],
            xs,
            "scaleout_allreduce",
        )

        @_typed_gradient
        def grad(*dys):
            _gradient_rules.check_gradient_op("allreduce", op)
            return run_batch(
                [
                    request(
                        "allreduce", _naming.gradient(n), op, prescale, postscale, 0, process_set
                    )
                    for n in names
                ],
                [tf.convert_to_tensor(d) for d in dys],
                "scaleout_allreduce_grad",
            )

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def differentiable_allgather(
    tensors: List[tf.Tensor], names: List[str], process_set: int = 0
) -> List[tf.Tensor]:
    # Horovod's definition: each rank gets its own rows of the Average-allreduce of the output
    # gradients over the set (scaleout._gradient_rules; rows in the set's order).
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch(
            [request("allgather", n, process_set=process_set) for n in names],
            xs,
            "scaleout_allgather",
        )

        @_typed_gradient
        def grad(*dys):
            out = []
            for x, dy, n in zip(xs, dys, names):
                dy = tf.convert_to_tensor(dy)
                rows = (
                    tf.shape(x, out_type=tf.int64)[0]
                    if x.shape.rank != 0
                    else tf.constant(1, tf.int64)
                )
                g = _gradient_op(
                    "allgather", process_set, dy, [rows], out_shape("allgather", x.shape), n
                )
                out.append(tf.reshape(g, tf.shape(x)))
            return out

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def differentiable_reducescatter(
    tensors: List[tf.Tensor],
    names: List[str],
    op: int,
    prescale: float,
    postscale: float,
    process_set: int = 0,
) -> List[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch(
            [request("reducescatter", n, op, prescale, postscale, 0, process_set) for n in names],
            xs,
            "scaleout_reducescatter",
        )

        @_typed_gradient
        def grad(*dys):
            _gradient_rules.check_gradient_op("reducescatter", op)
            out = []
            for x, dy, n in zip(xs, dys, names):
                g = _gradient_op(
                    "reducescatter",
                    process_set,
                    tf.convert_to_tensor(dy),
                    [],
                    out_shape("allgather", x.shape),
                    n,
                    op,
                    prescale,
                    postscale,
                )
                out.append(tf.reshape(g, tf.shape(x)))
            return out

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def differentiable_broadcast(
    x: tf.Tensor, name: str, root_rank: int, process_set: int
) -> tf.Tensor:
    # Horovod's definition: the root gets the gradient averaged over the set, other ranks zeros.
    ps = process_set

    @tf.custom_gradient
    def forward(x):
        y = run_batch(
            [request("broadcast", name, root=root_rank, process_set=ps)], [x], "scaleout_broadcast"
        )[0]

        @_typed_gradient
        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            return _gradient_op("broadcast", ps, dy, [], dy.shape, name, root_rank)

        return y, grad

    return forward(x)


def differentiable_alltoall(x: tf.Tensor, split_t, name: str, process_set: int):
    """(received rows, rows received from each rank as int32); the gradient travels back the
    same way. `split_t`: the rows sent to each rank (int64), or None for equal parts."""
    ps = process_set

    def run(data, send_splits, label):
        inputs = [data] if send_splits is None else [data, send_splits]

        def np_fn(a, s=None):
            sent = splits_array(s if s is not None else _equal_splits(a, ps))
            out, received = synchronize(
                submit_owned(ALLTOALL, label, a, splits=sent, process_set=ps)
            )
            return [out, np.asarray(received, np.int32)]

        return call(
            np_fn,
            inputs,
            [data.dtype, tf.int32],
            [out_shape("alltoall", data.shape), tf.TensorShape([set_size(ps)])],
            "scaleout_alltoall",
        )

    @tf.custom_gradient
    def forward(x):
        out, received = run(x, split_t, name)

        @_typed_gradient
        def grad(dy, _unused):
            dy = tf.convert_to_tensor(dy)
            back = _gradient_op(
                "alltoall",
                ps,
                dy,
                [tf.cast(received, tf.int64)],
                out_shape("alltoall", dy.shape),
                name,
            )
            return tf.reshape(back, tf.shape(x))

        return (out, received), grad

    return forward(x)


def _equal_splits(a: np.ndarray, process_set: int = 0) -> np.ndarray:
    n = set_size(process_set)
    rows = a.shape[0] if a.ndim else 1
    if rows % n:
        raise InvalidArgumentError(
            f"alltoall without splits needs a first dimension divisible "
            f"by the number of ranks ({rows} rows, {n} ranks"
            f"{'' if process_set == 0 else ' in the process set'})"
        )
    return np.full(n, rows // n, np.int64)
