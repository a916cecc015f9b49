"""LocalSGD: local SGD in a TensorFlow training loop (Note [Local SGD] in scaleout/_local_sgd.py),
and under Keras's LocalSGDCallback. The model's variables are averaged through numpy between
steps, as the Keras callbacks do their collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import keras
import numpy as np
import tensorflow as tf

from scaleout._arrays import submit_into
from scaleout._errors import InvalidArgumentError
from scaleout._local_sgd import ALL, Schedule
from scaleout._native import ALLREDUCE, Average, synchronize
from scaleout._process_sets import global_process_set, process_set_id, set_rank

__all__ = ["LocalSGD"]

_VARIABLES = (tf.Variable, keras.Variable)


class LocalSGD:
    """Local SGD for a TensorFlow training loop (Note [Local SGD]): each rank steps on its own
    gradients, and the model's variables are averaged over the ranks every `period` steps.

    - model: a Keras model or layer, or a tf.Module (its trainable variables and, with
      average_buffers, its other floating-point ones: BatchNormalization's moving statistics),
      or a list of variables (all averaged, all moved by the outer optimizer).
    - period, warmup_steps, hierarchical, process_set, staleness: as
      scaleout.torch.LocalSGDOptimizer's.
    - outer_optimizer: DiLoCo's outer optimizer, a Keras optimizer of its own (for example
      keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)): at every round over the set, the
      averaged change of the trainable variables since the last round is its gradient, and
      the model becomes its step from the last round's model.

    Each step of the loop: reduce the gradients while `bulk()` (the warm-up: compute them with
    DistributedGradientTape), apply them with the optimizer, then call `after_step()`, which
    averages when a round is due. Start from the same variables everywhere
    (broadcast_variables). `average()` averages now; `state_dict()` / `load_state_dict()`
    carry what a resumed run needs (the step count, the outer optimizer's anchor and state, a
    round in flight).
    """

    def __init__(
        self,
        model,
        period: int,
        warmup_steps: int = 0,
        hierarchical: Optional[bool] = None,
        outer_optimizer: Optional[keras.optimizers.Optimizer] = None,
        average_buffers: bool = True,
        process_set=global_process_set,
        staleness: int = 0,
        *,
        what: str = "LocalSGD",
    ) -> None:
        self._what = what
        if outer_optimizer is not None and not isinstance(
            outer_optimizer, keras.optimizers.Optimizer
        ):
            raise InvalidArgumentError(
                f"{what}: outer_optimizer must be a Keras optimizer, not "
                f"{type(outer_optimizer).__name__}"
            )
        self._ps = process_set_id(process_set, what)
        self._schedule = Schedule(
            period,
            warmup_steps,
            outer_optimizer is not None,
            hierarchical,
            self._ps,
            staleness,
            what,
        )
        self._outer = outer_optimizer
        self._average_buffers = bool(average_buffers)
        self._included = set_rank(self._ps) >= 0
        self._anchor: Optional[List[np.ndarray]] = None
        self._round: Optional[_Round] = None
        self.model = None
        if model is not None:
            self.set_model(model)

    def set_model(self, model) -> None:
        """The model whose variables are averaged (LocalSGDCallback sets its Keras model)."""
        if isinstance(model, (list, tuple)):
            if not all(isinstance(v, _VARIABLES) for v in model):
                raise InvalidArgumentError(
                    f"{self._what}: a list given as the model must hold variables only"
                )
        elif not hasattr(model, "trainable_variables"):
            raise InvalidArgumentError(
                f"{self._what}: the model must be a Keras model or layer, a tf.Module or a list "
                f"of variables, not {type(model).__name__}"
            )
        if self._outer is not None and self._outer is getattr(model, "optimizer", None):
            raise InvalidArgumentError(
                f"{self._what}: the outer optimizer must be an optimizer of its own, not the "
                "model's (its steps would mix with the local ones)"
            )
        self.model = model

    @property
    def step_count(self) -> int:
        """The steps counted so far."""
        return self._schedule.step

    def bulk(self) -> bool:
        """Whether the step under way reduces gradients (the warm-up, or period=1)."""
        return self._schedule.bulk()

    def after_step(self) -> None:
        """Counts the optimizer step just made and averages the model if a round is due."""
        if not self._included:  # outside the process set: this rank steps alone
            self._schedule.finish_step()
            return
        bulk = self._schedule.bulk()
        scope = self._schedule.finish_step()
        if bulk:
            if self._outer is not None and not self._schedule.bulk():
                # the warm-up's end: the outer optimizer's anchor, the same model everywhere
                self._anchor = _values(self._trainable())
            return
        if self._round is not None and self._schedule.due(self._round.started):
            self._take_round()
        if scope == ALL and self._schedule.staleness:
            self._start_round()
        elif scope is not None:
            self._average(scope)

    def average(self) -> None:
        """Averages the model over the whole process set now (as a round of the schedule does,
        the outer step included), for example before evaluating or saving it; a round in
        flight is taken first. Outside the process set it does nothing."""
        if not self._included:
            return
        if self._round is not None:
            self._take_round()
        self._average(ALL)

    # ---- rounds ----

    def _trainable(self) -> list:
        if isinstance(self.model, (list, tuple)):
            return list(self.model)
        return list(self.model.trainable_variables)

    def _averaged(self) -> list:
        """What a round averages: the trainable variables, then the floating-point others
        asked for (read at each round: a model built later has them then)."""
        trainable = self._trainable()
        if isinstance(self.model, (list, tuple)) or not self._average_buffers:
            return trainable
        mine = {id(v) for v in trainable}
        return trainable + [
            v
            for v in self.model.variables
            if id(v) not in mine and tf.as_dtype(v.dtype).is_floating
        ]

    def _variables(self) -> list:
        """_averaged(), refused when empty (a tf.Module's variables leave out the Keras 3
        layers' it holds, which are not tf.Variables)."""
        variables = self._averaged()
        if not variables:
            raise InvalidArgumentError(
                f"{self._what}: the model has no variables to average (a tf.Module does not "
                "list the variables of Keras 3 layers it holds: pass the Keras model or layer, "
                "or the list of variables)"
            )
        return variables

    def _submit(self, scope: str, values: List[np.ndarray]) -> list:
        """Average-allreduces each array in place over `scope`'s set; the handles."""
        ps = self._schedule.process_set(scope)
        return [
            submit_into(
                ALLREDUCE,
                self._schedule.name(scope, str(i)),
                v,
                inplace=True,
                op=Average,
                process_set=ps,
            )
            for i, v in enumerate(values)
        ]

    def _average(self, scope: str) -> None:
        """One averaging round over `scope` (Note [Local SGD]), with the outer step if any."""
        variables = self._variables()
        values = _values(variables)
        for h in self._submit(scope, values):
            synchronize(h)
        self._schedule.record(scope, sum(v.nbytes for v in values))
        # (average() during the warm-up averages alone: the anchor is taken at its end)
        if scope == ALL and self._outer is not None and not self._schedule.bulk():
            self._outer_step(variables, values)
        else:
            for v, value in zip(variables, values):
                v.assign(value)

    def _outer_step(self, variables: list, values: List[np.ndarray]) -> None:
        """DiLoCo's outer step: the trainable variables go back to the anchor and take the outer
        optimizer's step on (anchor - average); the others take the average; the result is the
        next anchor."""
        trainable = len(self._trainable())
        if self._anchor is None:
            # No warm-up: the model the ranks started from is not known here (they may have
            # broadcast it after their first step), so the first round is a plain average and
            # its result the first anchor.
            for v, value in zip(variables, values):
                v.assign(value)
        else:
            deltas = []
            for v, anchor, value in zip(variables, self._anchor, values[:trainable]):
                v.assign(anchor)
                deltas.append(tf.convert_to_tensor(anchor - value))
            self._outer.apply_gradients(zip(deltas, variables[:trainable]))
            for v, value in zip(variables[trainable:], values[trainable:]):
                v.assign(value)
        self._anchor = _values(variables[:trainable])

    def _start_round(self) -> None:
        """Note [Local SGD], bounded staleness: starts averaging snapshots of the model."""
        variables = self._variables()
        snapshots = _values(variables)
        averages = [s.copy() for s in snapshots]
        self._round = _Round(
            self._schedule.step, variables, snapshots, averages, self._submit(ALL, averages)
        )

    def _take_round(self) -> None:
        """Waits for the round in flight (counted as a wait if it had not arrived) and takes
        it: model = average + (model - snapshot)."""
        r = self._round
        self._wait_round()
        for v, snapshot, average in zip(r.variables, r.snapshots, r.averages):
            v.assign(average + (v.numpy() - snapshot))
        self._round = None

    def _wait_round(self, counted: bool = True) -> None:
        """Waits for the round in flight to arrive; `counted`: a wait of the schedule's (not a
        checkpoint's), counted in stats() if the round had not arrived."""
        r = self._round
        if r.handles is not None:
            self._schedule.wait(r.handles, sum(a.nbytes for a in r.averages), counted)
            r.handles = None

    # ---- resuming ----

    def state_dict(self) -> dict:
        """What a resumed run needs, as numpy arrays: the step count, the outer optimizer's
        anchor and variables, a round in flight (waited for here, taken when due)."""
        pending = None
        if self._round is not None:
            r = self._round
            self._wait_round(counted=False)
            pending = {
                "started": r.started,
                "snapshots": [s.copy() for s in r.snapshots],
                "averages": [a.copy() for a in r.averages],
            }
        return {
            "step": self._schedule.step,
            "anchor": None if self._anchor is None else [a.copy() for a in self._anchor],
            # an outer optimizer not yet built (no outer step made) has no state to carry
            "outer": _values(self._outer.variables) if self._outer_built() else None,
            "round": pending,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continues from a state_dict() of the same model's LocalSGD (a round of this one's
        own in flight is waited for and dropped)."""
        if self._round is not None:
            self._wait_round(counted=False)
            self._round = None
        self._schedule.step = int(state["step"])
        trainable = self._trainable()
        self._anchor = None
        if state.get("anchor") is not None:
            self._anchor = self._restored(state["anchor"], trainable, "anchor")
        if state.get("outer") is not None and self._outer is not None:
            if not self._outer.built:
                self._outer.build(trainable)
            saved = self._restored(state["outer"], self._outer.variables, "outer optimizer")
            for v, value in zip(self._outer.variables, saved):
                v.assign(value)
        pending = state.get("round")
        if pending is not None:
            variables = self._averaged()
            self._round = _Round(
                int(pending["started"]),
                variables,
                self._restored(pending["snapshots"], variables, "round's snapshots"),
                self._restored(pending["averages"], variables, "round's averages"),
                None,
            )

    def _outer_built(self) -> bool:
        return self._outer is not None and self._outer.built

    def _restored(self, saved, like: list, what: str) -> List[np.ndarray]:
        """Saved arrays of this LocalSGD's state, checked against the variables `like`."""
        saved = list(saved)
        if len(saved) != len(like):
            raise InvalidArgumentError(
                f"{self._what}.load_state_dict: the saved {what} has {len(saved)} arrays, the "
                f"model {len(like)}: saved from another model?"
            )
        out = []
        for i, (array, v) in enumerate(zip(saved, like)):
            array = np.asarray(array)
            if tuple(array.shape) != tuple(v.shape):
                raise InvalidArgumentError(
                    f"{self._what}.load_state_dict: the saved {what}'s array {i} has shape "
                    f"{tuple(array.shape)}, the variable {v.name!r} {tuple(v.shape)}"
                )
            out.append(np.array(array, dtype=tf.as_dtype(v.dtype).as_numpy_dtype, order="C"))
        return out


def _values(variables) -> List[np.ndarray]:
    """A copy of each variable's value, C-contiguous."""
    return [np.array(v.numpy(), order="C") for v in variables]


@dataclass
class _Round:
    """A round over the set in flight (Note [Local SGD], bounded staleness): the step count it
    started after, the variables it averages, their snapshots, the averages (being made in
    place while `handles` is not None)."""

    started: int
    variables: list
    snapshots: List[np.ndarray]
    averages: List[np.ndarray]
    handles: Optional[list]
