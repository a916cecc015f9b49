"""Collectives on TensorFlow tensors, eagerly and inside tf.function graphs.

Nothing here is compiled against TensorFlow. Eagerly, a collective hands the tensor's host memory
(through DLPack, no copy) to scaleout's numpy-level API. Inside a graph the same Python function
becomes one `tf.numpy_function` op: TensorFlow passes the inputs as numpy arrays, the function
submits every collective of the op to the core asynchronously and then waits for all of them (the
wait releases the GIL), so everything one op carries is negotiated and fused together. Results of
allreduce and broadcast are written into 64-byte-aligned arrays, which TensorFlow adopts as
tensors without a copy.

Note [Graph names]
Ordering and names: inside tf.function, TensorFlow's automatic control
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

from typing import Any, Callable, List, Optional, Sequence, Tuple

import weakref

import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout import _gradient_rules, _naming
from scaleout._arrays import address, splits_array, submit_into, submit_owned
from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._native import (ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, COLLECTIVE_CODES,
                              DTYPE_CODES, OP_NAMES, REDUCESCATTER, Average, Sum, auto_name,
                              resolve_op, submit, synchronize, wait_all)
from scaleout._process_sets import global_process_set, process_set_id, set_rank, set_size
from scaleout.tensorflow import _errors
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._errors import UnsupportedError, tf_errors, typed

__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
           "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier",
           "broadcast_variables", "check_device", "size_op", "local_size_op", "rank_op",
           "local_rank_op", "process_set_included_op"]

_errors.install()  # graph errors as their scaleout and tf.errors classes (Note [TF error types])

# The dtypes the core reduces, from its table.
_SUPPORTED_DTYPES = tuple(tf.as_dtype(name) for name in DTYPE_CODES)

# One request of a batch: (kind, name, reduce op, prescale, postscale, root rank, process set:
# the core's id). The values are passed to the core as given: the binding checks them (a float
# root rank or a string scale factor is an InvalidArgumentError, not silently converted).
Request = Tuple[str, str, int, float, float, int, int]


def request(kind: str, name: str, op: int = Sum, prescale: float = 1.0, postscale: float = 1.0,
            root: int = 0, process_set: int = 0) -> Request:
    return (kind, name, op, prescale, postscale, root, process_set)


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


def op_name(kind: str, name: Optional[str], ignore_name_scope: bool = False,
            process_set: int = 0) -> str:
    """The collective's name: the given one, else one from the call site (Note [Graph names]).
    In a graph a given name is prefixed with the current name scope unless
    `ignore_name_scope`, as Horovod's op names are. Generated names are counted per process set
    (names are scoped per set in the core), so that building ops on a set that only some ranks
    use does not shift the names of the other sets' ops."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, not {name!r}")
        if tf.executing_eagerly() or ignore_name_scope:
            return name
        scope = tf.compat.v1.get_default_graph().get_name_scope()
        return f"{scope}/{name}" if scope else name
    if tf.executing_eagerly():
        return auto_name(COLLECTIVE_CODES[kind], None, process_set)
    graph = tf.compat.v1.get_default_graph()
    base = f"scaleout_{kind}" if process_set == 0 else f"scaleout_{kind}_set{process_set}"
    if ignore_name_scope:
        with graph.name_scope(None):
            return graph.unique_name(base)
    return graph.unique_name(base)


def set_id(process_set, what: str) -> int:
    """The core's id of a `process_set=` argument (a ProcessSet; None or global_process_set: 0),
    read when the op is built, as Horovod's ops take it as an attribute. Not a ProcessSet, or
    not registered: InvalidArgumentError. Ranks outside the set are refused by the core when the
    collective is submitted."""
    return process_set_id(process_set, what)


# ---- running numpy-level work eagerly or as a graph op ----

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
    op = outs.op if isinstance(outs, tf.Tensor) else (
        outs if isinstance(outs, tf.Operation) else (outs[0].op if outs else None))
    if op is not None:
        _last_graph_op[graph] = (op, context)
    return outs


