"""Note [Forward overlap]
DistributedOptimizer(..., overlap_forward=model): step() starts what backward did not, then
returns without waiting. Each module of `model` that holds parameters gets a forward pre-hook:
before the module's next forward runs, it waits for its own parameters' reductions and runs the
wrapped optimizer's step for those parameters alone. With the priorities of Note [Priority] in
the core (the first layers' gradients ahead of the last layers'), the next forward pass starts on
the first layers while the last layers' reductions are still in flight, as Intel MLSL and
BytePS let it.

The updates are the ones step() would have made, bit for bit: each parameter is stepped once,
with the hyperparameters its group had when step() was called (an LR scheduler stepped in
between changes the next step, not this one), and zero_grad() in between is applied to a
deferred parameter right after its update. Whatever reads the parameters or the optimizer
applies every deferred update first: the model's state_dict(), the optimizer's state_dict(),
load_state_dict(), synchronize() and the next step(); `optimizer.synchronize()` is the way to
make them current elsewhere (for example before reading `p.data` by hand).

A parameter must be used inside the forward of the module that holds it, as torch.nn's layers
do (nn.MultiheadAttention, which reads its out_proj's weight itself, applies its whole subtree).
One used elsewhere would be read before its update: its gradient arriving while its update is
still deferred raises an error that says so, rather than training on stale weights. Loading the
model's state_dict in between applies the update first (the load then replaces it).
"""

from __future__ import annotations

import copy
import weakref
from typing import Dict, List

import torch

from scaleout._errors import InvalidArgumentError, ScaleoutError


class ForwardOverlap:
    """The deferred updates of one DistributedOptimizer and the hooks on its model. Holds the
    optimizer weakly (through `opt_ref`): a dropped optimizer stays collectable."""

    def __init__(self, opt, model: torch.nn.Module, opt_ref) -> None:
        if not isinstance(model, torch.nn.Module):
            raise InvalidArgumentError(
                f"overlap_forward takes the model (a torch.nn.Module), not {type(model).__name__}"
            )
        self.deferred: Dict[torch.Tensor, object] = {}  # parameter -> what its reduction returned
        self.hyper: List[dict] = []  # each group's settings when step() deferred the updates
        self.zero_after: Dict[torch.Tensor, bool] = {}  # zero_grad() seen: set_to_none
        self.hooks = []
        self.model = weakref.ref(model)
        self.opt_ref = opt_ref
        try:
            self.cover(opt, set(opt._so_passes_left))
        except InvalidArgumentError:
            self.remove()
            raise
        self.hooks.append(model.register_state_dict_pre_hook(lambda *_args: _apply_all(opt_ref)))
        # Loading weights between step() and the next forward: the step's update comes first.
        self.hooks.append(
            model.register_load_state_dict_pre_hook(lambda *_args: _apply_all(opt_ref))
        )

    def cover(self, opt, params) -> None:
        """Hooks the modules holding `params` (the optimizer's, or a group added later)."""
        model = self.model()
        params = {p for p in params if p in opt._so_passes_left}  # those it reduces
        covered = set()
        for module in [] if model is None else model.modules():
            # nn.MultiheadAttention reads its out_proj's weight itself, never calling out_proj:
            # its own hook applies its whole subtree.
            held = module.parameters(recurse=isinstance(module, torch.nn.MultiheadAttention))
            own = [p for p in held if p in params]
            if not own:
                continue
            covered.update(own)
            self.hooks.append(
                module.register_forward_pre_hook(
                    lambda _module, _args, own=own: _before_forward(self.opt_ref, own)
                )
            )
        missing = [opt._so_names[p] for p in params if p not in covered]
        if missing:
            raise InvalidArgumentError(
                f"overlap_forward: the model does not hold {len(missing)} of the parameters the "
                f"optimizer updates ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})"
                "; pass the model whose parameters the optimizer holds"
            )

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def defer(self, opt, pending: Dict[torch.Tensor, object]) -> None:
        """Keeps the started reductions and the groups' settings; nothing waits."""
        # Copies: an LR scheduler may update a tensor lr in place.
        self.hyper = [
            {k: _copied(v) for k, v in g.items() if k != "params"} for g in opt.param_groups
        ]
        self.deferred = pending
        self.zero_after = {}

    def zero_grad(self, set_to_none: bool) -> None:
        for p in self.deferred:
            self.zero_after[p] = set_to_none

    def apply(self, opt, params) -> None:
        """Waits for these parameters' reductions and steps them (those still deferred)."""
        pending = {p: self.deferred.pop(p) for p in params if p in self.deferred}
        if not pending:
            return
        try:
            opt._so_reduction.finish(opt, pending)
        except BaseException:
            self._drop_all(opt)  # the step failed: nothing of it is applied later
            raise
        groups = opt.param_groups
        saved = [(g["params"], {k: g[k] for k in g if k != "params"}) for g in groups]
        try:
            for i, g in enumerate(groups):
                g["params"] = [p for p in g["params"] if p in pending]
                if i < len(self.hyper):  # a group added since step() has no deferred update
                    g.update(self.hyper[i])
            # An evaluation forward under inference_mode must not make the optimizer's state
            # inference tensors.
            with torch.inference_mode(False), opt._so_reduction.stepping(opt):
                opt._so_wrapped_step()
        finally:
            for g, (params, settings) in zip(groups, saved):
                g["params"] = params
                g.update(settings)
        for p in pending:
            to_none = self.zero_after.pop(p, None)
            if to_none is not None:
                _zero(p, to_none)

    def apply_all(self, opt) -> None:
        if self.deferred:
            self.apply(opt, list(self.deferred))

    def check_gradient(self, opt, p: torch.Tensor) -> None:
        """Backward produced p's gradient while its update is still deferred."""
        if p in self.deferred:
            self._drop_all(opt)
            raise ScaleoutError(
                f"overlap_forward: the gradient of '{opt._so_names[p]}' was computed while the "
                "update of the previous step() was still deferred: the parameter was used "
                "outside the forward of the module that holds it (Note [Forward overlap]), so "
                "it was read before its update. Use it inside that module's forward, or call "
                "optimizer.synchronize() before the forward pass"
            )

    def _drop_all(self, opt) -> None:
        pending, self.deferred = self.deferred, {}
        if pending:
            try:
                opt._so_reduction.finish(opt, pending)  # the core must stop writing into them
            except Exception:  # noqa: BLE001 - the first error is the one reported
                pass


def _copied(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, dict)):
        return copy.deepcopy(value)
    return value


def _zero(p: torch.Tensor, set_to_none: bool) -> None:
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


def _before_forward(opt_ref, params) -> None:
    opt = opt_ref()
    if opt is not None and opt._so_overlap is not None and opt._so_overlap.deferred:
        opt._so_overlap.apply(opt, params)


def _apply_all(opt_ref) -> None:
    opt = opt_ref()
    if opt is not None and opt._so_overlap is not None:
        opt._so_overlap.apply_all(opt)
