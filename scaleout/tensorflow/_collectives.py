"""Collectives on TensorFlow tensors, eagerly and inside tf.function graphs.

Nothing here is compiled against TensorFlow. Eagerly, a collective hands the tensor's host memory
(through DLPack, no copy) to scaleout's numpy-level API. Inside a graph the same Python function
becomes one `tf.numpy_function` op: TensorFlow passes the inputs as numpy arrays, the function
submits every collective of the op to the core asynchronously and then waits for all of them (the
wait releases the GIL), so everything one op carries is negotiated and fused together. Results of
allreduce and broadcast are written into 64-byte-aligned arrays, which TensorFlow adopts as
tensors without a copy.

Ordering and names (Note [Graph names]): inside tf.function, TensorFlow's automatic control
dependencies run stateful ops (ours are stateful) in program order, so the ops of one function run
one after another, as they were written, on every rank. An op without an explicit name is named
at trace time after its place in the graph (`graph.unique_name`, which includes the name scope),
so the same call site has the same name on every rank and in every step; repeated steps then hit
the core's response cache. Eager calls without a name use the numpy API's per-kind counter, so
they must be made in the same order on every rank (as with Horovod).

XLA: a numpy_function cannot be compiled by XLA, so these ops refuse to be traced into a
`tf.function(jit_compile=True)` (or a Keras model compiled with `jit_compile=True`) and say so.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout import _semantics
from scaleout._core import (ALLREDUCE, BROADCAST, COLLECTIVE_CODES, DTYPE_CODES, OP_NAMES,
                            Average, Sum, auto_name, resolve_op, submit, wait_all)
from scaleout._errors import InvalidArgumentError
from scaleout._ops import NUMPY_OPS, address, contiguous, dtype_code
from scaleout.tensorflow._compression import Compression

__all__ = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
           "reducescatter", "join", "barrier", "broadcast_variables", "check_device"]

# The dtypes the core reduces, from its table.
_SUPPORTED_DTYPES = tuple(tf.as_dtype(name) for name in DTYPE_CODES)

# One request of a batch: (kind, name, reduce op, prescale, postscale, root rank).
Request = Tuple[str, str, int, float, float, int]


def request(kind: str, name: str, op: int = Sum, prescale: float = 1.0, postscale: float = 1.0,
            root: int = 0) -> Request:
    return (kind, name, int(op), float(prescale), float(postscale), int(root))


# Autograph converts Python functions called from a tf.function; ours branch only on Python
# values, so converting them would just slow tracing (and every run of a numpy_function body).
_not_converted = tf.autograph.experimental.do_not_convert


# ---- checks done while building the op (on every rank, before anything is submitted) ----

def check_device(device: str, what: str = "scaleout") -> None:
    """Raises for tensors placed on an accelerator: only host (CPU) tensors are supported."""
    if not device:
        return
    try:
        kind = (tf.DeviceSpec.from_string(device).device_type or "").upper()
    except (ValueError, TypeError):
        return
    if kind in ("", "CPU"):
        return
    if kind == "GPU":
        raise InvalidArgumentError(
            f"{what}: GPU tensors are not supported yet (got a tensor on '{device}'). scaleout "
            "reduces host tensors: place the tensor on the CPU (with tf.device('/CPU:0'): "
            "tf.identity(t)).")
    raise InvalidArgumentError(f"{what}: tensors on device '{device}' are not supported; "
                               "scaleout works on CPU tensors")


def as_tensor(value, what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in _SUPPORTED_DTYPES:
        raise InvalidArgumentError(
            f"{what}: dtype {tensor.dtype.name} is not supported; scaleout handles "
            f"{', '.join(d.name for d in _SUPPORTED_DTYPES)}")
    check_device(tensor.device, what)
    return tensor


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
            "(Keras's default 'auto' already picks False on CPU-only machines).")


def op_name(kind: str, name: Optional[str]) -> str:
    """The collective's name: the given one, else one from the call site (Note [Graph names])."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, not {name!r}")
        return name
    if tf.executing_eagerly():
        return auto_name(COLLECTIVE_CODES[kind], None)
    return tf.compat.v1.get_default_graph().unique_name(f"scaleout_{kind}")


# ---- running numpy-level work eagerly or as a graph op ----

