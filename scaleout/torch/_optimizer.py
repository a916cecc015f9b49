"""DistributedOptimizer: averages gradients across ranks, overlapped with back-propagation.

Each parameter gets a post-accumulate-grad hook. When backward has produced a parameter's
gradient (backward_passes_per_step times), the hook starts its reduction at once (by default an
in-place allreduce of `p.grad`; the strategies are in _reductions.py), so the core reduces (and
fuses) the last layers' gradients while autograd still computes the earlier layers'. step()
waits for all of them, then runs the wrapped optimizer's step.

The returned object is an instance of a subclass of the wrapped optimizer's class (so
isinstance checks, LR schedulers, state_dict() and load_state_dict() work) that shares the
wrapped optimizer's parameter groups and state.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
import weakref
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from scaleout._errors import InvalidArgumentError, ScaleoutError
from scaleout._gradient_rules import (
    check_adasum_process_set,
    check_backward_passes_per_step,
    check_predivide_op,
    predivided,
)
from scaleout._native import Adasum, Average, Sum, resolve_op
from scaleout._process_sets import global_process_set, process_set_id, set_rank, set_size
from scaleout.torch._compression import Compression
from scaleout.torch._overlap import ForwardOverlap, _zero
from scaleout.torch._reductions import STATE_KEY, Allreduce, reduction_for
from scaleout.torch._tensors import check_device

__all__ = ["DistributedOptimizer"]


class _DistributedMixin:
    """Methods layered over a torch.optim.Optimizer subclass. Attributes are prefixed `_so_` so
    they cannot collide with the optimizer's own. How the gradients are combined is the
    strategy's (`_so_reduction`, scaleout/torch/_reductions.py), chosen here once."""

    # ---- set-up ----

    def _so_setup(
        self,
        named_parameters,
        compression,
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
        sparse_as_dense: bool,
        num_groups: int,
        groups,
        process_set,
        priority,
        overlap_forward,
    ) -> None:
        self._so_ps = process_set_id(process_set, "DistributedOptimizer")
        # As Horovod's: on a rank outside the set, step() is the wrapped optimizer's alone.
        self._so_included = set_rank(self._so_ps) >= 0
        if resolve_op(op) == Adasum:
            check_adasum_process_set(self._so_ps)
            check_predivide_op(Adasum, gradient_predivide_factor)
        elif resolve_op(op) not in (Average, Sum):
            raise InvalidArgumentError(
                "DistributedOptimizer reduces gradients with op=Average, op=Sum or op=Adasum"
            )
        # Horovod's public attributes.
        self.op = op
        self.process_set = process_set
        reduce_op, prescale, postscale = predivided(
            op, gradient_predivide_factor, set_size(self._so_ps)
        )
        self._so_reduction = reduction_for(
            self,
            op,
            compression or Compression.none,
            reduce_op,
            prescale,
            postscale,
            self._so_ps,
            process_set,
            sparse_as_dense,
        )
        self._so_names: Dict[torch.Tensor, str] = {}
        self._so_group_index: Dict[torch.Tensor, int] = {}  # parameter -> its group's index
        self._so_named = None if named_parameters is None else _check_names(named_parameters)
        self._so_passes = 1
        self._so_passes_left: Dict[torch.Tensor, int] = {}
        self._so_handles: Dict[torch.Tensor, object] = {}  # what the strategy started
        self._so_hooks = []
        self._so_synchronized = False
        self._so_skip = False
        # Fusion groups (Horovod's groups=/num_groups=): a group's reductions start together,
        # once backward has produced every gradient of the group.
        self._so_group_of: Dict[torch.Tensor, int] = {}
        self._so_group_members: List[List[torch.Tensor]] = []
        self._so_group_ready: Dict[int, set] = {}
        self._so_overlap: Optional[ForwardOverlap] = None
        self.set_backward_passes_per_step(backward_passes_per_step)
        for group_index, group in enumerate(self.param_groups):
            self._so_register(group_index, group["params"])
        self._so_set_groups(num_groups, groups)
        if priority is None:
            priority = overlap_forward is not None
        self._so_priority = self._so_priorities(priority)
        if overlap_forward is not None and self._so_included:
            if not isinstance(self._so_reduction, Allreduce):
                raise InvalidArgumentError(
                    "overlap_forward works with gradients reduced by allreduce: not with "
                    "op=Adasum or Compression.topk"
                )
            self._so_overlap = ForwardOverlap(self, overlap_forward, weakref.ref(self))

    def _so_priorities(self, priority) -> Dict[torch.Tensor, int]:
        """Note [Priority] in the core: each parameter's gradient priority, the first parameter
        the highest. True: in the order of named_parameters (of the parameter groups without
        it); a sequence of parameters or their names: those first, in that order, then the
        rest; False: none."""
        if priority is False:
            return {}
        order = [p for p in (self._so_named or self._so_names) if p in self._so_passes_left]
        if priority is not True:
            if isinstance(priority, (str, bytes, torch.Tensor)) or not hasattr(
                priority, "__iter__"
            ):
                raise InvalidArgumentError(
                    "priority must be True, False, or a sequence of parameters (or their names) "
                    f"in the order their reductions should complete, not {type(priority).__name__}"
                )
            by_name = {name: p for p, name in self._so_names.items()}
            first: List[torch.Tensor] = []
            chosen = set()
            for item in priority:
                p = by_name.get(item) if isinstance(item, str) else item
                if not isinstance(p, torch.Tensor) or p not in self._so_names:
                    raise InvalidArgumentError(
                        f"priority names {item if isinstance(item, str) else 'a tensor'!r}, "
                        "which is not a parameter the optimizer updates"
                    )
                if p in chosen:
                    raise InvalidArgumentError(
                        f"priority lists '{self._so_names[p]}' more than once"
                    )
                first.append(p)
                chosen.add(p)
            order = [p for p in first if p in self._so_passes_left] + [
                p for p in order if p not in chosen
            ]
        return {p: len(order) - i for i, p in enumerate(order)}

    @property
    def _parameter_names(self) -> Dict[torch.Tensor, str]:
        """Horovod's attribute: parameter -> the name its gradient is reduced under."""
        return self._so_names

    def _so_set_groups(self, num_groups: int, groups) -> None:
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if isinstance(groups, int) and not isinstance(groups, bool):
            num_groups, groups = groups, None  # Horovod's deprecated groups=<int>
        if groups is not None:
            members = []
            for g in groups:
                if not isinstance(g, (list, tuple)) or not all(
                    isinstance(p, torch.Tensor) for p in g
                ):
                    raise InvalidArgumentError(
                        "groups must be a list of lists of parameters "
                        "(or an int: the number of groups)"
                    )
                members.append([p for p in g if p.requires_grad])
        elif num_groups:
            if not isinstance(num_groups, int) or num_groups < 0:
                raise InvalidArgumentError(f"num_groups must be an int >= 0, not {num_groups!r}")
            n = min(num_groups, len(params))
            bounds = [len(params) * i // n for i in range(n + 1)] if n else []
            members = [params[bounds[i] : bounds[i + 1]] for i in range(n)]
        else:
            return
        known = set(params)
        for index, g in enumerate(members):
            for p in g:
                if p not in known:
                    raise InvalidArgumentError(
                        "groups names a parameter the optimizer does not update"
                    )
                if p in self._so_group_of:
                    raise InvalidArgumentError(
                        f"parameter '{self._so_names[p]}' is in more than one of groups"
                    )
                self._so_group_of[p] = index
        self._so_group_members = members
        self._so_group_ready = {i: set() for i in range(len(members))}

    def _so_register(self, group_index: int, params: List[torch.Tensor]) -> None:
        unnamed = []
        for i, p in enumerate(params):
            if self._so_named is None:
                name = f"param.{group_index}.{i}"
            else:
                name = self._so_named.get(p)
                if name is None:
                    unnamed.append(p)
                    continue
            check_device(p.device)
            self._so_names[p] = name
            self._so_group_index[p] = group_index
        if unnamed:
            shapes = ", ".join(str(tuple(p.shape)) for p in unnamed[:5])
            raise InvalidArgumentError(
                f"named_parameters misses {len(unnamed)} parameter(s) the optimizer updates "
                f"(shapes {shapes}{', ...' if len(unnamed) > 5 else ''}); pass the "
                "named_parameters() of the model whose parameters the optimizer holds"
            )
        me = weakref.ref(self)
        for p in params:
            if p.requires_grad and self._so_included:
                self._so_passes_left[p] = self._so_passes
                self._so_hooks.append(
                    p.register_post_accumulate_grad_hook(
                        lambda param, me=me: _grad_ready(me, param)
                    )
                )

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_so_names"):  # not during the wrapped class's own __init__
            self._so_register(len(self.param_groups) - 1, self.param_groups[-1]["params"])
            if self._so_overlap is not None:  # Note [Forward overlap]: its modules are hooked
                self._so_overlap.cover(self, self.param_groups[-1]["params"])

    def set_backward_passes_per_step(self, passes: int) -> None:
        """How many backward passes accumulate locally before the gradients are reduced."""
        check_backward_passes_per_step(passes)
        if self._so_handles:
            raise ScaleoutError(
                "set_backward_passes_per_step() while gradient reductions are "
                "pending; call it after step()"
            )
        self._so_passes = passes
        self.backward_passes_per_step = passes
        self._so_reset_counts()

    # ---- backward and step ----

    def _so_on_grad(self, p: torch.Tensor) -> None:
        if p not in self._so_passes_left:
            return
        if self._so_overlap is not None:
            self._so_overlap.check_gradient(self, p)
        if p in self._so_handles:
            raise ScaleoutError(
                f"the gradient of '{self._so_names[p]}' was computed more than "
                f"backward_passes_per_step={self._so_passes} times before step() or "
                "synchronize(); raise backward_passes_per_step to accumulate more passes "
                "locally"
            )
        self._so_synchronized = False
        left = self._so_passes_left[p] - 1
        self._so_passes_left[p] = left
        if left != 0:
            return
        index = self._so_group_of.get(p)
        if index is None:
            self._so_start(p)
            return
        ready = self._so_group_ready[index]
        ready.add(p)
        if len(ready) == len(self._so_group_members[index]):
            for member in self._so_group_members[index]:
                self._so_start(member)

    def _so_start(self, p: torch.Tensor) -> None:
        self._so_handles[p] = self._so_reduction.start(
            self, p, self._so_names[p], self._so_priority.get(p, 0)
        )

    def _so_start_all(self) -> Dict[torch.Tensor, object]:
        """Starts the reductions backward did not (a gradient this rank did not produce) and
        returns all of them, started; the aggregation window starts again."""
        try:
            for p in self._so_passes_left:
                if p not in self._so_handles:
                    self._so_start(p)
        finally:
            self._so_reset_counts()
        pending, self._so_handles = self._so_handles, {}
        return pending

    def _so_finish_all(self) -> None:
        """Starts the reductions backward did not and waits for all of them."""
        self._so_apply_deferred()
        pending = self._so_start_all()
        self._so_reduction.finish(self, pending)

    def _so_apply_deferred(self) -> None:
        """Note [Forward overlap]: the updates the last step() deferred, made now."""
        if self._so_overlap is not None:
            self._so_overlap.apply_all(self)

    def _so_wrapped_step(self, closure=None):
        """The wrapped optimizer's own step (Note [Adasum optimizer] runs it per parameter)."""
        return super().step() if closure is None else super().step(closure)

    def state_dict(self):
        """The wrapped optimizer's state_dict; with Compression.topk also the residuals (and
        velocities) by parameter name and the step count, under 'scaleout_topk'."""
        self._so_apply_deferred()
        out = super().state_dict()
        saved = self._so_reduction.state()
        if saved is not None:
            out[STATE_KEY] = saved
        return out

    def load_state_dict(self, state_dict) -> None:
        self._so_apply_deferred()
        state_dict = dict(state_dict)
        saved = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        self._so_reduction.load_state(saved)

    def synchronize(self) -> None:
        """Waits for every gradient's reduction (starting those backward did not produce) and
        leaves the reduced gradients in p.grad. Follow with `with
        optimizer.skip_synchronize(): optimizer.step()` to modify gradients in between.
        With op=Adasum it does nothing (as Horovod's): step() does the work."""
        if self._so_reduction.combines_updates:
            return
        self._so_finish_all()
        self._so_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """step() inside this block does not reduce: use after an explicit synchronize()."""
        if self._so_reduction.combines_updates:
            raise AssertionError(
                "skip_synchronize() cannot be used with op=Adasum (as in "
                "Horovod): step() steps locally and combines the changes"
            )
        self._so_skip = True
        try:
            yield
        finally:
            self._so_skip = False

    def step(self, closure=None):
        loss = None
        if closure is not None:
            # Run the closure (forward and backward) here, so its gradients are reduced before
            # the wrapped step uses them.
            with torch.enable_grad():
                loss = closure()
        if self._so_reduction.combines_updates:
            self._so_finish_all()  # Note [Adasum optimizer]: the wrapped step ran per parameter
            return loss
        if self._so_skip:
            if self._so_handles:
                raise ScaleoutError(
                    "step() inside skip_synchronize() while gradient reductions "
                    "are pending: call optimizer.synchronize() first"
                )
        elif self._so_overlap is not None and not self._so_synchronized:
            # Note [Forward overlap]: the updates wait for the next forward pass.
            self._so_apply_deferred()
            self._so_overlap.defer(self, self._so_start_all())
            return loss
        else:
            if self._so_synchronized:
                # Horovod's behaviour, kept for compatibility: warn, then reduce again (a
                # second Average leaves averaged gradients as they are; a second Sum does not).
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() "
                    "context after optimizer.synchronize(): the gradients are reduced "
                    "a second time, which slows training. Wrap step() in `with "
                    "optimizer.skip_synchronize():` after an explicit synchronize().",
                    stacklevel=2,
                )
            self.synchronize()
        self._so_synchronized = False
        with self._so_reduction.stepping(self):
            super().step()
        return loss

    # The wrapped class's step() already runs the optimizer's step hooks; this flag keeps
    # Optimizer._patch_step_function (called by load_state_dict) from wrapping this one too.
    step.hooked = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._so_handles:
            raise ScaleoutError(
                "zero_grad() was called while gradient reductions are pending (after backward(), "
                "before step() or synchronize()); the core is still writing those gradients. "
                "Call step() or synchronize() first."
            )
        self._so_reset_counts()
        overlap = self._so_overlap
        if overlap is None or not overlap.deferred:
            super().zero_grad(set_to_none=set_to_none)
            return
        # Note [Forward overlap]: a deferred parameter's gradient is zeroed after its update.
        overlap.zero_grad(set_to_none)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p not in overlap.deferred:
                        _zero(p, set_to_none)

    def __del__(self):
        for hook in getattr(self, "_so_hooks", ()):
            hook.remove()
        if getattr(self, "_so_overlap", None) is not None:
            self._so_overlap.remove()

    def _so_reset_counts(self) -> None:
        for p in self._so_passes_left:
            self._so_passes_left[p] = self._so_passes
        for ready in self._so_group_ready.values():
            ready.clear()


