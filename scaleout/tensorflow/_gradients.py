"""Averaging gradients across ranks: DistributedGradientTape, and the reduction it shares with the
Keras DistributedOptimizer.

All gradients of a step go to the core in one op (submitted together, then waited for together),
so the core fuses them into a few large messages. Their names are those Horovod's gradient code
gives them (_horovod_names.py), the same on every rank and in every step.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from scaleout._gradient_rules import check_predivide_op, predivided
from scaleout._naming import member, part
from scaleout._native import Average, resolve_op
from scaleout._process_sets import global_process_set, set_size
from scaleout._topk import TopK, given_momentum
from scaleout.tensorflow._arguments import as_tensor, check_device, set_id, variable_label
from scaleout.tensorflow._collectives import check_slices
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._errors import UnsupportedError, tf_errors
from scaleout.tensorflow._horovod_names import gradient_names
from scaleout.tensorflow._op_runner import not_converted, request, run_batch
from scaleout.tensorflow._topk import TopKVariables

__all__ = [
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "reduce_gradients",
    "check_groups",
    "LocalSources",
]


@not_converted
def reduce_gradients(
    grads: Sequence[Any],
    sources: Sequence[Any],
    prefix: str,
    op: int = Average,
    compression=Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    generic_names: bool = False,
    process_set=global_process_set,
    groups=None,
) -> List[Any]:
    """Reduces every gradient across the ranks of `process_set` in one op; None stays None.
    Average divides by the set's size. A tf.IndexedSlices is gathered (values and indices)
    unless `sparse_as_dense`, which reduces it as a dense tensor. Names: Horovod's gradient
    code's, in the name scope `<prefix>_Allreduce` (_horovod_names.gradient_names; eagerly as
    in the tf.function Horovod traces there), after `groups` (Horovod's: batches of gradients
    reduced as grouped ops); `generic_names` (Horovod's use_generic_names): `grad_<i>`, so that
    ranks whose graphs differ still agree."""
    op = resolve_op(op, None)
    ps = set_id(process_set, "gradient reduction")
    size = set_size(ps)
    wire_op, prescale, postscale = predivided(op, float(gradient_predivide_factor), size)
    grads, sources = list(grads), list(sources)
    if isinstance(compression, TopKVariables):
        return _reduce_topk(
            grads, sources, prefix, compression, generic_names, wire_op, prescale, postscale, ps
        )
    for grad, source in zip(grads, sources):
        if isinstance(grad, tf.IndexedSlices) and not sparse_as_dense:
            # As Horovod: gathered uncompressed, and refused with a predivide factor
            try:
                check_slices(op, 1.0 / float(gradient_predivide_factor))
            except UnsupportedError as e:
                what = "" if isinstance(source, tf.Tensor) else f" of {variable_label(source)}"
                raise UnsupportedError(
                    f"sparse gradient{what}: {e} (sparse_as_dense=True reduces it as a "
                    "dense tensor)"
                ) from None

    def compress(grad):
        return compression.compress(as_tensor(grad, "gradient"))

    def densified(grads):
        if not sparse_as_dense:
            return grads
        return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]

    def plan_in_graph(grads):
        with tf.name_scope(f"{prefix}_Allreduce"):
            return gradient_names(densified(grads), sources, compress, generic_names, groups)

    if tf.executing_eagerly():
        key = (prefix, compression, generic_names, sparse_as_dense, _groups_key(groups, sources))
        names = _eager_names(key, grads, plan_in_graph)  # (sparse ones made dense in there)
        grads = densified(grads)
        plan = [
            None if n is None else n if n[0] == "sparse" else ("dense", *compress(g), n[1])
            for g, n in zip(grads, names)
        ]
    else:
        plan = plan_in_graph(grads)

    requests, inputs = [], []
    for grad, step in zip(grads, plan):
        if step is None:
            continue
        if step[0] == "sparse":
            requests += [
                request("allgather", step[1], process_set=ps),
                request("allgather", step[2], process_set=ps),
            ]
            inputs += [as_tensor(grad.values, "gradient"), as_tensor(grad.indices, "gradient")]
        else:
            requests.append(request("allreduce", step[3], wire_op, prescale, postscale, 0, ps))
            inputs.append(step[1])

    outs = iter(run_batch(requests, inputs, "scaleout_reduce_gradients"))
    reduced = []
    for grad, step in zip(grads, plan):
        if step is None:
            reduced.append(None)
        elif step[0] == "dense":
            out = next(outs)
            reduced.append(compression.decompress(out, step[2]))
        else:
            values = next(outs)
            indices = next(outs)
            if op == Average:  # Horovod's division, as allreduce's of a tf.IndexedSlices
                values = values / tf.cast(size, values.dtype)
            reduced.append(tf.IndexedSlices(values, indices, grad.dense_shape))
    return reduced


# The names of eager gradient reductions, per kind of call (Note [Graph names]): Horovod reduces
# eager gradients in a tf.function of `grads`, so they are named as in the graph it traces, once
# per signature. Shapes do not change the names: the signature holds kinds and dtypes only.
_EAGER_NAMES: Dict[tuple, list] = {}


def _eager_names(key: tuple, grads: Sequence[Any], plan_in_graph) -> list:
    specs = [_spec(g) for g in grads]
    key = (key, tuple(repr(s) for s in specs))
    names = _EAGER_NAMES.get(key)
    if names is None:
        traced = []

        def allreduce_grads(grads):  # the parameter names the placeholders: grads, grads_1, ...
            plan = plan_in_graph(grads)
            traced.append(
                [None if p is None else p if p[0] == "sparse" else (p[0], p[3]) for p in plan]
            )
            return []

        tf.function(allreduce_grads, autograph=False).get_concrete_function(specs)
        names = _EAGER_NAMES[key] = traced[0]
    return names


def _spec(grad):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        shape = grad.dense_shape
        return tf.IndexedSlicesSpec(
            dtype=grad.values.dtype,
            indices_dtype=grad.indices.dtype,
            dense_shape_dtype=None if shape is None else shape.dtype,
        )
    return tf.TensorSpec(None, grad.dtype)


def _reduce_topk(grads, sources, prefix, compression, generic_names, op, prescale, postscale, ps):
    """Compression.topk's reduction (Note [Top-k sparsification]), every gradient in one op
    (sparse ones made dense). Its names key the residuals of each variable, so they come from
    the prefix, the gradient's position and its variable's name, eagerly and in any graph
    (Horovod has no top-k: no names of its to match); with `generic_names` the prefix and
    position only."""
    labels, inputs = [], []
    for i, (grad, source) in enumerate(zip(grads, sources)):
        if grad is None:
            continue
        label = part(prefix, f"grad_{i}") if generic_names else member(prefix, i)
        if not generic_names and not isinstance(source, tf.Tensor):
            label = part(label, variable_label(source))
        labels.append(label)
        inputs.append(as_tensor(tf.convert_to_tensor(grad), "gradient"))
    outs = iter(compression.reduce(inputs, labels, op, prescale, postscale, ps) if inputs else [])
    return [None if g is None else next(outs) for g in grads]


def _groups_key(groups, sources):
    """What of `groups` and `sources` the names depend on: lists of variables are matched to the
    sources by identity, so both sets of identities."""
    if isinstance(groups, list):
        return (
            tuple(tuple(id(v) for v in group) for group in groups),
            tuple(id(s) for s in sources),
        )
    return groups


def tape_topk_state(compression, what: str = "DistributedGradientTape"):
    """The compression reduce_gradients takes from a tape's (or TF1 optimizer's) `compression`: a
    TopK becomes its TensorFlow state (TopKVariables), kept in the TopK object itself since a
    tape is made anew at every step; momentum correction needs the momentum as a number."""
    if not isinstance(compression, TopK):
        return compression
    if compression.tf_state is None:
        compression.tf_state = TopKVariables(
            compression, given_momentum(compression, what), "DistributedGradientTape"
        )
    return compression.tf_state


def check_groups(num_groups: int, groups):
    """Horovod's checks of `num_groups` (deprecated, warns) and `groups` (a positive number or a
    list of lists of variables); returns the groups to use."""
    if num_groups:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be "
            "removed (as in Horovod)",
            DeprecationWarning,
            stacklevel=3,
        )
        if groups is None:
            groups = num_groups
    if groups is not None and not isinstance(groups, list):
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
            raise ValueError(
                "groups should be a non-negative integer or a list of list of tf.Variable."
            )
    return groups


def _ref(source):
    return source.ref() if hasattr(source, "ref") else id(source)


class LocalSources:
    """Variables registered as local to this rank (Horovod's register_local_source /
    register_local_var): their gradients are not reduced; with `scale_local_gradients` (Horovod's
    default) they are divided by the size of the process set the others are reduced over, as
    Horovod does, so that a local and a reduced gradient of the same magnitude move their
    variables alike under an averaged loss."""

    def __init__(self, scale_local_gradients: bool) -> None:
        self.refs = {}  # key -> the source, kept alive (Keras variables are keyed by id)
        self.scale = bool(scale_local_gradients)

    def add(self, source) -> None:
        self.refs[_ref(source)] = source

    def split(self, grads, sources):
        """(indices of gradients to reduce, indices of local ones)."""
        shared, local = [], []
        for i, s in enumerate(sources):
            (local if self.refs and _ref(s) in self.refs else shared).append(i)
        return shared, local

    def finish(self, grad, size: int):
        if grad is None or not self.scale:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(
                grad.values / tf.cast(size, grad.values.dtype), grad.indices, grad.dense_shape
            )
        return grad / tf.cast(size, grad.dtype)

    def reduce(self, grads, sources, prefix: str, **options) -> list:
        """Every gradient reduced across ranks, except the local ones (see the class)."""
        grads, sources = list(grads), list(sources)
        shared, local = self.split(grads, sources)
        out = list(grads)
        if any(grads[i] is not None for i in shared):
            reduced = reduce_gradients(
                [grads[i] for i in shared], [sources[i] for i in shared], prefix, **options
            )
            for i, g in zip(shared, reduced):
                out[i] = g
        if local:
            size = set_size(set_id(options.get("process_set"), "gradient reduction"))
            for i in local:
                out[i] = self.finish(grads[i], size)
        return out


class DistributedGradientTape(tf.GradientTape):
    """Wraps a tf.GradientTape so that gradient() returns gradients averaged across ranks.

        with tf.GradientTape() as tape:
            loss = ...
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    Arguments as Horovod 0.28.1's: `op`: Average (default) or Sum. `compression`:
    Compression.none / fp16 / bf16, or scaleout's Compression.topk(...) (made once, outside
    the loop: it keeps the residuals). `sparse_as_dense`: reduce tf.IndexedSlices gradients as
    dense tensors instead of gathering them. `gradient_predivide_factor`: divide by f before the
    sum and by size / f after it. `groups` (a number, or lists of variables) and the deprecated
    `num_groups` are checked as Horovod checks them; all gradients of a call go to the core in
    one op and are fused anyway. `process_set`: reduce over that set's ranks only (Average
    divides by its size; only its ranks may call gradient()).
    `scale_local_gradients`: divide the gradients of sources registered with
    register_local_source by the set's size (Horovod's default, True).
    `device_dense`/`device_sparse`: CPU only. `name` (scaleout's): instead of
    "DistributedGradientTape" in the reductions' name scope (`<name>_Allreduce`, Horovod's).
    gradient(..., use_generic_names=True) names the reductions `grad_<i>`, by position only.
    """

    def __init__(
        self,
        gradtape: tf.GradientTape,
        device_dense: str = "",
        device_sparse: str = "",
        compression=Compression.none,
        sparse_as_dense: bool = False,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups=None,
        process_set=global_process_set,
        scale_local_gradients: bool = True,
        name: Optional[str] = None,
    ):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(
                f"DistributedGradientTape wraps a tf.GradientTape, not {type(gradtape).__name__}"
            )
        groups = _configure(
            "DistributedGradientTape",
            device_dense,
            device_sparse,
            op,
            gradient_predivide_factor,
            num_groups,
            groups,
            process_set,
        )
        # Take over the recorded tape's state (not a copy of the recording), so this object is
        # the tape: it can be used instead of it, also as a context manager.
        self.__dict__.update(gradtape.__dict__)
        self._scaleout_op = resolve_op(op, None)
        self._scaleout_compression = tape_topk_state(compression)
        self._scaleout_sparse_as_dense = bool(sparse_as_dense)
        self._scaleout_predivide = float(gradient_predivide_factor)
        self._scaleout_prefix = name or "DistributedGradientTape"
        self._scaleout_groups = groups
        self._scaleout_local = LocalSources(scale_local_gradients)
        self.process_set = process_set
        self.scale_local_gradients = bool(scale_local_gradients)

    def register_local_source(self, source) -> None:
        """Keeps `source`'s gradient local to this rank: not reduced (see LocalSources)."""
        self._scaleout_local.add(source)

    @not_converted
    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        use_generic_names: bool = False,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        grads = super().gradient(
            target,
            sources,
            output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )
        return _reduce_structure(self, grads, sources, use_generic_names)

    @not_converted
    def get_local_and_global_gradients(
        self, target, sources, output_gradients=None, use_generic_names: bool = False
    ):
        """As Horovod's: (local, global), two lists of (source, gradient) pairs: the sources
        registered with register_local_source and their gradients (scaled as gradient() scales
        them), and the other sources with their gradients reduced across ranks."""
        sources = tf.nest.flatten(sources)
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local_refs = self._scaleout_local.refs
        local, shared = [], []
        for source, grad in zip(sources, grads):
            (local if local_refs and _ref(source) in local_refs else shared).append((source, grad))
        return local, shared