def call(np_fn: Callable[..., list], inputs: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
         out_shapes: Sequence, what: str) -> List[tf.Tensor]:
    """Runs `np_fn(*arrays) -> list of arrays` now (eagerly) or as one stateful graph op."""
    _so.size()  # NotInitializedError now, at trace time in a graph, rather than at run time
    np_fn = _not_converted(np_fn)  # else autograph would wrap it, at a cost on every run
    if tf.executing_eagerly():
        outs = np_fn(*[_host_view(t) for t in inputs])
        return [_adopt(o, d) for o, d in zip(outs, out_dtypes)]
    _check_not_xla(what)
    outs = tf.numpy_function(np_fn, list(inputs), list(out_dtypes), stateful=True,
                             name=what.replace(" ", "_"))
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
    if (array.size and array.flags.c_contiguous and address(array) % _ALIGN == 0
            and array.dtype == dtype.as_numpy_dtype):
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
    return raw[start:start + nbytes].view(dtype).reshape(shape)


_ALIGN = 64


def _into_aligned(kind: int, name: str, array: np.ndarray, op: int = Sum, root: int = 0,
                  prescale: float = 1.0, postscale: float = 1.0) -> _so.Handle:
    """allreduce / broadcast with the result written into a new aligned array."""
    src = contiguous(np.asarray(array))
    dst = aligned_empty(src.shape, src.dtype)
    return submit(kind, name, src, address(src), dtype_code(src.dtype), src.shape, dst,
                  address(dst), op, root, prescale, postscale, None, None)


def _submit(req: Request, array: np.ndarray) -> _so.Handle:
    kind, name, op, prescale, postscale, root = req
    if kind == "allreduce":
        return _into_aligned(ALLREDUCE, name, array, op, 0, prescale, postscale)
    if kind == "allgather":
        return _so.allgather_async(array, name=name)
    if kind == "broadcast":
        return _into_aligned(BROADCAST, name, array, Sum, root)
    if kind == "reducescatter":
        return _so.reducescatter_async(array, name=name, op=op, prescale_factor=prescale,
                                       postscale_factor=postscale)
    raise InvalidArgumentError(f"unknown collective kind {kind!r}")


def _out_shape(kind: str, shape: tf.TensorShape) -> tf.TensorShape:
    if kind in ("allreduce", "broadcast"):
        return shape
    if shape.rank is None:
        return tf.TensorShape(None)
    if shape.rank == 0:  # the core gathers a scalar as one row
        return tf.TensorShape([None])
    return tf.TensorShape([None]).concatenate(shape[1:])


def run_batch(requests: Sequence[Request], tensors: Sequence[tf.Tensor],
              what: str = "scaleout_batch") -> List[tf.Tensor]:
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

    return call(np_fn, tensors, [t.dtype for t in tensors],
                [_out_shape(req[0], t.shape) for req, t in zip(requests, tensors)], what)


# ---- gradients ----
#
# The rules are scaleout._semantics' (Horovod's definitions, shared with scaleout.torch); each
# gradient that needs more than one collective runs them in one op, on numpy arrays.

def _gradient_op(what: str, dy: tf.Tensor, tensors: Sequence[tf.Tensor], out_shape,
                 *args) -> tf.Tensor:
    """One op applying collective `what`'s gradient rule: rule(ops, dy, *args, *tensors), with
    dy and `tensors` as numpy arrays (scalars as Python ints)."""
    rule = _semantics.gradient(what)

    def np_fn(g, *more):
        more = [int(m) if np.ndim(m) == 0 else m for m in more]
        return [np.asarray(rule(NUMPY_OPS, g, *args, *more))]
    return call(np_fn, [dy, *tensors], [dy.dtype], [out_shape], f"scaleout_{what}_grad")[0]


def _differentiable_allreduce(tensors: List[tf.Tensor], names: List[str], op: int,
                              prescale: float, postscale: float) -> List[tf.Tensor]:
    # The total loss is the sum of every rank's loss, so the gradient of a Sum (Average) is the
    # Sum (Average) of the incoming gradients, with the same scale factors.
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch([request("allreduce", n, op, prescale, postscale) for n in names], xs,
                       "scaleout_allreduce")

        def grad(*dys):
            _semantics.check_gradient_op("allreduce", op)
            return run_batch([request("allreduce", f"{n}.grad", op, prescale, postscale)
                              for n in names], [tf.convert_to_tensor(d) for d in dys],
                             "scaleout_allreduce_grad")
        return ys, grad
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# ---- public collectives ----

