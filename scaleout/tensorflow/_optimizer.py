"""scaleout.tensorflow.DistributedOptimizer, as Horovod's: one name for both kinds of optimizer.

- A Keras optimizer (keras.optimizers.*) becomes scaleout.tensorflow.keras.DistributedOptimizer.
- A TF1 optimizer (tf.compat.v1.train.Optimizer, for graphs run by a Session, or eagerly)
  becomes a tf.compat.v1.train.Optimizer whose compute_gradients() reduces the gradients across
  ranks (so minimize() does too) and whose apply_gradients() is the wrapped optimizer's.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Optional

import keras
import tensorflow as tf

from scaleout._errors import InvalidArgumentError
from scaleout._gradient_rules import (
    check_adasum_aggregation,
    check_adasum_compression,
    check_adasum_keras,
    check_adasum_process_set,
    check_backward_passes_per_step,
)
from scaleout._naming import member, part
from scaleout._native import Adasum, Average, Sum
from scaleout._process_sets import global_process_set, process_set_id
from scaleout._topk import TopK
from scaleout.tensorflow._arguments import variable_label
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._errors import tf_errors
from scaleout.tensorflow._gradients import LocalSources, _configure, tape_topk_state
from scaleout.tensorflow._op_runner import request, run_batch
from scaleout.tensorflow.keras import _optimizer as keras_optimizer

__all__ = ["DistributedOptimizer"]


class _WrappingOptimizer(tf.compat.v1.train.Optimizer):
    """What both TF1 wrappers share: the wrapped optimizer's slots and variables, and state of
    their own per graph (a TF1 optimizer object may build several, e.g. Estimator's train()
    calls) and one set eagerly, made by `make_state`."""

    def __init__(self, optimizer, name, use_locking, make_state):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._make_state = make_state
        self._graph_states = weakref.WeakKeyDictionary()
        self._eager_state = make_state()

    def _state(self):
        if tf.executing_eagerly():
            return self._eager_state
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._graph_states:
            self._graph_states[graph] = self._make_state()
        return self._graph_states[graph]

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class _LegacyDistributedOptimizer(_WrappingOptimizer):
    """A tf.compat.v1.train.Optimizer that reduces gradients across ranks in compute_gradients
    and delegates everything else to the optimizer it wraps (Note [TF1 local aggregation])."""

    def __init__(
        self,
        optimizer,
        name,
        use_locking,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        scale_local_gradients,
        backward_passes_per_step,
        average_aggregated_gradients,
        process_set,
        groups,
    ):
        # the state: the pass counter and, by gradient position, the local sums
        super().__init__(
            optimizer, name or f"Distributed{type(optimizer).__name__}", use_locking, _CountedSlots
        )
        self._scaleout_options = dict(
            op=op,
            compression=tape_topk_state(compression, "a TF1 DistributedOptimizer"),
            sparse_as_dense=bool(sparse_as_dense),
            gradient_predivide_factor=float(gradient_predivide_factor),
            process_set=process_set,
            groups=groups,
        )
        self.process_set = process_set
        self._scaleout_local = LocalSources(scale_local_gradients)
        self._passes = int(backward_passes_per_step)
        self._average_passes = bool(average_aggregated_gradients)

    def register_local_var(self, var) -> None:
        """Keeps `var`'s gradient local to this rank (divided by the process set's size when
        scale_local_gradients, as Horovod's)."""
        self._scaleout_local.add(var)

    def _reduce(self, grads, variables):
        return self._scaleout_local.reduce(
            grads, variables, self.get_name(), **self._scaleout_options
        )

    @tf_errors
    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, reduced across ranks (all in one op); with
        backward_passes_per_step=k, summed locally and reduced at every k-th call."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = (list(t) for t in zip(*pairs))
        if self._passes == 1:
            return list(zip(self._reduce(grads, variables), variables))
        return list(zip(self._aggregate(grads, variables), variables))

    def _aggregate(self, grads, variables):
        present = [i for i, g in enumerate(grads) if g is not None]
        dense = {}
        for i in present:
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                if not self._scaleout_options["sparse_as_dense"]:
                    raise ValueError(
                        "IndexedSlices are not supported when "
                        "backward_passes_per_step > 1 and sparse_as_dense is False: "
                        "pass sparse_as_dense=True"
                    )
                g = tf.convert_to_tensor(g)
            dense[i] = g
        state = self._state()
        state.ensure(
            f"{self.get_name()}_aggregation_counter",
            {
                i: (f"{self.get_name()}_aggregated_{i}", tuple(variables[i].shape), dense[i].dtype)
                for i in present
            },
        )
        updates = [state.slots[i].assign_add(dense[i], read_value=False) for i in present]
        with tf.control_dependencies([u for u in updates if u is not None]):
            count = state.count.assign_add(1, read_value=True)

        def reduce_and_clear():
            summed = [state.slots[i].read_value() for i in present]
            full = [None] * len(grads)
            for i, g in zip(present, summed):
                full[i] = g
            reduced = self._reduce(full, variables)
            out = [tf.convert_to_tensor(reduced[i]) for i in present]
            if self._average_passes:
                out = [g / tf.cast(self._passes, g.dtype) for g in out]
            with tf.control_dependencies(out):
                clears = [
                    state.slots[i].assign(tf.zeros_like(state.slots[i]), read_value=False)
                    for i in present
                ]
                clears.append(state.count.assign(0, read_value=False))
            with tf.control_dependencies([c for c in clears if c is not None]):
                return [tf.identity(g) for g in out]

        def local_sums():
            return [tf.identity(state.slots[i].read_value()) for i in present]

        results = tf.cond(tf.equal(count, self._passes), reduce_and_clear, local_sums)
        if not isinstance(results, (list, tuple)):
            results = [results]
        out = [None] * len(grads)
        for i, g in zip(present, results):
            out[i] = g
        return out

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's apply_gradients; with backward_passes_per_step=k, only at the
        calls whose compute_gradients reduced (the others only advance `global_step`)."""
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        grads_and_vars = list(grads_and_vars)
        after = [g for g, _ in grads_and_vars if g is not None]

        def apply():
            with tf.control_dependencies(
                [self._optimizer.apply_gradients(grads_and_vars, global_step, name)]
            ):
                return tf.constant(True)

        def skip():
            if global_step is None:
                return tf.constant(False)
            with tf.control_dependencies([global_step.assign_add(1, read_value=False)]):
                return tf.constant(False)

        with tf.control_dependencies(after):
            counter = self._state().count
            applied = tf.cond(tf.equal(counter.read_value(), 0), apply, skip)
        return applied if tf.executing_eagerly() else applied.op


class _AdasumDistributedOptimizer(_WrappingOptimizer):
    """DistributedOptimizer(op=Adasum) for a TF1 optimizer (Note [TF1 Adasum optimizer])."""

    def __init__(self, optimizer, name, use_locking, compression, backward_passes_per_step):
        super().__init__(
            optimizer,
            name or f"DistributedDelta{type(optimizer).__name__}",
            use_locking,
            _CountedSlots,
        )
        self._compression = compression
        self._passes = int(backward_passes_per_step)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, not reduced (the changes are)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    @tf_errors
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = [(g, v) for g, v in grads_and_vars]
        variables = [v for g, v in grads_and_vars if g is not None]
        state = self._state()  # the calls counted, and each variable's start
        state.ensure(
            f"{self.get_name()}_delta_count",
            {
                v.ref(): (f"{self.get_name()}_delta_start_{i}", v.shape, v.dtype.base_dtype)
                for i, v in enumerate(variables)
            },
        )
        starts = [state.slots[v.ref()] for v in variables]
        first = tf.equal(state.count.read_value(), 0)

        def keep_starts():
            with tf.control_dependencies(
                [s.assign(v.read_value(), read_value=False) for s, v in zip(starts, variables)]
            ):
                return tf.constant(True)

        kept = tf.cond(first, keep_starts, lambda: tf.constant(False))
        with tf.control_dependencies([kept]):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step, name)

        def combine():
            deltas = [v.read_value() - s.read_value() for v, s in zip(variables, starts)]
            combined = adasum_changes(deltas, variables, self.get_name(), self._compression)
            done = []
            for v, s, d in zip(variables, starts, combined):
                new_start = s.assign_add(d, read_value=True)
                done.append(v.assign(new_start, read_value=False))
            with tf.control_dependencies([d for d in done if d is not None]):
                return tf.constant(True)

        with tf.control_dependencies([update] if update is not None else []):
            communicate = tf.equal(state.count.read_value() % self._passes, self._passes - 1)
            combined = tf.cond(communicate, combine, lambda: tf.constant(False))
        with tf.control_dependencies([combined]):
            counted = state.count.assign_add(1, read_value=False)
        if tf.executing_eagerly():
            return None
        with tf.control_dependencies([counted]):
            return tf.no_op(name=name or "adasum_apply")


def _kept_variable(initial, name):
    """A non-trainable variable of the optimizer's own. In a graph, in Horovod's collection:
    initialized by tf.compat.v1.local_variables_initializer() (and by MonitoredSession), not
    broadcast with the global variables."""
    if tf.executing_eagerly():
        return tf.Variable(initial, trainable=False, name=name)
    return tf.compat.v1.Variable(
        initial, trainable=False, name=name, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
    )


def adasum_changes(deltas, variables, prefix, compression):
    """Every variable's change combined with Adasum across the ranks, in one op."""
    wires, contexts, requests = [], [], []
    for i, (delta, v) in enumerate(zip(deltas, variables)):
        wire, ctx = compression.compress(delta)
        wires.append(wire)
        contexts.append(ctx)
        name = part(member(part(prefix, "delta"), i), variable_label(v))
        requests.append(request("allreduce", name, Adasum))
    outs = run_batch(requests, wires, "scaleout_adasum_deltas")
    return [compression.decompress(o, ctx) for o, ctx in zip(outs, contexts)]