def _grad_ready(optimizer_ref, param: torch.Tensor) -> None:
    optimizer = optimizer_ref()
    if optimizer is not None:  # a dropped DistributedOptimizer no longer reduces
        optimizer._so_on_grad(param)


def _check_names(named_parameters) -> Dict[torch.Tensor, str]:
    pairs = list(named_parameters)
    for pair in pairs:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], torch.Tensor)
        ):
            raise InvalidArgumentError(
                "named_parameters must be (name, parameter) pairs, as model.named_parameters() "
                f"gives; got {type(pair).__name__} {str(pair)[:60]}"
            )
    counts = collections.Counter(name for name, _ in pairs)
    duplicates = sorted(name for name, n in counts.items() if n > 1)
    if duplicates:
        raise InvalidArgumentError(f"named_parameters has duplicate names: {duplicates[:10]}")
    by_param: Dict[torch.Tensor, str] = {}
    for name, p in pairs:
        by_param.setdefault(p, name)
    return by_param


_classes: Dict[Tuple[type, type], type] = {}


def wrap(optimizer: torch.optim.Optimizer, mixin: type, what: str) -> torch.optim.Optimizer:
    """An instance of a subclass of `optimizer`'s class with `mixin` before it, sharing the
    optimizer's parameter groups, state and hooks (not yet set up: the caller's _so_setup)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError(
            f"{what} wraps a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    if isinstance(optimizer, _DistributedMixin):
        raise InvalidArgumentError(
            f"{what} wraps a plain torch.optim optimizer; this one is already a "
            f"{'LocalSGDOptimizer' if hasattr(optimizer, '_so_local') else 'DistributedOptimizer'}"
        )
    base = type(optimizer)
    cls = _classes.get((mixin, base))
    if cls is None:
        cls = _classes[(mixin, base)] = type(
            base.__name__, (mixin, base), {"__module__": base.__module__}
        )
    wrapped = cls.__new__(cls)
    # Share groups, state and hooks. An LR scheduler made on the original optimizer left a
    # `step` wrapper on the instance that would bypass the reduction: leave it behind.
    state = dict(optimizer.__dict__)
    if "step" in state:
        warnings.warn(
            f"an LR scheduler was created on the optimizer before wrapping it; create "
            f"schedulers on the {what} instead",
            stacklevel=3,
        )
        del state["step"]
    wrapped.__dict__.update(state)
    return wrapped


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    compression=Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
    process_set=global_process_set,
    priority=None,
    overlap_forward: Optional[torch.nn.Module] = None,
) -> torch.optim.Optimizer:
    """Wraps a torch.optim optimizer so that step() uses gradients averaged over all ranks.

    - named_parameters: model.named_parameters(); the names identify the reductions across
      ranks (every parameter the optimizer updates must be named, names must be unique).
      Without it, parameters are named by their position in the parameter groups.
    - compression: Compression.none (default), .fp16 or .bf16 for the wire; or
      Compression.topk(density, momentum_correction, warmup_steps): each rank sends the top
      `density` of each gradient plus its residual and keeps the rest (Note [Top-k
      sparsification]); the residuals are in state_dict() under 'scaleout_topk'.
    - backward_passes_per_step: k backward passes accumulate (sum) locally in p.grad before the
      reduction, as in plain PyTorch gradient accumulation; scale the loss by 1/k for a mean.
    - op: Average (default) or Sum over ranks. gradient_predivide_factor f (with Average):
      gradients are divided by f before the sum and multiplied by f/size after it. Adasum:
      Horovod's Adasum optimizer (each parameter stepped locally, the changes combined with
      Adasum; Note [Adasum optimizer]); global process set only, no predivide factor.
    - num_groups: split the parameters (in parameter-group order) into this many groups;
      groups: a list of lists of parameters (an int means num_groups, as in Horovod). A group's
      reductions start together once backward has produced all of its gradients, so they are
      fused together; parameters in no group start as soon as their gradient is ready. (Without
      groups the core fuses whatever gradients are ready, up to SCALEOUT_FUSION_THRESHOLD bytes.)
    - sparse_as_dense: reduce sparse gradients (nn.Embedding(sparse=True)) as dense tensors.
      By default (False) a sparse gradient is reduced as Horovod does: its indices and values
      are allgathered (sparse_allreduce_async), and p.grad becomes the gathered sparse tensor
      (values divided by the set's size for Average).
    - process_set: gradients are reduced among the ranks of this set (a registered
      ProcessSet; Average divides by its size). On a rank outside the set, step() applies the
      local gradients, as in Horovod.
    - priority (scaleout's own; Note [Priority] in the core): True gives the first parameters'
      gradients (in named_parameters order) the highest priority, so that among reductions
      ready at the same time the first layers' complete first; a sequence of parameters or
      names gives the order itself (the rest follow); False: none. Default: True with
      overlap_forward, else False.
    - overlap_forward (scaleout's own; Note [Forward overlap]): the model. step() then returns
      without waiting, and each module waits for its own parameters' reductions and updates
      them just before its next forward, so the next step's forward starts while the last
      layers' gradients are still reduced. The updates are those step() would make; the
      model's and the optimizer's state_dict() apply them first.

    Horovod's attributes `op`, `process_set`, `backward_passes_per_step` and
    `_parameter_names` are there. As in Horovod, step() after an explicit synchronize() outside
    `skip_synchronize()` warns and reduces the gradients again.

    A parameter that got no gradient on this rank is reduced as zeros, so no rank waits forever
    (one that got none on any rank is left with a zero gradient, as in Horovod). Create LR
    schedulers on the returned optimizer; the parameters' hooks go when it is deleted.
    """
    wrapped = wrap(optimizer, _DistributedMixin, "DistributedOptimizer")
    wrapped._so_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
        num_groups,
        groups,
        process_set,
        priority,
        overlap_forward,
    )
    return wrapped