def _check_device_arg(device: str, what: str) -> None:
    if device:
        check_device(device, what)


@_not_converted
def allreduce(tensor, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None):
    """Reduces `tensor` across ranks (default op Average). A tf.IndexedSlices is reduced by
    gathering its values and indices (Sum and Average only). Differentiable for Sum and Average.
    `device_dense`/`device_sparse` are accepted for Horovod compatibility (CPU only)."""
    _check_device_arg(device_dense, "allreduce")
    _check_device_arg(device_sparse, "allreduce")
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_slices(tensor, op_name("allreduce", name), op, compression,
                                 prescale_factor * postscale_factor)
    tensor = as_tensor(tensor, "allreduce")
    wire, ctx = compression.compress(tensor)
    out = _differentiable_allreduce([wire], [op_name("allreduce", name)], op, prescale_factor,
                                    postscale_factor)[0]
    return compression.decompress(out, ctx)


def _allreduce_slices(slices: tf.IndexedSlices, name: str, op: int, compression,
                      scale: float) -> tf.IndexedSlices:
    """Every rank's rows, gathered: summing duplicate indices is left to whoever applies them
    (tf.IndexedSlices semantics), so Sum is exact and Average divides the values by size."""
    if op not in (Sum, Average):
        raise InvalidArgumentError(
            f"tf.IndexedSlices are reduced with op Sum or Average, not "
            f"{OP_NAMES.get(op, op)}; densify first (tf.convert_to_tensor)")
    values = as_tensor(slices.values, "allreduce")
    wire, ctx = compression.compress(values)
    gathered_values, gathered_indices = run_batch(
        [request("allgather", f"{name}.values"), request("allgather", f"{name}.indices")],
        [wire, as_tensor(slices.indices, "allreduce")], "scaleout_allreduce_sparse")
    gathered_values = compression.decompress(gathered_values, ctx)
    factor = scale / _so.size() if op == Average else scale
    if factor != 1.0:
        gathered_values = gathered_values * tf.cast(factor, gathered_values.dtype)
    return tf.IndexedSlices(gathered_values, gathered_indices, slices.dense_shape)


@_not_converted
def grouped_allreduce(tensors, average: Optional[bool] = None, device_dense: str = "",
                      device_sparse: str = "", compression=Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None) -> list:
    """Reduces a list of tensors together, as one op whose tensors the core fuses."""
    _check_device_arg(device_dense, "grouped_allreduce")
    op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    base = op_name("allreduce", name)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, name=f"{base}.{i}")
                for i, t in enumerate(tensors)]
    wires, ctxs = zip(*(compression.compress(as_tensor(t, "grouped_allreduce"))
                        for t in tensors))
    outs = _differentiable_allreduce(list(wires), [f"{base}.{i}" for i in range(len(tensors))],
                                     op, prescale_factor, postscale_factor)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