# Note [TF1 Adasum optimizer]
# DistributedOptimizer(tf1_optimizer, op=Adasum), as Horovod documents its delta optimizer: the
# wrapped optimizer applies each rank's own gradients (compute_gradients reduces nothing); at the
# first call every variable's value is kept as its start; at every backward_passes_per_step-th
# call each variable's change since its start (the local updates of those calls) is combined
# across the ranks with Adasum, and start and variable both become start + the combined change.
# Horovod 0.28.1's class of that name delegates apply_gradients to the wrapped optimizer, so it
# never communicates (horovod#1729, open); this one does what its documentation says.


class _CountedSlots:
    """A TF1 wrapper's state (per graph, and once eagerly): a count of calls and a variable per
    key (the local sums by gradient position; the variables' starts by variable)."""

    def __init__(self):
        self.count = None
        self.slots = {}

    def ensure(self, count_name: str, wanted: dict) -> None:
        """Makes the count and the variables of `wanted` (key -> (name, shape, dtype)) that do
        not exist yet, outside any function."""
        with tf.init_scope():
            if self.count is None:
                self.count = _kept_variable(tf.constant(0, tf.int64), count_name)
            for key, (name, shape, dtype) in wanted.items():
                if key not in self.slots:
                    self.slots[key] = _kept_variable(tf.zeros(shape, dtype), name)


