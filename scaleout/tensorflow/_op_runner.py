"""Running numpy-level work as a TensorFlow op, eagerly and inside tf.function graphs.

Nothing here is compiled against TensorFlow. Eagerly, a collective hands the tensor's host memory
(through DLPack, no copy) to scaleout's numpy-level API. Inside a graph the same Python function
becomes one `tf.numpy_function` op: TensorFlow passes the inputs as numpy arrays, the function
submits every collective of the op to the core asynchronously and then waits for all of them (the
wait releases the GIL), so everything one op carries is negotiated and fused together. Results of
allreduce and broadcast are written into 64-byte-aligned arrays, which TensorFlow adopts as
tensors without a copy.

Ops are stateful and ordered: Note [Graph names] (scaleout/tensorflow/_arguments.py) for
tf.function, Note [TF1 graph order] below for tf.compat.v1 graphs.

XLA: a numpy_function cannot be compiled by XLA, so these ops refuse to be traced into a
`tf.function(jit_compile=True)` (or a Keras model compiled with `jit_compile=True`) and say so.
"""

from __future__ import annotations

import weakref
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout._arrays import address, submit_into, submit_owned
from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._native import ALLGATHER, ALLREDUCE, BROADCAST, REDUCESCATTER, Sum, wait_all
from scaleout.tensorflow import _errors
from scaleout.tensorflow._errors import typed

__all__ = ["Request", "request", "not_converted", "call", "aligned_empty", "out_shape", "run_batch"]

_errors.install()  # graph errors as their scaleout and tf.errors classes (Note [TF error types])

# One request of a batch: (kind, name, reduce op, prescale, postscale, root rank, process set:
# the core's id). The values are passed to the core as given: the binding checks them (a float
# root rank or a string scale factor is an InvalidArgumentError, not silently converted).
Request = Tuple[str, str, int, float, float, int, int]


def request(
    kind: str,
    name: str,
    op: int = Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
    process_set: int = 0,
) -> Request:
    return (kind, name, op, prescale, postscale, root, process_set)


# Autograph converts Python functions called from a tf.function; ours branch only on Python
# values, so converting them would just slow tracing (and every run of a numpy_function body).
not_converted = tf.autograph.experimental.do_not_convert


def _check_not_xla(what: str) -> None:
    try:  # a private module; if it moves, XLA's own error still names the PyFunc op
        from tensorflow.python.ops import control_flow_util

        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):
        return
    if in_xla:
        raise InvalidArgumentError(
            f"{what} cannot run inside an XLA-compiled function: scaleout's collectives are "
            "Python functions (tf.numpy_function), which XLA cannot compile. Use "
            "tf.function(jit_compile=False), or model.compile(..., jit_compile=False) for Keras "
            "(Keras's default 'auto' already picks False on CPU-only machines)."
        )


# Note [TF1 graph order]
# In a tf.compat.v1 graph run by a Session there are no automatic
# control dependencies, and each collective op blocks one of the executor's (few) threads while
# it waits for its partners. Two ranks that start a run's collectives in different orders would
# each wait for a collective the other has not started: a hang. So each scaleout op of such a
# graph gets a control dependency on the scaleout op created before it in that graph (in the
# same control-flow context), and every rank runs them in construction order, as tf.function
# does. The price: fetching a collective also runs the ones created before it in that graph.
# Ops meant to run on their own (broadcast_global_variables, broadcast_variables) stay out of
# the chain.
_last_graph_op: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _control_flow_context(graph):
    getter = getattr(graph, "_get_control_flow_context", None)
    return getter() if getter is not None else None


def _chained_op(graph, make, chain: bool):
    if not chain or tf.inside_function():
        return make()
    context = _control_flow_context(graph)
    previous = _last_graph_op.get(graph)
    deps = [previous[0]] if previous is not None and previous[1] is context else []
    with tf.control_dependencies(deps):
        outs = make()
    op = (
        outs.op
        if isinstance(outs, tf.Tensor)
        else (outs if isinstance(outs, tf.Operation) else (outs[0].op if outs else None))
    )
    if op is not None:
        _last_graph_op[graph] = (op, context)
    return outs