@_not_converted
def allgather(tensor, name: Optional[str] = None) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank).
    Differentiable: each rank gets the summed gradient of its own rows."""
    x = as_tensor(tensor, "allgather")
    name = op_name("allgather", name)

    @tf.custom_gradient
    def forward(x):
        y = run_batch([request("allgather", name)], [x], "scaleout_allgather")[0]

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            rows = (tf.shape(x, out_type=tf.int64)[0] if x.shape.rank != 0
                    else tf.constant(1, tf.int64))
            g = _gradient_op("allgather", dy, [rows], _out_shape("allgather", x.shape), name)
            return tf.reshape(g, tf.shape(x))
        return y, grad
    return forward(x)


@_not_converted
def broadcast(tensor, root_rank: int, name: Optional[str] = None) -> tf.Tensor:
    """root_rank's tensor, on every rank. Differentiable: the root gets the summed gradient,
    other ranks zeros."""
    x = as_tensor(tensor, "broadcast")
    name = op_name("broadcast", name)
    root_rank = int(root_rank)

    @tf.custom_gradient
    def forward(x):
        y = run_batch([request("broadcast", name, root=root_rank)], [x], "scaleout_broadcast")[0]

        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            return _gradient_op("broadcast", dy, [], dy.shape, name, root_rank)
        return y, grad
    return forward(x)


@_not_converted
def alltoall(tensor, splits=None, name: Optional[str] = None):
    """Sends splits[i] rows of `tensor` (default: equal parts) to rank i and returns the rows
    received, in rank order; with `splits`, returns (received, received_splits). Differentiable
    (the gradient travels back the same way)."""
    x = as_tensor(tensor, "alltoall")
    name = op_name("alltoall", name)
    split_t = None if splits is None else tf.cast(tf.reshape(splits, [-1]), tf.int64)

    def run(data, send_splits, label):
        inputs = [data] if send_splits is None else [data, send_splits]

        def np_fn(a, s=None):
            out, received = _so.alltoall(a, splits=s if s is not None else _equal_splits(a),
                                         name=label)
            return [out, received.astype(np.int32)]
        return call(np_fn, inputs, [data.dtype, tf.int32],
                    [_out_shape("alltoall", data.shape), tf.TensorShape([_so.size()])],
                    "scaleout_alltoall")

    @tf.custom_gradient
    def forward(x):
        out, received = run(x, split_t, name)

        def grad(dy, _unused):
            dy = tf.convert_to_tensor(dy)
            back = _gradient_op("alltoall", dy, [tf.cast(received, tf.int64)],
                                _out_shape("alltoall", dy.shape), name)
            return tf.reshape(back, tf.shape(x))
        return (out, received), grad
    out, received = forward(x)
    return out if splits is None else (out, received)


def _equal_splits(a: np.ndarray) -> np.ndarray:
    n = _so.size()
    rows = a.shape[0] if a.ndim else 1
    if rows % n:
        raise InvalidArgumentError(f"alltoall without splits needs a first dimension divisible "
                                   f"by the number of ranks ({rows} rows, {n} ranks)")
    return np.full(n, rows // n, np.int64)


@_not_converted
def reducescatter(tensor, op: Optional[int] = None, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  compression=Compression.none) -> tf.Tensor:
    """Reduces `tensor` across ranks (default Average) and gives each rank its slice of the first
    dimension (the first dim % size ranks get one row more). Differentiable for Sum/Average."""
    op = resolve_op(op, None)
    x = as_tensor(tensor, "reducescatter")
    name = op_name("reducescatter", name)
    wire, ctx = compression.compress(x)

    @tf.custom_gradient
    def forward(w):
        y = run_batch([request("reducescatter", name, op, prescale_factor, postscale_factor)],
                      [w], "scaleout_reducescatter")[0]

        def grad(dy):
            _semantics.check_gradient_op("reducescatter", op)
            dy = tf.convert_to_tensor(dy)
            g = _gradient_op("reducescatter", dy, [], _out_shape("allgather", w.shape), name, op,
                             prescale_factor, postscale_factor)
            return tf.reshape(g, tf.shape(w))
        return y, grad
    return compression.decompress(forward(wire), ctx)


@_not_converted
def join() -> tf.Tensor:
    """Marks this rank as out of data (its allreduces contribute zeros until every rank joined);
    blocks until all ranks joined and returns the last rank to join, as an int32 scalar."""
    return call(lambda: [np.asarray(_so.join(), np.int32)], [], [tf.int32],
                [tf.TensorShape([])], "scaleout_join")[0]


@_not_converted
def barrier(name: Optional[str] = None) -> None:
    """Returns once every rank has reached the barrier (in a graph: when the op runs)."""
    name = op_name("barrier", name)

    def np_fn():
        _so.barrier(name=name)
        return []
    call(np_fn, [], [], [], "scaleout_barrier")


def _variable_label(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", "") or ""


@_not_converted
def broadcast_variables(variables, root_rank: int, name: Optional[str] = None):
    """Assigns root_rank's values to `variables` (tf.Variable or Keras variables) on every rank,
    all in one op. Eagerly returns None; in a graph returns the assign op."""
    variables = list(variables)
    if not variables:
        return None
    base = name or "broadcast_variables"
    labels = [f"{base}.{i}.{_variable_label(v)}" for i, v in enumerate(variables)]
    values = run_batch([request("broadcast", n, root=int(root_rank)) for n in labels],
                       [as_tensor(v, "broadcast_variables") for v in variables],
                       "scaleout_broadcast_variables")
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    return None if tf.executing_eagerly() else tf.group(*assigns)