def call(np_fn: Callable[..., list], inputs: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
         out_shapes: Sequence, what: str, chain: bool = True) -> List[tf.Tensor]:
    """Runs `np_fn(*arrays) -> list of arrays` now (eagerly) or as one stateful graph op. Errors
    leave as their TensorFlow-typed classes (scaleout.tensorflow._errors)."""
    try:
        _so.size()  # NotInitializedError now, at trace time in a graph, rather than at run time
    except ScaleoutError as e:
        raise typed(e) from None
    np_fn = _not_converted(np_fn)  # else autograph would wrap it, at a cost on every run
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
    outs = _chained_op(graph, lambda: tf.numpy_function(
        _not_converted(typed_fn), list(inputs), list(out_dtypes), stateful=True,
        name=what.replace(" ", "_")), chain)
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


def _submit(req: Request, array: np.ndarray) -> _so.Handle:
    """One request of a batch. allreduce and broadcast write into a new aligned array (which
    TensorFlow adopts without a copy); the others' results are the core's bytes."""
    kind, name, op, prescale, postscale, root, ps = req
    if kind == "allreduce":
        a = np.asarray(array)
        return submit_into(ALLREDUCE, name, a, output=aligned_empty(a.shape, a.dtype), op=op,
                           prescale_factor=prescale, postscale_factor=postscale, process_set=ps)
    if kind == "allgather":
        return submit_owned(ALLGATHER, name, array, process_set=ps)
    if kind == "broadcast":
        a = np.asarray(array)
        return submit_into(BROADCAST, name, a, output=aligned_empty(a.shape, a.dtype),
                           root_rank=root, process_set=ps)
    if kind == "reducescatter":
        return submit_owned(REDUCESCATTER, name, array, op=op, prescale_factor=prescale,
                            postscale_factor=postscale, process_set=ps)
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
              what: str = "scaleout_batch", chain: bool = True) -> List[tf.Tensor]:
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
                [_out_shape(req[0], t.shape) for req, t in zip(requests, tensors)], what, chain)


# ---- gradients ----
#
# The rules are scaleout._gradient_rules' (Horovod's definitions, shared with scaleout.torch); each
# gradient that needs more than one collective runs them in one op, on numpy arrays.

def _gradient_op(what: str, process_set: int, dy: tf.Tensor, tensors: Sequence[tf.Tensor],
                 out_shape, *args) -> tf.Tensor:
    """One op applying collective `what`'s gradient rule: rule(ops, dy, *args, *tensors), with
    dy and `tensors` as numpy arrays (scalars as Python ints), on the forward's process set."""
    rule = _gradient_rules.gradient(what)
    ops = _gradient_rules.numpy_ops(process_set)

    def np_fn(g, *more):
        more = [int(m) if np.ndim(m) == 0 else m for m in more]
        return [np.asarray(rule(ops, g, *args, *more))]
    return call(np_fn, [dy, *tensors], [dy.dtype], [out_shape], f"scaleout_{what}_grad")[0]



def _typed_gradient(grad_fn):
    """A custom gradient function whose scaleout errors (raised while TensorFlow builds or runs
    the backward pass) leave as their TensorFlow-typed classes."""
    def wrapper(*args, **kwargs):
        try:
            return grad_fn(*args, **kwargs)
        except ScaleoutError as e:
            raise typed(e) from None
    return wrapper


