"""Collectives on TensorFlow tensors, eagerly and inside tf.function graphs, with Horovod
0.28.1's signatures.

Each checks and converts its arguments while the op is built (_arguments.py), then runs as one
op (_op_runner.py: eagerly, or a `tf.numpy_function` in a graph), through its differentiable
form where it has a gradient (_differentiable.py). Horovod's graph-time queries (size_op, ...)
are in _queries.py.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf

import scaleout as _so
from scaleout import _naming
from scaleout._errors import InvalidArgumentError
from scaleout._native import (
    BARRIER,
    OP_NAMES,
    Adasum,
    Average,
    Sum,
    resolve_op,
    submit,
    synchronize,
)
from scaleout._process_sets import global_process_set, set_size
from scaleout.tensorflow._arguments import (
    as_tensor,
    check_devices,
    compressed,
    is_variable,
    op_name,
    set_id,
)
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._differentiable import (
    differentiable_allgather,
    differentiable_allreduce,
    differentiable_alltoall,
    differentiable_broadcast,
    differentiable_reducescatter,
)
from scaleout.tensorflow._errors import UnsupportedError, tf_errors
from scaleout.tensorflow._horovod_names import reserve
from scaleout.tensorflow._op_runner import call, request, run_batch

__all__ = [
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
]


@tf_errors
def allreduce(
    tensor,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set=global_process_set,
    ignore_name_scope: bool = False,
):
    """Reduces `tensor` across ranks (default op Average). A tf.IndexedSlices is reduced by
    gathering its values and indices, uncompressed, as Horovod (Sum and Average only, no scale
    factors: check_slices). Differentiable for Sum and Average. `device_dense`/`device_sparse`:
    CPU only (an error names any other device). `process_set`: reduce across that set's ranks only
    (Average divides by its size; the gradient runs on the same set).
    Names: Note [Graph names]; `ignore_name_scope`: in a graph, only what follows the last '/'
    of the op's name."""
    check_devices("allreduce", device_dense, device_sparse)
    ps = set_id(process_set, "allreduce")
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        check_slices(op, prescale_factor, postscale_factor)
        return _allreduce_slices([tensor], name, op, ps, ignore_name_scope, grouped=False)[0]
    if not tf.executing_eagerly():
        reserve("Cast")  # Horovod's allreduce casts the set's size first: a compression's is Cast_1
    [wire], [ctx] = compressed([tensor], compression, "allreduce")
    name = op_name("allreduce", name, ignore_name_scope, ps, [wire])
    out = differentiable_allreduce([wire], [name], op, prescale_factor, postscale_factor, ps)[0]
    return compression.decompress(out, ctx)


