"""DistributedOptimizer and PartialDistributedOptimizer for Keras 3 optimizers, and load_model.

Keras 3 funnels every update through `Optimizer.apply(grads, trainable_variables)` (apply_gradients
calls it, and so does model.fit's train step). The distributed optimizer is a copy of the user's
optimizer (from its config) whose `apply` first reduces the gradients across ranks, in one op, and
then runs the optimizer's own `apply` (clipping, weight decay, loss-scale handling and the update
itself all see the reduced gradients).

Why an instance attribute and not a generated subclass (as Horovod does): the optimizer's class
stays the user's class, so a saved model serialises exactly as a non-distributed one and loads
with plain `keras.models.load_model` (for inference without scaleout); `load_model` below loads
it and makes its optimizer distributed again. isinstance checks and get_config are unchanged.

Local gradient aggregation (`backward_passes_per_step=k`) follows Horovod's
LocalGradientAggregationHelperEager: see Note [Local aggregation] below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from scaleout._gradient_rules import check_backward_passes_per_step, predivided
from scaleout._native import Average, Min, Sum
from scaleout._process_sets import global_process_set
from scaleout._topk import Momentum, TopK, check_optimizer_momentum
from scaleout.tensorflow._arguments import check_device, set_id
from scaleout.tensorflow._collectives import allreduce
from scaleout.tensorflow._compression import Compression
from scaleout.tensorflow._gradients import LocalSources, check_groups
from scaleout.tensorflow._op_runner import not_converted
from scaleout.tensorflow._topk import TopKVariables

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "load_model", "is_distributed"]


@dataclass(frozen=True)
class _Settings:
    prefix: str
    op: int
    compression: Any
    sparse_as_dense: bool
    gradient_predivide_factor: float
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    scale_local_gradients: bool
    groups: Any
    process_set: Any = global_process_set


@dataclass
class _State:
    """What a distributed optimizer carries besides its Keras state (never saved with it)."""

    settings: _Settings
    local: LocalSources
    counter: Optional[tf.Variable] = None
    sums: Dict[int, tf.Variable] = field(default_factory=dict)  # gradient position -> sum


def _scaleout_state(optimizer) -> _State:
    return optimizer._scaleout_state


def _reduce(state: _State, grads: List[Any], variables: List[Any]) -> List[Any]:
    """Reduces the gradients of every variable not registered as local (LocalSources)."""
    settings = state.settings
    return state.local.reduce(
        grads,
        variables,
        settings.prefix,
        op=settings.op,
        compression=settings.compression,
        sparse_as_dense=settings.sparse_as_dense,
        gradient_predivide_factor=settings.gradient_predivide_factor,
        process_set=settings.process_set,
        groups=settings.groups,
    )


def _scaled(grad, factor: float):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape
        )
    return grad * tf.cast(factor, grad.dtype)


# Note [Local aggregation]
# With backward_passes_per_step=k, as Horovod's Keras optimizer under TF2:
# - every call adds this rank's gradients to local sums (variables of the optimizer object, not
#   of the Keras optimizer, so they are not saved with the model) and counts the call;
# - at the k-th call the sums are reduced across ranks (op as given, Average by default), divided
#   by k when average_aggregated_gradients, cleared, and the optimizer applies them: the model's
#   variables change once every k calls;
# - at the other calls only `optimizer.iterations` moves (Horovod increments it there too), so
#   iterations counts backward passes, not updates: learning-rate schedules and Adam's bias
#   correction see backward passes, exactly as under Horovod.
# Only dense gradients can be summed locally: tf.IndexedSlices need sparse_as_dense=True.


def _aggregated_apply(
    optimizer, state: _State, grads: List[Any], variables: List[Any], trainable_variables
):
    settings = state.settings
    k = settings.backward_passes_per_step
    dense = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            if not settings.sparse_as_dense:
                raise ValueError(
                    "IndexedSlices are not supported when backward_passes_per_step "
                    "> 1 and sparse_as_dense is False: pass sparse_as_dense=True"
                )
            g = tf.convert_to_tensor(g)
        dense.append(g)
    with tf.init_scope():  # created once, outside any tf.function, as the optimizer's own state
        if state.counter is None:
            state.counter = tf.Variable(
                0, dtype=tf.int64, trainable=False, name=f"{settings.prefix}_aggregation_counter"
            )
        for i, (g, v) in enumerate(zip(dense, variables)):
            if g is not None and i not in state.sums:
                state.sums[i] = tf.Variable(
                    tf.zeros(tuple(v.shape), dtype=g.dtype),
                    trainable=False,
                    name=f"{settings.prefix}_aggregated_{i}",
                )
    for i, g in enumerate(dense):
        if g is not None:
            state.sums[i].assign_add(g)
    # Every sum, also of a variable with no gradient in this call but one earlier in the window:
    # all are reduced and cleared together (Horovod's eager helper does the same).
    present = sorted(i for i in state.sums if i < len(dense))
    summed = [state.sums[i].read_value() for i in present]
    state.counter.assign_add(1)

    def reduce_and_clear():
        full = [None] * len(dense)
        for i, g in zip(present, summed):
            full[i] = g
        reduced = _reduce(state, full, variables)
        if settings.average_aggregated_gradients:
            reduced = [None if g is None else _scaled(g, 1.0 / k) for g in reduced]
        out = [tf.convert_to_tensor(reduced[i]) for i in present]
        with tf.control_dependencies(out):
            state.counter.assign(0)
            for i in present:
                state.sums[i].assign(tf.zeros_like(state.sums[i]))
        return [tf.identity(g) for g in out]

    if summed:
        summed = tf.cond(tf.equal(state.counter, k), reduce_and_clear, lambda: list(summed))
        if not isinstance(summed, (list, tuple)):
            summed = [summed]
    final = [None] * len(dense)
    for i, g in zip(present, summed):
        final[i] = g

    def update():
        with _momentum_in_compression(optimizer, state):
            type(optimizer).apply(optimizer, final, trainable_variables)
        return tf.constant(True)

    def count_only():
        optimizer.iterations.assign_add(1)
        return tf.constant(False)

    tf.cond(tf.equal(state.counter, 0), update, count_only)


@not_converted
def _distributed_apply(self, grads, trainable_variables=None):
    state = _scaleout_state(self)
    grads = list(grads)
    if trainable_variables is not None:
        trainable_variables = list(trainable_variables)
        variables = trainable_variables
    elif getattr(self, "built", False):
        variables = list(self._trainable_variables)
    else:  # Keras raises the right error for this
        return type(self).apply(self, grads, trainable_variables)
    if not grads:
        return type(self).apply(self, grads, trainable_variables)
    if not self.built:  # built as configured (outside _momentum_in_compression), and before a
        with keras.name_scope(self.name, caller=self):  # conditional update, not inside it
            self.build(trainable_variables)
        self.built = True
    if state.settings.backward_passes_per_step > 1:
        return _aggregated_apply(self, state, grads, variables, trainable_variables)
    reduced = _reduce(state, grads, variables)
    with _momentum_in_compression(self, state):
        return type(self).apply(self, reduced, trainable_variables)


@contextlib.contextmanager
def _momentum_in_compression(optimizer, state: _State):
    """With Compression.topk(momentum_correction=True) the compression applies SGD's momentum
    (Note [Top-k sparsification]): the update is traced with momentum 0. The optimizer keeps
    its configured momentum otherwise (its config, its momentum variables: what is saved and
    loaded stays an ordinary SGD's)."""
    topk = state.settings.compression
    if not isinstance(topk, TopKVariables) or topk.momentum is None:
        yield
        return
    saved = optimizer.momentum, optimizer.nesterov
    optimizer.momentum, optimizer.nesterov = 0.0, False
    try:
        yield
    finally:
        optimizer.momentum, optimizer.nesterov = saved


def _register_local_var(self, var) -> None:
    """Registers a variable as local to this rank: its gradient is not reduced across ranks
    (it is divided by the process set's size if scale_local_gradients, as in Horovod). Register
    the variables the optimizer updates, e.g.
    `for v in layer.trainable_weights: opt.register_local_var(v)`.
    """
    _scaleout_state(self).local.add(var)


def local_steps(optimizer) -> bool:
    """Makes a DistributedOptimizer apply gradients as they are, without reducing them (local
    SGD's local steps, Note [Local SGD]); whether it was distributed (the train function must then
    be traced again)."""
    if not is_distributed(optimizer):
        return False
    for name in ("apply", "register_local_var", "_scaleout_state"):
        if name in optimizer.__dict__:
            object.__delattr__(optimizer, name)
    return True


def is_distributed(optimizer) -> bool:
    """True for an optimizer returned by DistributedOptimizer (or made so by load_model)."""
    return getattr(optimizer, "_scaleout_state", None) is not None


# Note [Loss scaling]
# Keras 3's compile() wraps the optimizer in a LossScaleOptimizer under a mixed_float16 policy
# (auto_scale_loss), so a distributed optimizer becomes its inner optimizer. The wrapper checks
# this rank's gradients for inf/NaN and calls the inner apply (the reduction) only when they are
# finite: one rank that overflows would skip a reduction the others wait in. Horovod reduced
# before that check. Here the wrapper's check is made collective instead: when its inner
# optimizer is distributed, the ranks agree (a Min allreduce) that every rank's gradients are
# finite, so all reduce and apply, or all skip the step and lower the scale, as under Horovod
# (whose reduced gradients hold an inf whenever one rank's do).
_loss_scaling_installed = False


def _install_collective_finite_check() -> None:
    global _loss_scaling_installed
    if _loss_scaling_installed:
        return
    _loss_scaling_installed = True
    wrapper_cls = keras.optimizers.LossScaleOptimizer
    local_check = wrapper_cls.check_finite

    def check_finite(self, grads):
        finite = local_check(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        if inner is None or not is_distributed(inner):
            return finite
        settings = _scaleout_state(inner).settings
        everywhere = allreduce(
            tf.cast(finite, tf.int32),
            op=Min,
            name=f"{settings.prefix}.grads_finite",
            process_set=settings.process_set,
        )
        return tf.cast(everywhere, tf.bool)

    wrapper_cls.check_finite = check_finite


def _make_distributed(optimizer, settings: _Settings):
    # Set through object.__setattr__: the state and the methods are not optimizer state for
    # Keras's tracker to record.
    _install_collective_finite_check()
    settings = _with_topk(optimizer, settings)
    object.__setattr__(
        optimizer, "_scaleout_state", _State(settings, LocalSources(settings.scale_local_gradients))
    )
    object.__setattr__(optimizer, "apply", types.MethodType(_distributed_apply, optimizer))
    object.__setattr__(
        optimizer, "register_local_var", types.MethodType(_register_local_var, optimizer)
    )
    return optimizer


def _check_groups(groups, num_groups):
    """check_groups (shared with the tape), and that a list holds lists of variables."""
    groups = check_groups(num_groups, groups)
    if isinstance(groups, list):
        for group in groups:
            if not isinstance(group, (list, tuple)) or not all(
                isinstance(v, (tf.Variable, keras.Variable)) for v in group
            ):
                raise ValueError(
                    "groups should be a non-negative integer or a list of list of tf.Variable."
                )
    return groups


def _settings(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
) -> _Settings:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), "
            f"not {type(optimizer).__name__}"
        )
    if is_distributed(optimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    set_id(process_set, "DistributedOptimizer")  # a registered ProcessSet (or the global set)
    if op is None:
        op = Average
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer: op must be Average or Sum (as in Horovod)")
    check_backward_passes_per_step(int(backward_passes_per_step), ValueError)
    for device in (device_dense, device_sparse):
        if device:
            check_device(device, "DistributedOptimizer")
    groups = _check_groups(groups, num_groups)
    predivided(op, float(gradient_predivide_factor), 1)  # validates the combination
    return _Settings(
        prefix=name or f"Distributed{type(optimizer).__name__}",
        op=int(op),
        compression=compression,
        sparse_as_dense=bool(sparse_as_dense),
        gradient_predivide_factor=float(gradient_predivide_factor),
        backward_passes_per_step=int(backward_passes_per_step),
        average_aggregated_gradients=bool(average_aggregated_gradients),
        scale_local_gradients=bool(scale_local_gradients),
        groups=groups,
        process_set=process_set,
    )


def DistributedOptimizer(
    optimizer,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients: bool = True,
):
    """Returns a copy of the Keras optimizer `optimizer` that reduces gradients across ranks
    before every update:

        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
        model.compile(optimizer=opt, loss=..., jit_compile=False)

    Works with any Keras 3 optimizer (SGD, Adam, AdamW, ..., with learning-rate schedules), with
    model.fit, train_on_batch and custom loops calling apply_gradients. Arguments as Horovod's:

    - `op`: Average (default) or Sum; anything else raises ValueError, as in Horovod.
    - `compression`: Compression.none / fp16 / bf16, or Compression.topk(...) (top-k
      sparsification with error feedback; its residuals are optimizer variables, saved with the
      others and per rank: BroadcastGlobalVariablesCallback leaves them; momentum_correction=True
      needs SGD with momentum).
    - `sparse_as_dense`: reduce tf.IndexedSlices densely (else they are allgathered).
    - `gradient_predivide_factor`: gradients are divided by it before the sum and multiplied by
      factor / size after it (Average only).
    - `backward_passes_per_step=k`: gradients are summed locally over k calls and reduced once
      every k calls; the variables change only then, while `optimizer.iterations` counts every
      call (as Horovod's). `average_aggregated_gradients=True` divides the sums by k.
    - `groups` (an int > 0, or lists of variables) and the deprecated `num_groups`: validated as
      Horovod does. Horovod uses them to fuse chosen gradients together; here every gradient of
      a step is already submitted to the core in one request, so every group is always reduced
      together.
    - `process_set`: reduce over that set's ranks only (Average divides by its size); only its
      ranks may apply gradients. With mixed precision the ranks of the set agree on skipping a
      step.
    - `scale_local_gradients`: gradients of variables registered with
      `optimizer.register_local_var(var)` (or PartialDistributedOptimizer's local layers) are not
      reduced; when True they are divided by the set's size, as Horovod does.
    - `device_dense`, `device_sparse`: '' or a CPU device; GPU devices raise.

    For mixed precision, wrap the keras.optimizers.LossScaleOptimizer (so every rank checks the
    same reduced gradients). XLA: compile the model with jit_compile=False.
    """
    settings = _settings(
        optimizer,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        backward_passes_per_step,
        average_aggregated_gradients,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    copy = type(optimizer).from_config(optimizer.get_config())
    return _make_distributed(copy, settings)


def _with_topk(optimizer, settings: _Settings) -> _Settings:
    """With Compression.topk, the settings carry the optimizer's top-k state (its variables are
    the optimizer's: saved with it, per rank). With momentum correction the momentum moves
    from the SGD optimizer into the compression (Note [Top-k sparsification]): the optimizer
    then steps without it."""
    compression = settings.compression
    if not isinstance(compression, TopK):
        return settings
    momentum = None
    if check_optimizer_momentum(compression, "DistributedOptimizer"):
        if not isinstance(optimizer, keras.optimizers.SGD) or not optimizer.momentum > 0:
            got = (
                f"SGD with momentum {optimizer.momentum}"
                if isinstance(optimizer, keras.optimizers.SGD)
                else type(optimizer).__name__
            )
            raise ValueError(
                "Compression.topk(momentum_correction=True) moves the optimizer's momentum into "
                "the compression (Deep Gradient Compression): it needs keras.optimizers.SGD with "
                f"momentum > 0, not {got}"
            )
        momentum = Momentum(float(optimizer.momentum), bool(optimizer.nesterov))
    state = TopKVariables(compression, momentum, settings.prefix)
    # Values load_model read for it (_keeping_extra_state), restored as the variables are made.
    state.restore = list(getattr(optimizer, "_scaleout_extra_state", ()))
    # Keras has no public way to add state after build(); its tracker is what saving
    # (optimizer.variables) reads.
    state.on_create = optimizer._track_variable
    return dataclasses.replace(settings, compression=state)


def PartialDistributedOptimizer(
    optimizer,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients: bool = True,
):
    """DistributedOptimizer whose `local_layers` (a Keras layer or a list of them) keep their
    gradients local: every trainable weight of those layers is registered with
    `register_local_var`, as in Horovod (model parallelism: layers that differ per rank)."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be Keras layers (keras.layers.Layer)")
    distributed = DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            distributed.register_local_var(var)
    return distributed


def load_model(
    filepath,
    custom_optimizers=None,
    custom_objects=None,
    compression=Compression.none,
    legacy_opts: bool = False,
):
    """keras.models.load_model, with the model's optimizer (and its saved state) made a
    DistributedOptimizer with `compression`, as Horovod's load_model.

    `custom_optimizers`: optimizer classes of your own that the file refers to (found by class
    name); `custom_objects`: as for keras.models.load_model, and they take precedence.
    `legacy_opts`: in Horovod, load the file's optimizer as a tf.keras.optimizers.legacy class.
    Keras 3 has no legacy optimizers: a file written by tf.keras 2 (.h5) loads its optimizer as
    the Keras 3 optimizer of the same name (Keras's own compatibility path), with or without
    legacy_opts; the flag is accepted so that Horovod scripts run unchanged.
    """
    del legacy_opts  # see the docstring: Keras 3 resolves legacy optimizer names itself
    objects = {}
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    objects.update(custom_objects or {})
    with _keeping_extra_state():
        model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        _make_distributed(optimizer, _settings(optimizer, compression=compression))
    return model


@contextlib.contextmanager
def _keeping_extra_state():
    """A model saved with Compression.topk has the top-k variables after the optimizer's own
    (they are made at its first step, after build). Keras skips the whole optimizer state when
    the counts differ; while load_model runs, an optimizer loads its own variables and keeps the
    rest, for the top-k state to start from (TopKVariables.restore)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    original = BaseOptimizer.load_own_variables

    def load_own_variables(self, store):
        own = len(self.variables)
        if not own or len(store.keys()) <= own:
            return original(self, store)
        for i, variable in enumerate(self.variables):
            variable.assign(store[str(i)])
        object.__setattr__(
            self,
            "_scaleout_extra_state",
            [np.asarray(store[str(i)]) for i in range(own, len(store.keys()))],
        )

    BaseOptimizer.load_own_variables = load_own_variables
    try:
        yield
    finally:
        BaseOptimizer.load_own_variables = original