def _differentiable_allreduce(tensors: List[tf.Tensor], names: List[str], op: int,
                              prescale: float, postscale: float,
                              process_set: int = 0) -> List[tf.Tensor]:
    # The total loss is the sum of every rank's loss, so the gradient of a Sum (Average) is the
    # Sum (Average) of the incoming gradients, with the same scale factors, on the same set.
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch([request("allreduce", n, op, prescale, postscale, 0, process_set)
                        for n in names], xs, "scaleout_allreduce")

        @_typed_gradient
        def grad(*dys):
            _gradient_rules.check_gradient_op("allreduce", op)
            return run_batch([request("allreduce", _naming.gradient(n), op, prescale, postscale,
                                      0, process_set) for n in names],
                             [tf.convert_to_tensor(d) for d in dys], "scaleout_allreduce_grad")
        return ys, grad
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _differentiable_allgather(tensors: List[tf.Tensor], names: List[str],
                              process_set: int = 0) -> List[tf.Tensor]:
    # Horovod's definition: each rank gets its own rows of the Average-allreduce of the output
    # gradients over the set (scaleout._gradient_rules; rows in the set's order).
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch([request("allgather", n, process_set=process_set) for n in names], xs,
                       "scaleout_allgather")

        @_typed_gradient
        def grad(*dys):
            out = []
            for x, dy, n in zip(xs, dys, names):
                dy = tf.convert_to_tensor(dy)
                rows = (tf.shape(x, out_type=tf.int64)[0] if x.shape.rank != 0
                        else tf.constant(1, tf.int64))
                g = _gradient_op("allgather", process_set, dy, [rows],
                                 _out_shape("allgather", x.shape), n)
                out.append(tf.reshape(g, tf.shape(x)))
            return out
        return ys, grad
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _differentiable_reducescatter(tensors: List[tf.Tensor], names: List[str], op: int,
                                  prescale: float, postscale: float,
                                  process_set: int = 0) -> List[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs):
        ys = run_batch([request("reducescatter", n, op, prescale, postscale, 0, process_set)
                        for n in names], xs, "scaleout_reducescatter")

        @_typed_gradient
        def grad(*dys):
            _gradient_rules.check_gradient_op("reducescatter", op)
            out = []
            for x, dy, n in zip(xs, dys, names):
                g = _gradient_op("reducescatter", process_set, tf.convert_to_tensor(dy), [],
                                 _out_shape("allgather", x.shape), n, op, prescale, postscale)
                out.append(tf.reshape(g, tf.shape(x)))
            return out
        return ys, grad
    out = forward(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# ---- public collectives (Horovod 0.28.1's signatures) ----

def _check_devices(what: str, *devices: str) -> None:
    for device in devices:
        if device:
            check_device(device, what)


def _compressed(tensors, compression, what: str):
    wires, ctxs = [], []
    for t in tensors:
        wire, ctx = compression.compress(as_tensor(t, what))
        wires.append(wire)
        ctxs.append(ctx)
    return wires, ctxs


@tf_errors
def allreduce(tensor, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set=global_process_set,
              ignore_name_scope: bool = False):
    """Reduces `tensor` across ranks (default op Average). A tf.IndexedSlices is reduced by
    gathering its values and indices (Sum and Average only; unlike Horovod, scale factors work
    on them too). Differentiable for Sum and Average. `device_dense`/`device_sparse`: CPU only
    (an error names any other device). `process_set`: reduce across that set's ranks only
    (Average divides by its size; the gradient runs on the same set).
    `ignore_name_scope`: in a graph, do not prefix `name` with the current name scope."""
    _check_devices("allreduce", device_dense, device_sparse)
    ps = set_id(process_set, "allreduce")
    op = resolve_op(op, average)
    name = op_name("allreduce", name, ignore_name_scope, ps)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_slices([tensor], [name], op, compression,
                                 prescale_factor * postscale_factor, ps)[0]
    [wire], [ctx] = _compressed([tensor], compression, "allreduce")
    out = _differentiable_allreduce([wire], [name], op, prescale_factor, postscale_factor,
                                    ps)[0]
    return compression.decompress(out, ctx)


def _allreduce_slices(slices: Sequence[tf.IndexedSlices], names: Sequence[str], op: int,
                      compression, scale: float, process_set: int = 0
                      ) -> List[tf.IndexedSlices]:
    if op not in (Sum, Average):
        raise UnsupportedError(f"allreduce of tf.IndexedSlices supports the Sum and Average ops "
                               f"only, not {OP_NAMES.get(op, op)} (as Horovod)")
    values, ctxs = _compressed([s.values for s in slices], compression, "allreduce")
    indices = [as_tensor(s.indices, "allreduce") for s in slices]
    gathered = _differentiable_allgather(
        values + indices, [_naming.part(n, _naming.VALUES) for n in names]
        + [_naming.part(n, _naming.INDICES) for n in names],
        process_set)
    factor = scale / set_size(process_set) if op == Average else scale
    out = []
    for i, s in enumerate(slices):
        v = compression.decompress(gathered[i], ctxs[i])
        if factor != 1.0:
            v = v * tf.cast(factor, v.dtype)
        out.append(tf.IndexedSlices(v, gathered[len(slices) + i], s.dense_shape))
    return out


@tf_errors
def grouped_allreduce(tensors, average: Optional[bool] = None, device_dense: str = "",
                      device_sparse: str = "", compression=Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None) -> list:
    """Reduces a list of tensors (and tf.IndexedSlices) together, as one op whose tensors the
    core fuses. Arguments as allreduce."""
    _check_devices("grouped_allreduce", device_dense, device_sparse)
    ps = set_id(process_set, "grouped_allreduce")
    op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = op_name("allreduce", name, ignore_name_scope, ps)
    out: List[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        for i, r in zip(sparse, _allreduce_slices([tensors[i] for i in sparse],
                                                  [_naming.member(base, i) for i in sparse], op,
                                                  compression,
                                                  prescale_factor * postscale_factor, ps)):
            out[i] = r
    if dense:
        wires, ctxs = _compressed([tensors[i] for i in dense], compression, "grouped_allreduce")
        reduced = _differentiable_allreduce(wires, [_naming.member(base, i) for i in dense], op,
                                            prescale_factor, postscale_factor, ps)
        for i, r, c in zip(dense, reduced, ctxs):
            out[i] = compression.decompress(r, c)
    return out


@tf_errors
def allgather(tensor, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set=global_process_set) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank),
    in the order of the ranks of `process_set`. Differentiable (Horovod's definition: each rank
    gets its rows of the gradient averaged over the set)."""
    ps = set_id(process_set, "allgather")
    x = as_tensor(tensor, "allgather")
    return _differentiable_allgather([x], [op_name("allgather", name, ignore_name_scope, ps)],
                                     ps)[0]


@tf_errors
def grouped_allgather(tensors, name: Optional[str] = None, ignore_name_scope: bool = False,
                      process_set=global_process_set) -> list:
    """allgather of each tensor of a list, as one op (the core negotiates them together).
    Differentiable as allgather."""
    ps = set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = op_name("allgather", name, ignore_name_scope, ps)
    xs = [as_tensor(t, "grouped_allgather") for t in tensors]
    return _differentiable_allgather(xs, _naming.members(base, len(xs)), ps)


@tf_errors
def broadcast(tensor, root_rank: int, name: Optional[str] = None,
              ignore_name_scope: bool = False, process_set=global_process_set) -> tf.Tensor:
    """root_rank's tensor, on every rank of `process_set` (root_rank is the job's rank, as in
    Horovod). Differentiable (Horovod's definition: the root gets the gradient averaged over the
    set, other ranks zeros)."""
    ps = set_id(process_set, "broadcast")
    x = as_tensor(tensor, "broadcast")
    name = op_name("broadcast", name, ignore_name_scope, ps)

    @tf.custom_gradient
    def forward(x):
        y = run_batch([request("broadcast", name, root=root_rank, process_set=ps)], [x],
                      "scaleout_broadcast")[0]

        @_typed_gradient
        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            return _gradient_op("broadcast", ps, dy, [], dy.shape, name, root_rank)
        return y, grad
    return forward(x)


def _is_variable(v) -> bool:
    return isinstance(v, tf.Variable) or hasattr(v, "assign") and hasattr(v, "dtype")


@tf_errors
def broadcast_(variables, root_rank: int, name: Optional[str] = None,
               process_set=global_process_set):
    """Assigns root_rank's values to `variables` (a list of tf.Variable, or one) in place and
    returns their new values (a list, or one tensor for one variable), as Horovod's. All go in
    one op; in a graph the values are read after the assignments."""
    ps = set_id(process_set, "broadcast_")
    single = _is_variable(variables)
    variables = [variables] if single else list(variables)
    if not variables:
        return []
    for v in variables:
        if not _is_variable(v):
            raise InvalidArgumentError(f"broadcast_ assigns in place: pass tf.Variable objects, "
                                       f"not {type(v).__name__}")
    values = _broadcast_into(variables, root_rank, name or "broadcast_", chain=True,
                             process_set=ps)
    return values[0] if single else values


def _broadcast_into(variables, root_rank: int, base: str, chain: bool,
                    process_set: int = 0) -> list:
    # By position only: Keras variable paths come from per-process name counters, and a model
    # loaded on the root only may name its variables differently from the others' (a wrong
    # order still fails, as a shape or dtype mismatch naming the tensor).
    labels = _naming.members(base, len(variables))
    values = run_batch([request("broadcast", n, root=root_rank, process_set=process_set)
                        for n in labels],
                       [as_tensor(v, "broadcast_variables") for v in variables],
                       "scaleout_broadcast_variables", chain)
    if tf.executing_eagerly() or tf.inside_function():
        for v, x in zip(variables, values):
            v.assign(x)
        # in tf.function, automatic control dependencies order these reads after the assigns
        return [tf.convert_to_tensor(v) for v in variables]
    # A TF1 graph: the values read after the assign ops, which running them runs.
    assigns = [v.assign(x, read_value=False) for v, x in zip(variables, values)]
    with tf.control_dependencies([a for a in assigns if a is not None]):
        return [tf.identity(v) for v in variables]


@tf_errors
def alltoall(tensor, splits=None, name: Optional[str] = None, ignore_name_scope: bool = False,
             process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (default: equal parts) to the i-th rank of
    `process_set` and returns the rows received, in the set's rank order; with `splits`, returns
    (received, received_splits). Differentiable (the gradient travels back the same way)."""
    ps = set_id(process_set, "alltoall")
    x = as_tensor(tensor, "alltoall")
    name = op_name("alltoall", name, ignore_name_scope, ps)
    split_t = None
    if splits is not None:
        split_t = tf.convert_to_tensor(splits) if not isinstance(splits, (str, bytes)) else None
        if split_t is None or not split_t.dtype.is_integer:
            raise InvalidArgumentError(f"splits must be integers (rows per rank), not {splits!r}")
        split_t = tf.cast(tf.reshape(split_t, [-1]), tf.int64)

    def run(data, send_splits, label):
        inputs = [data] if send_splits is None else [data, send_splits]

        def np_fn(a, s=None):
            sent = splits_array(s if s is not None else _equal_splits(a, ps))
            out, received = synchronize(submit_owned(ALLTOALL, label, a, splits=sent,
                                                     process_set=ps))
            return [out, np.asarray(received, np.int32)]
        return call(np_fn, inputs, [data.dtype, tf.int32],
                    [_out_shape("alltoall", data.shape), tf.TensorShape([set_size(ps)])],
                    "scaleout_alltoall")

    @tf.custom_gradient
    def forward(x):
        out, received = run(x, split_t, name)

        @_typed_gradient
        def grad(dy, _unused):
            dy = tf.convert_to_tensor(dy)
            back = _gradient_op("alltoall", ps, dy, [tf.cast(received, tf.int64)],
                                _out_shape("alltoall", dy.shape), name)
            return tf.reshape(back, tf.shape(x))
        return (out, received), grad
    out, received = forward(x)
    return out if splits is None else (out, received)