# Note [TF1 local aggregation]
# backward_passes_per_step=k with a TF1 optimizer, as Horovod's graph helper: compute_gradients
# adds this step's gradients to local sums (LOCAL_VARIABLES in a graph) and counts the call; at
# the k-th call it reduces the sums across ranks (divided by k with
# average_aggregated_gradients), clears them and resets the count, and apply_gradients applies
# only then (count back at 0). At the other calls apply_gradients only advances `global_step`,
# so global_step counts backward passes, as under Horovod.


@tf_errors
def DistributedOptimizer(
    optimizer,
    name: Optional[str] = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients: bool = True,
):
    """Wraps a TF1 (tf.compat.v1.train.Optimizer) or Keras optimizer so that its gradients are
    reduced across ranks, with Horovod 0.28.1's arguments and checks:

    - A Keras optimizer: returns scaleout.tensorflow.keras.DistributedOptimizer(optimizer, ...).
      As in Horovod, `op`, `groups` and `num_groups` are not passed on there, so the Keras path
      always averages (a compatibility quirk kept on purpose; a warning says so when another op
      is given). Use scaleout.tensorflow.keras.DistributedOptimizer for Sum.
    - A tf.compat.v1.train.Optimizer: returns a tf.compat.v1.train.Optimizer whose
      compute_gradients (and so minimize) reduces the gradients with `op` (Average or Sum),
      `compression`, `sparse_as_dense` and `gradient_predivide_factor`; register_local_var(var)
      keeps a variable's gradient local. `backward_passes_per_step=k` sums gradients locally
      and reduces and applies them once every k calls (Note [TF1 local aggregation]; in a
      graph, run tf.compat.v1.local_variables_initializer() as with Horovod).

    `device_dense`/`device_sparse`: CPU only. `process_set`: reduce the gradients over that
    set's ranks only (Average divides by its size); only its ranks may compute gradients.
    """
    if isinstance(optimizer, keras.optimizers.Optimizer):
        check_adasum_keras(op)
        if op != Average:
            warnings.warn(
                "scaleout.tensorflow.DistributedOptimizer of a Keras optimizer averages "
                "whatever `op` says (as Horovod's does); for Sum use "
                "scaleout.tensorflow.keras.DistributedOptimizer(..., op=Sum)",
                stacklevel=3,
            )
        return keras_optimizer.DistributedOptimizer(
            optimizer,
            name=name,
            device_dense=device_dense,
            device_sparse=device_sparse,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
        )
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(
            f"DistributedOptimizer wraps a tf.compat.v1.train.Optimizer or a Keras "
            f"optimizer, not {type(optimizer).__name__}"
        )
    groups = _configure(
        "DistributedOptimizer",
        device_dense,
        device_sparse,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
    )
    if op == Adasum:
        check_adasum_compression(op, isinstance(compression, TopK))
        check_adasum_aggregation(average_aggregated_gradients)
        check_adasum_process_set(process_set_id(process_set, "DistributedOptimizer"))
        check_backward_passes_per_step(int(backward_passes_per_step), ValueError)
        return _AdasumDistributedOptimizer(
            optimizer, name, use_locking, compression, backward_passes_per_step
        )
    if op not in (Average, Sum):
        raise InvalidArgumentError("DistributedOptimizer: op must be Average or Sum")
    check_backward_passes_per_step(int(backward_passes_per_step), ValueError)
    return _LegacyDistributedOptimizer(
        optimizer,
        name,
        use_locking,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        scale_local_gradients,
        backward_passes_per_step,
        average_aggregated_gradients,
        process_set,
        groups,
    )