def call(
    np_fn: Callable[..., list],
    inputs: Sequence[tf.Tensor],
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence,
    what: str,
    chain: bool = True,
) -> List[tf.Tensor]:
    """Runs `np_fn(*arrays) -> list of arrays` now (eagerly) or as one stateful graph op. Errors
    leave as their TensorFlow-typed classes (scaleout.tensorflow._errors)."""
    try:
        _so.size()  # NotInitializedError now, at trace time in a graph, rather than at run time
    except ScaleoutError as e:
        raise typed(e) from None
    np_fn = not_converted(np_fn)  # else autograph would wrap it, at a cost on every run
    if tf.executing_eagerly():
        try:
            outs = np_fn(*[_host_view(t) for t in inputs])
        except ScaleoutError as e:
            raise typed(e) from None
        return [_adopt(o, d) for o, d in zip(outs, out_dtypes)]
    _check_not_xla(what)

    def typed_fn(*arrays):
        try:
            return np_fn(*arrays)
        except ScaleoutError as e:  # its class name travels in the graph error's message
            raise typed(e) from None

    graph = tf.compat.v1.get_default_graph()
    outs = _chained_op(
        graph,
        lambda: tf.numpy_function(
            not_converted(typed_fn),
            list(inputs),
            list(out_dtypes),
            stateful=True,
            name=what.replace(" ", "_"),
        ),
        chain,
    )
    if isinstance(outs, tf.Operation):
        return [outs]
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for out, shape in zip(outs, out_shapes):
        out.set_shape(shape)
    return outs


def _host_view(tensor: tf.Tensor) -> np.ndarray:
    """The eager tensor's memory as a read-only array (no copy; Tensor.numpy() copies)."""
    try:
        return np.from_dlpack(tensor)
    except (BufferError, TypeError, ValueError, RuntimeError):  # e.g. bfloat16
        return tensor.numpy()


def _adopt(array, dtype: tf.DType) -> tf.Tensor:
    """A tensor over a result array the caller no longer uses (no copy where DLPack allows)."""
    array = np.asarray(array)
    if (
        array.size
        and array.flags.c_contiguous
        and address(array) % _ALIGN == 0
        and array.dtype == dtype.as_numpy_dtype
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, ValueError, RuntimeError, tf.errors.OpError):
            pass
    return tf.convert_to_tensor(array, dtype=dtype)


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary: TensorFlow adopts such an
    array as a tensor without copying it (a numpy_function result, or DLPack eagerly), while it
    must copy (or, through DLPack, cannot use) a less aligned one."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -address(raw) % _ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


_ALIGN = 64


def _submit(req: Request, array: np.ndarray) -> _so.Handle:
    """One request of a batch. allreduce and broadcast write into a new aligned array (which
    TensorFlow adopts without a copy); the others' results are the core's bytes."""
    kind, name, op, prescale, postscale, root, ps = req
    if kind == "allreduce":
        a = np.asarray(array)
        return submit_into(
            ALLREDUCE,
            name,
            a,
            output=aligned_empty(a.shape, a.dtype),
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=ps,
        )
    if kind == "allgather":
        return submit_owned(ALLGATHER, name, array, process_set=ps)
    if kind == "broadcast":
        a = np.asarray(array)
        return submit_into(
            BROADCAST,
            name,
            a,
            output=aligned_empty(a.shape, a.dtype),
            root_rank=root,
            process_set=ps,
        )
    if kind == "reducescatter":
        return submit_owned(
            REDUCESCATTER,
            name,
            array,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=ps,
        )
    raise InvalidArgumentError(f"unknown collective kind {kind!r}")


def out_shape(kind: str, shape: tf.TensorShape) -> tf.TensorShape:
    if kind in ("allreduce", "broadcast"):
        return shape
    if shape.rank is None:
        return tf.TensorShape(None)
    if shape.rank == 0:  # the core gathers a scalar as one row
        return tf.TensorShape([None])
    return tf.TensorShape([None]).concatenate(shape[1:])


def run_batch(
    requests: Sequence[Request],
    tensors: Sequence[tf.Tensor],
    what: str = "scaleout_batch",
    chain: bool = True,
) -> List[tf.Tensor]:
    """Runs one collective per (request, tensor), all submitted before any is waited for, as one
    op. Outputs keep the inputs' dtypes."""
    requests = list(requests)
    if not requests:
        return []

    def np_fn(*arrays):
        # If a submission fails (a local error, raised alike on every rank), the ones already
        # submitted are not waited for: their partners on other ranks may never come.
        handles = [_submit(req, a) for req, a in zip(requests, arrays)]
        return [np.asarray(r) for r in wait_all(handles)]

    return call(
        np_fn,
        tensors,
        [t.dtype for t in tensors],
        [out_shape(req[0], t.shape) for req, t in zip(requests, tensors)],
        what,
        chain,
    )