@tf_errors
def _reduce_structure(tape, grads, sources, generic_names: bool):
    flat_grads = tf.nest.flatten(grads)
    flat_sources = tf.nest.flatten(sources)
    reduced = tape._scaleout_local.reduce(
        flat_grads,
        flat_sources,
        tape._scaleout_prefix,
        op=tape._scaleout_op,
        compression=tape._scaleout_compression,
        sparse_as_dense=tape._scaleout_sparse_as_dense,
        gradient_predivide_factor=tape._scaleout_predivide,
        generic_names=generic_names,
        process_set=tape.process_set,
        groups=tape._scaleout_groups,
    )
    return tf.nest.pack_sequence_as(grads, reduced)


@tf_errors
def _configure(
    what: str,
    device_dense,
    device_sparse,
    op,
    gradient_predivide_factor,
    num_groups,
    groups,
    process_set,
):
    """The checks Horovod's DistributedGradientTape and DistributedOptimizer make, in its order;
    returns the groups to use."""
    check_predivide_op(resolve_op(op, None), gradient_predivide_factor)
    predivided(resolve_op(op, None), float(gradient_predivide_factor), 1)  # > 0
    groups = check_groups(num_groups, groups)
    for device in (device_dense, device_sparse):
        if device:
            check_device(device, what)
    set_id(process_set, what)  # a ProcessSet, registered (ranks outside it fail when reducing)
    return groups


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients: bool = True,
) -> DistributedGradientTape:
    """A DistributedGradientTape whose `local_layers` (Keras layers; one or a list) keep their
    gradients local: their trainable weights are registered with register_local_source."""
    import keras

    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    else:
        local_layers = list(local_layers)
        if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
            raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in local_layers:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
