"""TensorFlow's elastic states, as Horovod 0.28.1's horovod.tensorflow.elastic:
TensorFlowKerasState (a Keras 3 model and its optimizer) and TensorFlowState (a list of
tf.Variables). The contract is Note [Elastic state] (scaleout/_elastic_state.py); what each
variable is treated as is Note [Keras elastic state] below.

Note [Keras elastic state]
Shared variables, the same on every rank: the model's weights (model.weights: trainable and
not, e.g. batch-norm statistics) and the optimizer's own variables (iteration count, learning
rate, slots; with a LossScaleOptimizer its scale and its inner optimizer's). save() copies them,
restore() assigns the copies back, sync() broadcasts rank 0's, and a durable commit holds them.

Per-rank variables, each rank's own:
  - Keras 3's random-seed states (model.variables beyond model.weights): rank 0's everywhere
    would give every rank the same dropout masks;
  - Compression.topk's residuals, velocities and exchange count (tagged `_scaleout_per_rank`):
    a residual is what this rank has not sent yet; rank 0's on every rank would be sent n times;
  - the sums and the call counter of backward_passes_per_step > 1 (the distributed optimizer's
    own variables, which Keras does not track): this rank's gradients not yet reduced. Every
    rank makes the same calls, so the counters agree without a broadcast.
save() and restore() keep each rank's own copy, so a rollback is exact (also of a partial
aggregation window); sync() leaves them. A durable commit leaves them out: it holds the state
of one rank, loaded by every rank of a job of perhaps another size, where none of them means
anything. A resumed process starts them afresh: residuals and sums at zero (what was not sent
yet, at most one aggregation window, is lost, as the uncommitted steps of a failure are), top-k
runs its dense warm-up steps again, seed states are the new process's.

Keras 3 makes an optimizer's slots when it is built, at its first step; scaleout's per-rank
variables are made at the first step after that. So that the saved copies line up with the
variables they are assigned to, every save, restore and load first builds an unbuilt optimizer
(on model.trainable_variables, as fit's first step would); a per-rank variable made after the
save a restore goes back to returns to its initial value, zero.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from scaleout._elastic_state import ObjectState
from scaleout.tensorflow._collectives import broadcast_variables

__all__ = ["TensorFlowKerasState", "TensorFlowState"]


def _value(variable) -> np.ndarray:
    # A copy: an eager tensor's numpy() may share the variable's buffer.
    return np.array(variable.numpy(), copy=True)


def _per_rank_tagged(variable) -> bool:
    return bool(getattr(variable, "_scaleout_per_rank", False))


def _distributed(optimizer):
    """The scaleout DistributedOptimizer inside `optimizer` (itself, or the inner optimizer of a
    LossScaleOptimizer), or None."""
    while optimizer is not None:
        if getattr(optimizer, "_scaleout_state", None) is not None:
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


def _assign_all(variables: Sequence, values: Sequence[np.ndarray], what: str) -> None:
    if len(variables) != len(values):
        raise ValueError(
            f"TensorFlowKerasState: the saved state has {len(values)} {what} "
            f"variables, this one has {len(variables)}: not the same model or "
            f"optimizer"
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


class TensorFlowKerasState(ObjectState):
    """State of a Keras 3 model and its optimizer, as Horovod's TensorFlowKerasState:

        state = hvd.elastic.TensorFlowKerasState(model, epoch=0, batch=0)

    `model` must be built; `optimizer` defaults to model.optimizer (compile first); `backend` is
    accepted for Horovod's TF1 sessions, which Keras 3 does not have (it always runs eagerly).
    Keyword arguments become attributes (ObjectState). What is saved, synced and committed:
    Note [Keras elastic state]."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs: Any) -> None:
        self.model = model
        if hasattr(model, "build") and not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        if self.optimizer is None:
            raise ValueError(
                "TensorFlowKerasState needs an optimizer: compile the model first "
                "or pass optimizer="
            )
        self.backend = backend
        self._save_model()
        super().__init__(**kwargs)

    # ---- the variables (Note [Keras elastic state]) ----

    def _build_optimizer(self) -> None:
        optimizer = self.optimizer
        if not optimizer.built:  # as Keras's own apply builds it
            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(self.model.trainable_variables)
            optimizer.built = True

    def _shared(self) -> Tuple[List, List]:
        """(model variables, optimizer variables) that are the same on every rank."""
        optimizer = [v for v in self.optimizer.variables if not _per_rank_tagged(v)]
        return list(self.model.weights), optimizer

    def _per_rank(self) -> List:
        weights = {id(v) for v in self.model.weights}
        out = [v for v in self.model.variables if id(v) not in weights]
        out += [v for v in self.optimizer.variables if _per_rank_tagged(v)]
        distributed = _distributed(self.optimizer)
        if distributed is not None:
            aggregation = distributed._scaleout_state
            if aggregation.counter is not None:
                out.append(aggregation.counter)
            out += [aggregation.sums[i] for i in sorted(aggregation.sums)]
        return out

    def _save_model(self) -> None:
        self._build_optimizer()
        model, optimizer = self._shared()
        self._saved_model_state = [_value(v) for v in model]
        self._saved_optimizer_state = [_value(v) for v in optimizer]
        self._saved_per_rank: Dict[int, Tuple[Any, np.ndarray]] = {
            id(v): (v, _value(v)) for v in self._per_rank()
        }

    def _load_model(self) -> None:
        self._build_optimizer()
        model, optimizer = self._shared()
        _assign_all(model, self._saved_model_state, "model")
        _assign_all(optimizer, self._saved_optimizer_state, "optimizer")
        for variable in self._per_rank():
            saved = self._saved_per_rank.get(id(variable))
            if saved is None:  # made after the save: back to its initial value
                variable.assign(tf.zeros(variable.shape, variable.dtype))
            else:
                variable.assign(saved[1])

    # ---- Horovod's contract ----

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        self._build_optimizer()
        model, optimizer = self._shared()
        broadcast_variables(model + optimizer, root_rank=0, name="TensorFlowKerasState.sync")
        self._save_model()
        super().sync()

    # ---- durable commits ----

    def _serializable(self) -> Dict[str, Any]:
        return {
            **super()._serializable(),
            "model": self._saved_model_state,
            "optimizer": self._saved_optimizer_state,
        }

    def _load_serializable(self, loaded: Dict[str, Any]) -> None:
        self._build_optimizer()
        model, optimizer = self._shared()
        _assign_all(model, loaded["model"], "model")
        _assign_all(optimizer, loaded["optimizer"], "optimizer")
        self._save_model()  # per-rank variables: this process's own
        super()._load_serializable(loaded)


