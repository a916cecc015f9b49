"""LocalSGDOptimizer: local steps with the model averaged every `period` steps (Note [Local SGD]
in scaleout/_local_sgd.py), over a DistributedOptimizer for the bulk-synchronous steps."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._local_sgd import ALL, Schedule
from scaleout._native import ALLREDUCE, Average, synchronize
from scaleout._process_sets import global_process_set, process_set_id
from scaleout.torch import _tensors
from scaleout.torch._compression import Compression
from scaleout.torch._optimizer import _DistributedMixin, wrap

__all__ = ["LocalSGDOptimizer"]

STATE_KEY = "scaleout_local_sgd"


class _LocalSGDMixin(_DistributedMixin):
    """A DistributedOptimizer whose gradients are reduced only on the schedule's bulk steps; on
    the others step() is the wrapped optimizer's, then the model is averaged when due."""

    def _so_local_setup(
        self,
        schedule: Schedule,
        outer: Optional[torch.optim.Optimizer],
        module: Optional[torch.nn.Module],
    ) -> None:
        self._so_local = schedule
        self._so_outer = outer
        # The buffers are read at each round: model.to(), .double() and
        # load_state_dict(assign=True) replace buffer tensors.
        self._so_module = None if module is None else weakref.ref(module)
        self._so_anchor: Optional[Dict[torch.Tensor, torch.Tensor]] = None
        self._so_round: Optional[_Round] = None  # a round over the set in flight (staleness)

    def _so_params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _so_capture_anchor(self) -> None:
        """The outer optimizer's anchor (Note [Local SGD]): the model as it is now."""
        self._so_anchor = {p: p.detach().clone() for p in self._so_params()}

    def _so_on_grad(self, p: torch.Tensor) -> None:
        if self._so_local.bulk():  # local steps reduce nothing while backward runs
            super()._so_on_grad(p)

    def add_param_group(self, param_group: dict) -> None:
        outer = getattr(self, "_so_outer", None)  # None too in the wrapped class's __init__
        if outer is not None:
            params = param_group.get("params", [])
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            theirs = {id(p) for g in outer.param_groups for p in g["params"]}
            if any(id(p) not in theirs for p in params):
                raise InvalidArgumentError(
                    "LocalSGDOptimizer.add_param_group: the outer optimizer does not have these "
                    "parameters; add them to it first (outer_optimizer.add_param_group)"
                )
        super().add_param_group(param_group)
        if outer is not None and self._so_anchor is not None:
            for p in self.param_groups[-1]["params"]:
                self._so_anchor[p] = p.detach().clone()

    def synchronize(self) -> None:
        """As DistributedOptimizer's on bulk-synchronous steps; on local steps the gradients
        stay this rank's, so there is nothing to wait for (clipping between synchronize() and
        step() works as with DistributedOptimizer)."""
        if self._so_local.bulk():
            super().synchronize()

    # Note [Local SGD and GradScaler]
    # torch.amp.GradScaler.step skips the optimizer's step when this rank's gradients hold an
    # inf or a NaN; a local step's gradients are this rank's alone, so a skipped call would put
    # its schedule a step behind the others' for good. Saying that the step handles scaling
    # itself makes GradScaler call it every time, with `found_inf` and `grad_scale` set on the
    # optimizer: the step is then counted whether or not it updates (unscaled here, unless the
    # wrapped optimizer does that itself, as the fused ones do). Bulk-synchronous steps take
    # Horovod's pattern, as DistributedOptimizer's do: synchronize(), scaler.unscale_(opt),
    # then scaler.step(opt) inside skip_synchronize(), so that every rank's found_inf comes
    # from the same reduced gradients.
    _step_supports_amp_scaling = True

    def step(self, closure=None):
        amp = _amp_request(self)
        if amp is None:
            return self._so_step(closure, None)
        # GradScaler's attributes stay for it to delete; the wrapped step must not see them
        saved = {k: self.__dict__.pop(k) for k in ("grad_scale", "found_inf")}
        try:
            return self._so_step(closure, amp)
        finally:
            self.__dict__.update(saved)

    def _so_step(self, closure, amp: Optional[Tuple[bool, Optional[torch.Tensor]]]):
        if not self._so_included:  # outside the process set: the wrapped step alone
            return self._so_own_step(closure, amp)
        if self._so_local.bulk():
            if amp is None:
                loss = super().step(closure)
            else:
                loss = self._so_amp_bulk_step(*amp)
            self._so_local.finish_step()
            if self._so_outer is not None and not self._so_local.bulk():
                self._so_capture_anchor()  # the warm-up's end: the same model everywhere
            return loss
        if self._so_outer is not None and self._so_anchor is None:
            self._so_capture_anchor()  # after warm-up, or as broadcast at the start: everywhere
        loss = self._so_own_step(closure, amp)
        scope = self._so_local.finish_step()
        if self._so_round is not None and self._so_local.due(self._so_round.started):
            self._so_take_round()
        if scope == ALL and self._so_local.staleness:
            self._so_start_round()
        elif scope is not None:
            self._so_average(scope)
        return loss

    step.hooked = True  # as DistributedOptimizer's (the wrapped class's step runs the hooks)

    def _so_own_step(self, closure, amp):
        """The wrapped optimizer's step on this rank's gradients; under GradScaler, skipped if
        they overflowed, on unscaled gradients otherwise."""
        if amp is None:
            return self._so_wrapped_step(closure)
        found_inf, grad_scale = amp
        if not found_inf:
            self._so_unscale(grad_scale)
            self._so_wrapped_step()
        return None

    def _so_amp_bulk_step(self, found_inf: bool, grad_scale) -> None:
        """A bulk-synchronous step under GradScaler (Note [Local SGD and GradScaler])."""
        if not (self._so_skip or self._so_synchronized):
            # GradScaler judged this rank's gradients while the core was still reducing into
            # them: the ranks could disagree on skipping the step
            raise ScaleoutError(
                "LocalSGDOptimizer: on a bulk-synchronous (warm-up) step under GradScaler, call "
                "optimizer.synchronize() and scaler.unscale_(optimizer) before "
                "scaler.step(optimizer), inside `with optimizer.skip_synchronize():`, so that "
                "every rank judges the same reduced gradients"
            )
        if found_inf:
            self._so_synchronized = False
            return
        self._so_unscale(grad_scale)
        with self.skip_synchronize():
            super().step()

    def _so_unscale(self, grad_scale) -> None:
        """Divides the gradients by GradScaler's scale (None: unscale_() already did)."""
        if grad_scale is None:
            return
        inverse = grad_scale.double().reciprocal().float()
        for p in self._so_params():
            if p.grad is not None:
                p.grad.mul_(inverse.to(p.grad.device))

    def average(self) -> None:
        """Averages the model over the whole process set now (as a round of the schedule does),
        for example before evaluating or saving it; the schedule goes on as it was. With an
        outer optimizer, the outer step is made too; with staleness, a round in flight is
        taken first. Outside the process set it does nothing."""
        if not self._so_included:
            return
        if self._so_round is not None:
            self._so_take_round()
        self._so_average(ALL)

    def _so_averaged(self) -> List[Tuple[str, torch.Tensor]]:
        """What a round averages: the parameters, and the floating-point buffers asked for."""
        tensors = [(self._so_names[p], p) for p in self._so_params()]
        module = None if self._so_module is None else self._so_module()
        if module is not None:
            tensors += [(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
        return tensors

    def _so_submit(self, scope: str, tensors) -> list:
        """Average-allreduces each (name, tensor) in place over `scope`'s set; the handles."""
        schedule = self._so_local
        ps = schedule.process_set(scope)
        return [
            _tensors.submit_into(
                ALLREDUCE,
                t,
                schedule.name(scope, name),
                True,
                Average,
                0,
                1.0,
                1.0,
                "LocalSGDOptimizer",
                ps,
            )
            for name, t in tensors
        ]

    def _so_average(self, scope: str) -> None:
        """Note [Local SGD]: one averaging round of the parameters (and buffers) over `scope`."""
        tensors = [(name, t.detach()) for name, t in self._so_averaged()]
        with torch.no_grad():
            for h in self._so_submit(scope, tensors):
                synchronize(h)
            self._so_local.record(scope, sum(t.numel() * t.element_size() for _, t in tensors))
            # (average() during the warm-up averages alone: the anchor is taken at its end)
            if scope == ALL and self._so_outer is not None and not self._so_local.bulk():
                self._so_outer_step()

    def _so_start_round(self) -> None:
        """Note [Local SGD], bounded staleness: starts averaging snapshots of the model."""
        tensors = self._so_averaged()
        with torch.no_grad():
            snapshots = [t.detach().clone() for _, t in tensors]
            averages = [s.clone() for s in snapshots]
            handles = self._so_submit(ALL, [(name, a) for (name, _), a in zip(tensors, averages)])
        self._so_round = _Round(
            self._so_local.step,
            [name for name, _ in tensors],
            [t for _, t in tensors],
            snapshots,
            averages,
            handles,
        )

    def _so_take_round(self) -> None:
        """Waits for the round in flight (counted as a wait if it had not arrived) and takes
        it: model = average + (model - snapshot)."""
        r = self._so_round
        self._so_wait_round()
        with torch.no_grad():
            for t, snapshot, average in zip(r.tensors, r.snapshots, r.averages):
                t.detach().add_(average - snapshot)
        self._so_round = None

    def _so_wait_round(self, counted: bool = True) -> None:
        """Waits for the round in flight to arrive; `counted`: a wait of the schedule's (not a
        checkpoint's), counted in stats() if the round had not arrived."""
        r = self._so_round
        if r.handles is not None:
            nbytes = sum(a.numel() * a.element_size() for a in r.averages)
            self._so_local.wait(r.handles, nbytes, counted)
            r.handles = None

    def _so_outer_step(self) -> None:
        """DiLoCo's outer step (Note [Local SGD]): the anchor moves by the outer optimizer's
        step on the averaged change, and every rank's model becomes the new anchor."""
        params = self._so_params()
        anchor = self._so_anchor
        if anchor is None:  # average() before any local step: the model is the anchor
            self._so_capture_anchor()
            return
        saved = {p: p.grad for p in params}
        try:
            for p in params:
                delta = anchor[p] - p.detach()
                p.detach().copy_(anchor[p])
                p.grad = delta
            self._so_outer.step()
        finally:
            for p in params:
                p.grad = saved[p]
        for p in params:
            anchor[p].copy_(p.detach())

    def state_dict(self):
        """The wrapped optimizer's state_dict, with the local-SGD state (the step count, the
        anchor by parameter name, the outer optimizer's state) under 'scaleout_local_sgd'."""
        out = super().state_dict()
        anchor = None
        if self._so_anchor is not None:
            anchor = {self._so_names[p]: t.clone() for p, t in self._so_anchor.items()}
        pending = None
        if self._so_round is not None:  # arrived (waited for here), to be taken when due
            r = self._so_round
            self._so_wait_round(counted=False)
            pending = {
                "started": r.started,
                "snapshots": dict(zip(r.names, (s.clone() for s in r.snapshots))),
                "averages": dict(zip(r.names, (a.clone() for a in r.averages))),
            }
        out[STATE_KEY] = {
            "step": self._so_local.step,
            "anchor": anchor,
            "outer": None if self._so_outer is None else self._so_outer.state_dict(),
            "round": pending,
        }
        return out

    def load_state_dict(self, state_dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        if self._so_round is not None:  # a round of this optimizer's own in flight
            self._so_wait_round(counted=False)
            self._so_round = None
        if saved is None:
            return
        self._so_local.step = int(saved["step"])
        anchor = saved.get("anchor")
        self._so_anchor = None
        if anchor is not None:
            by_name = {name: p for p, name in self._so_names.items()}
            self._so_anchor = {
                p: _restored(anchor, name, p, "anchor") for name, p in by_name.items()
            }
        if saved.get("outer") is not None and self._so_outer is not None:
            self._so_outer.load_state_dict(saved["outer"])
        pending = saved.get("round")
        if pending is not None:
            tensors = self._so_averaged()
            self._so_round = _Round(
                int(pending["started"]),
                [name for name, _ in tensors],
                [t for _, t in tensors],
                [_restored(pending["snapshots"], n, t, "round's snapshot") for n, t in tensors],
                [_restored(pending["averages"], n, t, "round's average") for n, t in tensors],
                None,
            )


def _amp_request(optimizer) -> Optional[Tuple[bool, Optional[torch.Tensor]]]:
    """(found_inf, grad_scale) where GradScaler.step is calling and the wrapped optimizer does
    not apply them itself (Note [Local SGD and GradScaler]); None otherwise."""
    found_inf = optimizer.__dict__.get("found_inf")
    if found_inf is None:
        return None
    if optimizer.__dict__.get("_step_supports_amp_scaling", False):
        return None  # the fused optimizers (their instance says so) read both themselves
    return bool(found_inf.item()), optimizer.__dict__["grad_scale"]


def _restored(saved: dict, name: str, like: torch.Tensor, what: str) -> torch.Tensor:
    """A saved tensor of LocalSGDOptimizer's state, as `like` (device, dtype), checked."""
    if name not in saved:
        raise InvalidArgumentError(
            f"LocalSGDOptimizer.load_state_dict: the saved {what} has no '{name}' (it has "
            f"{sorted(saved)[:5]}...): saved from another model?"
        )
    t = saved[name]
    if tuple(t.shape) != tuple(like.shape):
        raise InvalidArgumentError(
            f"LocalSGDOptimizer.load_state_dict: the saved {what} of '{name}' has shape "
            f"{tuple(t.shape)}, the model's {tuple(like.shape)}"
        )
    return t.detach().to(device=like.device, dtype=like.dtype).clone()


@dataclass
class _Round:
    """A round over the set in flight (Note [Local SGD], bounded staleness): the step count it
    started after, the names and tensors it averages, their snapshots, the averages (being made
    in place while `handles` is not None)."""

    started: int
    names: List[str]
    tensors: List[torch.Tensor]
    snapshots: List[torch.Tensor]
    averages: List[torch.Tensor]
    handles: Optional[list]


def _model_and_names(named_parameters, average_buffers: bool):
    """(the (name, parameter) pairs or None, the module whose buffers are averaged or None)."""
    if isinstance(named_parameters, torch.nn.Module):
        module = named_parameters
        return list(module.named_parameters()), module if average_buffers else None
    if average_buffers:
        raise InvalidArgumentError(
            "LocalSGDOptimizer: pass the model itself as named_parameters, so that its buffers "
            "(BatchNorm's running statistics) are averaged with its parameters, or "
            "average_buffers=False to leave the buffers to each rank"
        )
    return named_parameters, None


def LocalSGDOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters,
    period: int,
    warmup_steps: int = 0,
    hierarchical: Optional[bool] = None,
    outer_optimizer: Optional[torch.optim.Optimizer] = None,
    average_buffers: bool = True,
    process_set=global_process_set,
    staleness: int = 0,
) -> torch.optim.Optimizer:
    """Wraps a torch.optim optimizer for local SGD (Note [Local SGD]): each rank steps on its own
    gradients, and the model is averaged over the ranks every `period` steps.

    - named_parameters: the model (an nn.Module: its parameters and, with average_buffers, its
      buffers are averaged), or model.named_parameters() with average_buffers=False.
    - period: steps between averaging rounds (1, without an outer optimizer: every step
      reduces the gradients, exactly DistributedOptimizer).
    - warmup_steps: the first steps are bulk-synchronous (gradients reduced, as
      DistributedOptimizer does, overlapped with backward).
    - hierarchical: None (default) also averages among a machine's ranks after every local
      step where the job's allreduces are hierarchical (ranks on several machines); True
      requires that; False never does.
    - outer_optimizer: DiLoCo's outer optimizer over the same parameters (for example
      torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)): at every round
      over the set, the averaged change since the last round is its gradient, and the model
      becomes its step from the last round's model.
    - average_buffers: average the model's floating-point buffers at every round too (integer
      buffers, such as BatchNorm's num_batches_tracked, advance alike on every rank).
    - process_set: the ranks that average together.
    - staleness: 0 (default): a round over the set stops every rank until it is done. S >= 1
      (at most period): bounded staleness: each round is made while the ranks step on, and
      taken S steps after it started (model = average + own progress since); a rank that
      gets there before the slowest has joined the round waits, so none runs more than S
      steps past it. Not with an outer optimizer.

    Start from the same model on every rank (broadcast_parameters), as with
    DistributedOptimizer. state_dict() carries the step count, the anchor and the outer
    optimizer's state under 'scaleout_local_sgd', so a resumed run continues the period where
    it stopped. average() averages now (before evaluating or saving). stats()["local_sgd"]
    counts the rounds and their bytes.
    """
    named, module = _model_and_names(named_parameters, average_buffers)
    if outer_optimizer is not None:
        if not isinstance(outer_optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(
                "LocalSGDOptimizer: outer_optimizer must be a torch.optim.Optimizer, not "
                f"{type(outer_optimizer).__name__}"
            )
        mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
        outer = {id(p) for g in outer_optimizer.param_groups for p in g["params"]}
        if mine != outer:
            raise InvalidArgumentError(
                "LocalSGDOptimizer: outer_optimizer must optimize the same parameters as the "
                f"optimizer ({len(outer - mine)} of its parameters are not the optimizer's, "
                f"{len(mine - outer)} of the optimizer's are not its)"
            )
    ps = process_set_id(process_set, "LocalSGDOptimizer")
    schedule = Schedule(
        period, warmup_steps, outer_optimizer is not None, hierarchical, ps, staleness
    )
    wrapped = wrap(optimizer, _LocalSGDMixin, "LocalSGDOptimizer")
    wrapped._so_setup(
        named, Compression.none, 1, Average, 1.0, False, 0, None, process_set, False, None
    )
    wrapped._so_local_setup(schedule, outer_optimizer, module)
    return wrapped