def check_slices(op: int, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> None:
    """What Horovod refuses for a tf.IndexedSlices (NotImplementedError, in its words), before
    anything runs: ops other than Sum and Average, and scale factors (a gradient tape's or
    optimizer's gradient_predivide_factor other than 1 among them)."""
    if op == Adasum:
        raise UnsupportedError(
            "The Adasum reduction does not currently support sparse tensors. As a workaround "
            "please pass sparse_as_dense=True to DistributedOptimizer"
        )
    if op not in (Sum, Average):
        raise UnsupportedError(
            f"Only Sum and Average ops are supported with tf.IndexedSlices, not "
            f"{OP_NAMES.get(op, op)}"
        )
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise UnsupportedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _allreduce_slices(
    slices: Sequence[tf.IndexedSlices],
    name: Optional[str],
    op: int,
    process_set: int,
    ignore_name_scope: bool,
    grouped: bool,
) -> List[tf.IndexedSlices]:
    """The reduction of tf.IndexedSlices: their values and indices gathered, as Horovod's (in a
    graph named as its allgathers of them, without the allreduce's `name`; eagerly the parts of
    `name`, or of the next generated one)."""
    values = [as_tensor(s.values, "allreduce") for s in slices]
    indices = [as_tensor(s.indices, "allreduce") for s in slices]
    if tf.executing_eagerly():
        base = op_name("allreduce", name, process_set=process_set)
        names = [
            _naming.part(_naming.grouped_member(base, i, len(slices)) if grouped else base, label)
            for label in (_naming.VALUES, _naming.INDICES)
            for i in range(len(slices))
        ]
    else:
        names = []
        for tensors in (values, indices):
            base = op_name("allgather", None, ignore_name_scope, process_set, tensors, grouped)
            names += _naming.grouped_members(base, len(tensors)) if grouped else [base]
    gathered = differentiable_allgather(values + indices, names, process_set)
    out = []
    for i, s in enumerate(slices):
        v = gathered[i]
        if op == Average:
            # Horovod's division: integer values become floating point (TensorFlow's truediv:
            # float32 from 8 and 16 bits, float64 from 32 and 64), floats keep their dtype.
            v = v / tf.cast(set_size(process_set), v.dtype)
        out.append(tf.IndexedSlices(v, gathered[len(slices) + i], s.dense_shape))
    return out


@tf_errors
def grouped_allreduce(
    tensors,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=global_process_set,
    ignore_name_scope: bool = False,
    name: Optional[str] = None,
) -> list:
    """Reduces a list of tensors (and tf.IndexedSlices) together, as one op whose tensors the
    core fuses. Arguments as allreduce."""
    check_devices("grouped_allreduce", device_dense, device_sparse)
    ps = set_id(process_set, "grouped_allreduce")
    op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        return tensors
    out: List[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        check_slices(op, prescale_factor, postscale_factor)
        slices = [tensors[i] for i in sparse]
        for i, r in zip(sparse, _allreduce_slices(slices, name, op, ps, ignore_name_scope, True)):
            out[i] = r
    if dense:
        wires, ctxs = compressed([tensors[i] for i in dense], compression, "grouped_allreduce")
        base = op_name("allreduce", name, ignore_name_scope, ps, wires, grouped=True)
        reduced = differentiable_allreduce(
            wires,
            _naming.grouped_members(base, len(dense)),
            op,
            prescale_factor,
            postscale_factor,
            ps,
        )
        for i, r, c in zip(dense, reduced, ctxs):
            out[i] = compression.decompress(r, c)
    return out


@tf_errors
def allgather(
    tensor,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set=global_process_set,
) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension (which may differ by rank),
    in the order of the ranks of `process_set`. Differentiable (Horovod's definition: each rank
    gets its rows of the gradient averaged over the set)."""
    ps = set_id(process_set, "allgather")
    x = as_tensor(tensor, "allgather")
    name = op_name("allgather", name, ignore_name_scope, ps, [x])
    return differentiable_allgather([x], [name], ps)[0]


@tf_errors
def grouped_allgather(
    tensors,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set=global_process_set,
) -> list:
    """allgather of each tensor of a list, as one op (the core negotiates them together).
    Differentiable as allgather."""
    ps = set_id(process_set, "grouped_allgather")
    tensors = list(tensors)
    if not tensors:
        return tensors
    xs = [as_tensor(t, "grouped_allgather") for t in tensors]
    base = op_name("allgather", name, ignore_name_scope, ps, xs, grouped=True)
    return differentiable_allgather(xs, _naming.grouped_members(base, len(xs)), ps)


@tf_errors
def broadcast(
    tensor,
    root_rank: int,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set=global_process_set,
) -> tf.Tensor:
    """root_rank's tensor, on every rank of `process_set` (root_rank is the job's rank, as in
    Horovod). Differentiable (Horovod's definition: the root gets the gradient averaged over the
    set, other ranks zeros)."""
    ps = set_id(process_set, "broadcast")
    x = as_tensor(tensor, "broadcast")
    name = op_name("broadcast", name, ignore_name_scope, ps, [x])
    return differentiable_broadcast(x, name, root_rank, ps)


@tf_errors
def broadcast_(
    variables, root_rank: int, name: Optional[str] = None, process_set=global_process_set
):
    """Assigns root_rank's values to `variables` (a list of tf.Variable, or one) in place and
    returns their new values (a list, or one tensor for one variable), as Horovod's. All go in
    one op; in a graph the values are read after the assignments."""
    ps = set_id(process_set, "broadcast_")
    single = is_variable(variables)
    variables = [variables] if single else list(variables)
    if not variables:
        return []
    for v in variables:
        if not is_variable(v):
            raise InvalidArgumentError(
                f"broadcast_ assigns in place: pass tf.Variable objects, not {type(v).__name__}"
            )
    values = _broadcast_into(variables, root_rank, name or "broadcast_", chain=True, process_set=ps)
    return values[0] if single else values


def _broadcast_into(
    variables, root_rank: int, base: str, chain: bool, process_set: int = 0
) -> list:
    # By position only: Keras variable paths come from per-process name counters, and a model
    # loaded on the root only may name its variables differently from the others' (a wrong
    # order still fails, as a shape or dtype mismatch naming the tensor).
    labels = _naming.members(base, len(variables))
    values = run_batch(
        [request("broadcast", n, root=root_rank, process_set=process_set) for n in labels],
        [as_tensor(v, "broadcast_variables") for v in variables],
        "scaleout_broadcast_variables",
        chain,
    )
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
def alltoall(
    tensor,
    splits=None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set=global_process_set,
):
    """Sends splits[i] rows of `tensor` (default: equal parts) to the i-th rank of
    `process_set` and returns the rows received, in the set's rank order; with `splits`, returns
    (received, received_splits). Differentiable (the gradient travels back the same way)."""
    ps = set_id(process_set, "alltoall")
    x = as_tensor(tensor, "alltoall")
    name = op_name("alltoall", name, ignore_name_scope, ps, [x])
    split_t = None
    if splits is not None:
        split_t = tf.convert_to_tensor(splits) if not isinstance(splits, (str, bytes)) else None
        if split_t is None or not split_t.dtype.is_integer:
            raise InvalidArgumentError(f"splits must be integers (rows per rank), not {splits!r}")
        split_t = tf.cast(tf.reshape(split_t, [-1]), tf.int64)
    out, received = differentiable_alltoall(x, split_t, name, ps)
    return out if splits is None else (out, received)


@tf_errors
def reducescatter(
    tensor,
    device_dense: str = "",
    compression=Compression.none,
    op: Optional[int] = Average,
    name: Optional[str] = None,
    process_set=global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduces `tensor` across ranks (default Average) and gives each rank its slice of the first
    dimension (the first dim % size ranks get one row more). Differentiable for Sum/Average
    (Horovod's definition: the allgather of the output gradients, times size() for Sum)."""
    check_devices("reducescatter", device_dense)
    ps = set_id(process_set, "reducescatter")
    op = resolve_op(op, None)
    [wire], [ctx] = compressed([tensor], compression, "reducescatter")
    name = op_name("reducescatter", name, ignore_name_scope, ps, [wire])
    out = differentiable_reducescatter([wire], [name], op, prescale_factor, postscale_factor, ps)[0]
    return compression.decompress(out, ctx)


@tf_errors
def grouped_reducescatter(
    tensors,
    device_dense: str = "",
    compression=Compression.none,
    op: Optional[int] = Average,
    process_set=global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
) -> list:
    """reducescatter of each tensor of a list, as one op. Arguments as reducescatter (`name` and
    `ignore_name_scope` are scaleout's additions)."""
    check_devices("grouped_reducescatter", device_dense)
    ps = set_id(process_set, "grouped_reducescatter")
    op = resolve_op(op, None)
    tensors = list(tensors)
    if not tensors:
        return tensors
    wires, ctxs = compressed(tensors, compression, "grouped_reducescatter")
    base = op_name("reducescatter", name, ignore_name_scope, ps, wires, grouped=True)
    outs = differentiable_reducescatter(
        wires, _naming.grouped_members(base, len(wires)), op, prescale_factor, postscale_factor, ps
    )
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


@tf_errors
def join(process_set=global_process_set) -> tf.Tensor:
    """Marks this rank as out of data (its allreduces contribute zeros until every rank of the
    set joined); blocks until all joined and returns the (job's) rank that joined last, as an
    int32 scalar."""
    set_id(process_set, "join")
    return call(
        lambda: [np.asarray(_so.join(process_set), np.int32)],
        [],
        [tf.int32],
        [tf.TensorShape([])],
        "scaleout_join",
    )[0]


@tf_errors
def barrier(name: Optional[str] = None, process_set=global_process_set):
    """Returns once every rank of `process_set` has reached the barrier. In a tf.compat.v1
    graph it returns the op to run (scaleout's addition; Horovod's TensorFlow module has no
    barrier)."""
    ps = set_id(process_set, "barrier")
    name = op_name("barrier", name, process_set=ps)

    def np_fn():
        synchronize(
            submit(BARRIER, name=name, address=0, dtype=0, shape=(), op=Sum, process_set=ps)
        )
        return []

    outs = call(np_fn, [], [], [], "scaleout_barrier")
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return outs[0] if outs else None


@tf_errors
def broadcast_variables(
    variables,
    root_rank: int,
    process_set=global_process_set,
    inplace: bool = False,
    name: Optional[str] = None,
):
    """Assigns root_rank's values to `variables` (tf.Variable or Keras variables) on every rank,
    all in one op. As Horovod's: by default eagerly returns None and in a graph the op that
    assigns them; with `inplace=True` (Horovod: without temporary copies) returns the variables'
    new values, as broadcast_. scaleout copies through the core either way. With
    `process_set`, only that set's ranks take part (root_rank is the job's rank)."""
    ps = set_id(process_set, "broadcast_variables")
    variables = list(variables)
    if not variables:
        return [] if inplace else None
    values = _broadcast_into(
        variables, root_rank, name or "broadcast_variables", chain=False, process_set=ps
    )
    if inplace:
        return values
    if tf.executing_eagerly():
        return None
    return tf.group(*[v.op for v in values])