class TensorFlowState(ObjectState):
    """State of a list of TensorFlow variables, as Horovod's TensorFlowState:

        state = hvd.elastic.TensorFlowState(model.variables, epoch=0)

    Eagerly, `variables` are tf.Variables (an empty or missing list holds no variables: there
    are no global variables eagerly, as in Horovod). In a TF1 graph (tf.compat.v1), `variables`
    defaults to the graph's global variables and `session` to the default session when each
    call runs; the broadcast and assignment ops are built once, here, so make the state before
    the graph is finalized (e.g. before MonitoredTrainingSession). Variables tagged per rank
    (Compression.topk's) are saved and restored but not synced nor committed (Note [Keras
    elastic state]). Keyword arguments become attributes (ObjectState)."""

    def __init__(self, variables=None, session=None, **kwargs: Any) -> None:
        self._eager = tf.executing_eagerly()
        self.variables = list(variables or ([] if self._eager else tf.compat.v1.global_variables()))
        self.session = session
        self._shared_variables = [v for v in self.variables if not _per_rank_tagged(v)]
        self._bcast_op = None
        self._assign_ops = None
        if not self._eager and self.variables:
            self._bcast_op = broadcast_variables(
                self._shared_variables, root_rank=0, name="TensorFlowState.sync"
            )
            placeholders = [
                tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape) for v in self.variables
            ]
            self._assign_ops = (
                placeholders,
                [v.assign(p, read_value=False) for v, p in zip(self.variables, placeholders)],
            )
        self._save_model()
        super().__init__(**kwargs)

    def _session(self):
        session = self.session or tf.compat.v1.get_default_session()
        if session is None:
            raise ValueError(
                "TensorFlowState of a TF1 graph needs a session: pass session= or "
                "use it inside `with session.as_default():`"
            )
        return session

    def _save_model(self) -> None:
        if self._eager:
            self._values = [_value(v) for v in self.variables]
        elif self.variables:
            self._values = [np.array(x, copy=True) for x in self._session().run(self.variables)]
        else:
            self._values = []

    def _assign(self, variables: Sequence, values: Sequence[np.ndarray]) -> None:
        if len(values) != len(variables):
            raise ValueError(
                f"TensorFlowState: the saved state has {len(values)} variables, "
                f"this one has {len(variables)}"
            )
        if self._eager:
            for variable, value in zip(variables, values):
                variable.assign(value)
            return
        if not variables:
            return
        placeholders, ops = self._assign_ops
        position = {id(v): i for i, v in enumerate(self.variables)}
        chosen = [position[id(v)] for v in variables]
        self._session().run(
            [ops[i] for i in chosen],
            feed_dict={placeholders[i]: value for i, value in zip(chosen, values)},
        )

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._assign(self.variables, self._values)
        super().restore()

    def sync(self) -> None:
        if self._eager:
            broadcast_variables(self._shared_variables, root_rank=0, name="TensorFlowState.sync")
        elif self._bcast_op is not None:
            self._session().run(self._bcast_op)
        self._save_model()
        super().sync()

    def _serializable(self) -> Dict[str, Any]:
        shared = [
            value for v, value in zip(self.variables, self._values) if not _per_rank_tagged(v)
        ]
        return {**super()._serializable(), "variables": shared}

    def _load_serializable(self, loaded: Dict[str, Any]) -> None:
        self._assign(self._shared_variables, loaded["variables"])
        self._save_model()
        super()._load_serializable(loaded)