def _equal_splits(a: np.ndarray, process_set: int = 0) -> np.ndarray:
    n = set_size(process_set)
    rows = a.shape[0] if a.ndim else 1
    if rows % n:
        raise InvalidArgumentError(f"alltoall without splits needs a first dimension divisible "
                                   f"by the number of ranks ({rows} rows, {n} ranks"
                                   f"{'' if process_set == 0 else ' in the process set'})")
    return np.full(n, rows // n, np.int64)


@tf_errors
def reducescatter(tensor, device_dense: str = "", compression=Compression.none,
                  op: Optional[int] = Average, name: Optional[str] = None,
                  process_set=global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces `tensor` across ranks (default Average) and gives each rank its slice of the first
    dimension (the first dim % size ranks get one row more). Differentiable for Sum/Average
    (Horovod's definition: the allgather of the output gradients, times size() for Sum)."""
    _check_devices("reducescatter", device_dense)
    ps = set_id(process_set, "reducescatter")
    op = resolve_op(op, None)
    [wire], [ctx] = _compressed([tensor], compression, "reducescatter")
    name = op_name("reducescatter", name, ignore_name_scope, ps)
    out = _differentiable_reducescatter([wire], [name], op, prescale_factor, postscale_factor,
                                        ps)[0]
    return compression.decompress(out, ctx)


@tf_errors
def grouped_reducescatter(tensors, device_dense: str = "", compression=Compression.none,
                          op: Optional[int] = Average, process_set=global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None, ignore_name_scope: bool = False) -> list:
    """reducescatter of each tensor of a list, as one op. Arguments as reducescatter (`name` and
    `ignore_name_scope` are scaleout's additions)."""
    _check_devices("grouped_reducescatter", device_dense)
    ps = set_id(process_set, "grouped_reducescatter")
    op = resolve_op(op, None)
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = op_name("reducescatter", name, ignore_name_scope, ps)
    wires, ctxs = _compressed(tensors, compression, "grouped_reducescatter")
    outs = _differentiable_reducescatter(wires, _naming.members(base, len(wires)), op,
                                         prescale_factor, postscale_factor, ps)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


@tf_errors
def join(process_set=global_process_set) -> tf.Tensor:
    """Marks this rank as out of data (its allreduces contribute zeros until every rank of the
    set joined); blocks until all joined and returns the (job's) rank that joined last, as an
    int32 scalar."""
    set_id(process_set, "join")
    return call(lambda: [np.asarray(_so.join(process_set), np.int32)], [], [tf.int32],
                [tf.TensorShape([])], "scaleout_join")[0]


@tf_errors
def barrier(name: Optional[str] = None, process_set=global_process_set):
    """Returns once every rank of `process_set` has reached the barrier. In a tf.compat.v1
    graph it returns the op to run (scaleout's addition; Horovod's TensorFlow module has no
    barrier)."""
    ps = set_id(process_set, "barrier")
    name = op_name("barrier", name, process_set=ps)

    def np_fn():
        synchronize(submit(BARRIER, name=name, address=0, dtype=0, shape=(), process_set=ps))
        return []
    outs = call(np_fn, [], [], [], "scaleout_barrier")
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return outs[0] if outs else None


def _variable_label(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", "") or ""


@tf_errors
def broadcast_variables(variables, root_rank: int, process_set=global_process_set,
                        inplace: bool = False, name: Optional[str] = None):
    """Assigns root_rank's values to `variables` (tf.Variable or Keras variables) on every rank,
    all in one op. As Horovod's: by default eagerly returns None and in a graph the op that
    assigns them; with `inplace=True` (Horovod: without temporary copies) returns the variables'
    new values, as broadcast_. scaleout copies through the core either way. With
    `process_set`, only that set's ranks take part (root_rank is the job's rank)."""
    ps = set_id(process_set, "broadcast_variables")
    variables = list(variables)
    if not variables:
        return [] if inplace else None
    values = _broadcast_into(variables, root_rank, name or "broadcast_variables",
                             chain=False, process_set=ps)
    if inplace:
        return values
    if tf.executing_eagerly():
        return None
    return tf.group(*[v.op for v in values])


# ---- Horovod's graph-time queries: values read when the op runs, not when it is built ----

def _query_op(fn: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    def typed_fn():
        try:
            return np.int32(fn())
        except ScaleoutError as e:  # its class name travels in the graph error's message
            raise typed(e) from None
    if tf.executing_eagerly():
        return tf.constant(typed_fn(), tf.int32)
    out = tf.numpy_function(_not_converted(typed_fn), [], tf.int32, stateful=True,
                            name=name or "scaleout_query")
    out.set_shape([])
    return out


# Horovod's code for an unknown process set (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET), which its
# process_set_included_op returns instead of 0 or 1.
PROCESS_SET_ERROR_UNKNOWN_SET = -3


def _query_set_id(process_set_id, what: str) -> int:
    """Horovod's query ops take the set's integer id (`ps.process_set_id`), not the set."""
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, (int, np.integer)):
        raise InvalidArgumentError(f"{what}: process_set_id must be a process set's integer id "
                                   f"(ProcessSet.process_set_id; 0: the global set), not "
                                   f"{process_set_id!r}")
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
