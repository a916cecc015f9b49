"""DistributedOptimizer: averages gradients across ranks, overlapped with back-propagation.

Each parameter gets a post-accumulate-grad hook. When backward has produced a parameter's
gradient (backward_passes_per_step times), the hook starts an in-place allreduce of `p.grad` at
once, so the core reduces (and fuses) the last layers' gradients while autograd still computes
the earlier layers'. step() waits for all of them, then runs the wrapped optimizer's step.

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
from torch.autograd.graph import increment_version

from scaleout._errors import InvalidArgumentError, NotYetImplementedError, ScaleoutError
from scaleout._gradient_rules import predivided
from scaleout._naming import parameter_gradient
from scaleout._native import Adasum, Average, Handle, Sum, resolve_op, synchronize, wait_all
from scaleout._process_sets import global_process_set, process_set_id, set_rank, set_size
from scaleout._topk import Momentum, TopK, TopKExchange, check_optimizer_momentum
from scaleout.torch._collectives import _allreduce_async, check_device, sparse_allreduce_async
from scaleout.torch._compression import Compression

__all__ = ["DistributedOptimizer"]


class _DistributedMixin:
    """Methods layered over a torch.optim.Optimizer subclass. Attributes are prefixed `_so_` so
    they cannot collide with the optimizer's own.

    Note [Adasum optimizer]
    With op=Adasum, as Horovod's optimizer for it: when backward has produced a parameter's
    gradient (backward_passes_per_step times), the hook keeps the parameter's value, runs the
    wrapped optimizer's step for that parameter alone, and starts an in-place Adasum allreduce
    of the change (the parameter minus the kept value). step() starts those backward did not
    reach, waits, and sets each parameter to its kept value plus the combined change; the
    wrapped optimizer is not stepped again. synchronize() does nothing; skip_synchronize()
    raises. Adasum adapts to how aligned the ranks' updates are, so the learning rate is not
    scaled with the number of ranks."""

    # ---- set-up ----

    def _so_setup(self, named_parameters, compression, backward_passes_per_step: int, op: int,
                  gradient_predivide_factor: float, sparse_as_dense: bool, num_groups: int,
                  groups, process_set) -> None:
        self._so_ps = process_set_id(process_set, "DistributedOptimizer")
        # As Horovod's: on a rank outside the set, step() is the wrapped optimizer's alone.
        self._so_included = set_rank(self._so_ps) >= 0
        # Note [Adasum optimizer]: with op=Adasum (and more than one rank) the wrapped
        # optimizer steps each parameter locally as soon as its gradient is ready, and the
        # parameter's change is what the ranks combine.
        self._so_adasum = resolve_op(op) == Adasum and set_size(self._so_ps) > 1
        if resolve_op(op) == Adasum:
            if self._so_ps != 0:  # as Horovod
                raise NotYetImplementedError("Adasum does not support non-global process sets "
                                             "yet")
            if gradient_predivide_factor != 1.0:
                raise InvalidArgumentError("gradient_predivide_factor not supported with "
                                           "op=Adasum")
        elif resolve_op(op) not in (Average, Sum):
            raise InvalidArgumentError("DistributedOptimizer reduces gradients with op=Average, "
                                       "op=Sum or op=Adasum")
        # Horovod's public attributes.
        self.op = op
        self.process_set = process_set
        self._so_op, self._so_prescale, self._so_postscale = predivided(
            op, gradient_predivide_factor, set_size(self._so_ps))
        self._so_compression = compression or Compression.none
        self._so_sparse_as_dense = sparse_as_dense
        self._so_topk = self._so_topk_setup(compression)
        self._so_starts: Dict[torch.Tensor, torch.Tensor] = {}  # Adasum: parameters before
        self._so_names: Dict[torch.Tensor, str] = {}
        self._so_group_index: Dict[torch.Tensor, int] = {}  # parameter -> its group's index
        self._so_named = None if named_parameters is None else _check_names(named_parameters)
        self._so_passes = 1
        self._so_passes_left: Dict[torch.Tensor, int] = {}
        self._so_handles: Dict[torch.Tensor, Tuple[Handle, object]] = {}
        self._so_hooks = []
        self._so_synchronized = False
        self._so_skip = False
        # Fusion groups (Horovod's groups=/num_groups=): a group's reductions start together,
        # once backward has produced every gradient of the group.
        self._so_group_of: Dict[torch.Tensor, int] = {}
        self._so_group_members: List[List[torch.Tensor]] = []
        self._so_group_ready: Dict[int, set] = {}
        self.set_backward_passes_per_step(backward_passes_per_step)
        for group_index, group in enumerate(self.param_groups):
            self._so_register(group_index, group["params"])
        self._so_set_groups(num_groups, groups)

    def _so_topk_setup(self, compression) -> Optional["_TopKState"]:
        """Note [Top-k sparsification] (scaleout/_topk.py): the exchange and its state."""
        if not isinstance(compression, TopK):
            return None
        if resolve_op(self.op) == Adasum:
            raise InvalidArgumentError("Compression.topk cannot be combined with op=Adasum")
        if check_optimizer_momentum(compression, "DistributedOptimizer"):
            self._so_check_sgd()
        return _TopKState(TopKExchange(compression, self._so_op, self._so_prescale,
                                       self._so_postscale, self._so_ps))

    def _so_check_sgd(self) -> None:
        """Momentum correction moves SGD's momentum (and weight decay) into the compression;
        the wrapped SGD then steps without them (_so_momentum_moved)."""
        if not isinstance(self, torch.optim.SGD):
            raise InvalidArgumentError(
                "Compression.topk(momentum_correction=True) moves the optimizer's momentum into "
                "the compression (Deep Gradient Compression): it needs torch.optim.SGD with "
                f"momentum > 0, not {type(self).__name__}")
        for group in self.param_groups:
            if not group["momentum"] > 0 or group["dampening"] != 0:
                raise InvalidArgumentError(
                    "Compression.topk(momentum_correction=True) needs SGD with momentum > 0 and "
                    f"dampening 0 in every parameter group; got momentum={group['momentum']}, "
                    f"dampening={group['dampening']}")

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
                        isinstance(p, torch.Tensor) for p in g):
                    raise InvalidArgumentError("groups must be a list of lists of parameters "
                                               "(or an int: the number of groups)")
                members.append([p for p in g if p.requires_grad])
        elif num_groups:
            if not isinstance(num_groups, int) or num_groups < 0:
                raise InvalidArgumentError(f"num_groups must be an int >= 0, not {num_groups!r}")
            n = min(num_groups, len(params))
            bounds = [len(params) * i // n for i in range(n + 1)] if n else []
            members = [params[bounds[i]:bounds[i + 1]] for i in range(n)]
        else:
            return
        known = set(params)
        for index, g in enumerate(members):
            for p in g:
                if p not in known:
                    raise InvalidArgumentError("groups names a parameter the optimizer does not "
                                               "update")
                if p in self._so_group_of:
                    raise InvalidArgumentError(f"parameter '{self._so_names[p]}' is in more "
                                               "than one of groups")
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
                "named_parameters() of the model whose parameters the optimizer holds")
        me = weakref.ref(self)
        for p in params:
            if p.requires_grad and self._so_included:
                self._so_passes_left[p] = self._so_passes
                self._so_hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param, me=me: _grad_ready(me, param)))

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_so_names"):  # not during the wrapped class's own __init__
            self._so_register(len(self.param_groups) - 1, self.param_groups[-1]["params"])

    def set_backward_passes_per_step(self, passes: int) -> None:
        """How many backward passes accumulate locally before the gradients are reduced."""
        if not isinstance(passes, int) or passes < 1:
            raise InvalidArgumentError(f"backward_passes_per_step must be an int >= 1, "
                                       f"not {passes!r}")
        if self._so_handles:
            raise ScaleoutError("set_backward_passes_per_step() while gradient reductions are "
                                "pending; call it after step()")
        self._so_passes = passes
        self.backward_passes_per_step = passes
        self._so_reset_counts()

    # ---- backward and step ----

    def _so_on_grad(self, p: torch.Tensor) -> None:
        if p not in self._so_passes_left:
            return
        if p in self._so_handles:
            raise ScaleoutError(
                f"the gradient of '{self._so_names[p]}' was computed more than "
                f"backward_passes_per_step={self._so_passes} times before step() or "
                "synchronize(); raise backward_passes_per_step to accumulate more passes "
                "locally")
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
        if self._so_adasum:
            return self._so_start_delta(p)
        if p.grad is None:
            # Not used on this rank this step: contribute zeros so other ranks don't wait.
            p.grad = torch.zeros_like(p)
        elif p.grad.layout != torch.strided and self._so_topk is not None:
            p.grad = p.grad.to_dense()  # top-k is its own sparsification
        elif p.grad.layout != torch.strided:
            if not self._so_sparse_as_dense:
                # Horovod's default: indices and values allgathered (no compression).
                self._so_handles[p] = (sparse_allreduce_async(
                    p.grad, parameter_gradient(self._so_names[p]), self._so_op,
                    self.process_set), _SPARSE)
                return
            p.grad = p.grad.to_dense()
        if self._so_topk is not None:
            self._so_handles[p] = (self._so_start_topk(p), None)
            return
        wire, ctx = self._so_compression.compress(p.grad)
        handle = _allreduce_async(wire, parameter_gradient(self._so_names[p]), self._so_op,
                                  self._so_prescale, self._so_postscale, True, self._so_ps)
        self._so_handles[p] = (handle, ctx)

    def _so_start_topk(self, p: torch.Tensor):
        """Note [Top-k sparsification]: p's gradient plus its residual, sparsified and sent.
        The result is written into p.grad at synchronize()."""
        state, name = self._so_topk, self._so_names[p]
        grad = p.grad.detach()
        slots = state.slots.get(name)
        if slots is None:
            # 16-bit gradients accumulate in float32 (small entries must still add up).
            dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
            slots = state.slots[name] = {"residual": torch.zeros(p.numel(), dtype=dtype)}
            if state.momentum:
                slots["velocity"] = torch.zeros(p.numel(), dtype=dtype)
        residual = slots["residual"]
        momentum = None
        flat = grad.reshape(-1)
        if flat.dtype != residual.dtype:
            flat = flat.to(residual.dtype)
        if state.momentum:
            group = self.param_groups[self._so_group_index[p]]
            momentum = Momentum(group["momentum"], group["nesterov"])
            if group["weight_decay"]:  # folded into the gradient before the momentum, as SGD
                flat = flat + group["weight_decay"] * p.detach().reshape(-1).to(flat.dtype)
        out = grad.view(-1) if grad.dtype == residual.dtype and grad.is_contiguous() else \
            torch.empty(p.numel(), dtype=residual.dtype)
        pending = state.exchange.start(
            parameter_gradient(name), flat.numpy(), residual.numpy(), state.steps,
            slots["velocity"].numpy() if state.momentum else None, momentum, out.numpy())
        return pending, out

    def _so_finish_topk(self, pending: dict) -> None:
        state = self._so_topk
        try:
            state.exchange.finish_all([(started, out.numpy())
                                       for (started, out), _ in pending.values()])
        finally:
            state.steps += 1
        for p, ((_, out), _) in pending.items():
            if out.data_ptr() != p.grad.data_ptr():
                p.grad.detach().copy_(out.view_as(p.grad))
            increment_version(p.grad)

    @contextlib.contextmanager
    def _so_momentum_moved(self) -> Iterator[None]:
        """With momentum correction the compression applied the momentum and weight decay:
        the wrapped SGD steps without them."""
        if self._so_topk is None or not self._so_topk.momentum:
            yield
            return
        saved = [(g["momentum"], g["weight_decay"]) for g in self.param_groups]
        for g in self.param_groups:
            g["momentum"], g["weight_decay"] = 0.0, 0.0
        try:
            yield
        finally:
            for g, (m, wd) in zip(self.param_groups, saved):
                g["momentum"], g["weight_decay"] = m, wd

    def state_dict(self):
        """The wrapped optimizer's state_dict; with Compression.topk also the residuals (and
        velocities) by parameter name and the step count, under 'scaleout_topk'."""
        out = super().state_dict()
        if self._so_topk is not None:
            out["scaleout_topk"] = {"steps": self._so_topk.steps,
                                    "slots": {name: dict(slots) for name, slots
                                              in self._so_topk.slots.items()}}
        return out

    def load_state_dict(self, state_dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("scaleout_topk", None)
        super().load_state_dict(state_dict)
        if self._so_topk is not None and saved is not None:
            self._so_topk.steps = int(saved["steps"])
            self._so_topk.slots = {
                name: {key: t.detach().to("cpu", copy=True).reshape(-1)
                       for key, t in slots.items()}
                for name, slots in saved["slots"].items()}

    def _so_start_delta(self, p: torch.Tensor) -> None:
        """Note [Adasum optimizer]: the wrapped optimizer's step for p alone, then the Adasum
        allreduce of p's change, in place in p (the start is kept to add the result to)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.layout != torch.strided:
            if not self._so_sparse_as_dense:
                raise InvalidArgumentError(f"op=Adasum steps with dense gradients only; "
                                           f"'{self._so_names[p]}' has a sparse one (pass "
                                           "sparse_as_dense=True)")
            p.grad = p.grad.to_dense()
        start = self._so_starts.get(p)
        if start is None:
            start = self._so_starts[p] = torch.empty_like(p, memory_format=torch.contiguous_format)
        with torch.no_grad():
            start.copy_(p)
            groups = [group["params"] for group in self.param_groups]
            try:
                for group, params in zip(self.param_groups, groups):
                    group["params"] = [p] if any(q is p for q in params) else []
                super().step()
            finally:
                for group, params in zip(self.param_groups, groups):
                    group["params"] = params
            p.sub_(start)
        wire, ctx = self._so_compression.compress(p.data)
        handle = _allreduce_async(wire, f"delta.{self._so_names[p]}", Adasum, 1.0, 1.0, True,
                                  self._so_ps)
        self._so_handles[p] = (handle, ctx)

    def _so_step_deltas(self) -> None:
        """Note [Adasum optimizer]: every parameter's combined change added to its start."""
        for p in self._so_passes_left:
            if p not in self._so_handles:
                self._so_start_delta(p)
        pending, self._so_handles = self._so_handles, {}
        try:
            wait_all([handle for handle, ctx in pending.values()])
        finally:
            self._so_reset_counts()
        with torch.no_grad():
            for p, (handle, ctx) in pending.items():
                start = self._so_starts[p]
                start.add_(self._so_compression.decompress(synchronize(handle), ctx))
                p.copy_(start)

    def synchronize(self) -> None:
        """Waits for every gradient's reduction (starting those backward did not produce) and
        leaves the reduced gradients in p.grad. Follow with `with
        optimizer.skip_synchronize(): optimizer.step()` to modify gradients in between.
        With op=Adasum it does nothing (as Horovod's): step() does the work."""
        if self._so_adasum:
            return
        for p in self._so_passes_left:
            if p not in self._so_handles:
                self._so_start(p)
        pending, self._so_handles = self._so_handles, {}
        if self._so_topk is not None:
            try:
                self._so_finish_topk(pending)
            finally:
                self._so_reset_counts()
            self._so_synchronized = True
            return
        try:  # waits for all, even after a failure, so no buffer is left in use
            wait_all([handle for handle, ctx in pending.values() if ctx is not _SPARSE])
            for p, (handle, ctx) in pending.items():
                if ctx is _SPARSE:
                    p.grad = handle()
        finally:
            self._so_reset_counts()
        for p, (handle, ctx) in pending.items():
            if ctx is not None and ctx is not _SPARSE:
                p.grad.copy_(self._so_compression.decompress(synchronize(handle), ctx))
        self._so_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """step() inside this block does not reduce: use after an explicit synchronize()."""
        if self._so_adasum:
            raise AssertionError("skip_synchronize() cannot be used with op=Adasum (as in "
                                 "Horovod): step() steps locally and combines the changes")
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
        if self._so_adasum:
            self._so_step_deltas()
            return loss
        if self._so_skip:
            if self._so_handles:
                raise ScaleoutError("step() inside skip_synchronize() while gradient reductions "
                                    "are pending: call optimizer.synchronize() first")
        else:
            if self._so_synchronized:
                # Horovod's behaviour, kept for compatibility: warn, then reduce again (a
                # second Average leaves averaged gradients as they are; a second Sum does not).
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are reduced "
                              "a second time, which slows training. Wrap step() in `with "
                              "optimizer.skip_synchronize():` after an explicit synchronize().",
                              stacklevel=2)
            self.synchronize()
        self._so_synchronized = False
        with self._so_momentum_moved():
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
                "Call step() or synchronize() first.")
        self._so_reset_counts()
        super().zero_grad(set_to_none=set_to_none)

    def __del__(self):
        for hook in getattr(self, "_so_hooks", ()):
            hook.remove()

    def _so_reset_counts(self) -> None:
        for p in self._so_passes_left:
            self._so_passes_left[p] = self._so_passes
        for ready in self._so_group_ready.values():
            ready.clear()


_SPARSE = object()  # marks a sparse gradient's pending reduction (a callable, not a Handle)


class _TopKState:
    """A DistributedOptimizer's top-k exchange, its state by parameter name (flat 'residual'
    and, with momentum correction, 'velocity' tensors) and its count of finished steps."""

    def __init__(self, exchange: TopKExchange) -> None:
        self.exchange = exchange
        # momentum correction: SGD's momentum moved into the compression
        self.momentum = exchange.config.momentum_correction is True
        self.slots: Dict[str, Dict[str, torch.Tensor]] = {}
        self.steps = 0


def _grad_ready(optimizer_ref, param: torch.Tensor) -> None:
    optimizer = optimizer_ref()
    if optimizer is not None:  # a dropped DistributedOptimizer no longer reduces
        optimizer._so_on_grad(param)


def _check_names(named_parameters) -> Dict[torch.Tensor, str]:
    pairs = list(named_parameters)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], torch.Tensor)):
            raise InvalidArgumentError(
                "named_parameters must be (name, parameter) pairs, as model.named_parameters() "
                f"gives; got {type(pair).__name__} {str(pair)[:60]}")
    counts = collections.Counter(name for name, _ in pairs)
    duplicates = sorted(name for name, n in counts.items() if n > 1)
    if duplicates:
        raise InvalidArgumentError(f"named_parameters has duplicate names: {duplicates[:10]}")
    by_param: Dict[torch.Tensor, str] = {}
    for name, p in pairs:
        by_param.setdefault(p, name)
    return by_param


_classes: Dict[type, type] = {}


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set) -> torch.optim.Optimizer:
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

    Horovod's attributes `op`, `process_set`, `backward_passes_per_step` and
    `_parameter_names` are there. As in Horovod, step() after an explicit synchronize() outside
    `skip_synchronize()` warns and reduces the gradients again.

    A parameter that got no gradient on this rank is reduced as zeros, so no rank waits forever
    (one that got none on any rank is left with a zero gradient, as in Horovod). Create LR
    schedulers on the returned optimizer; the parameters' hooks go when it is deleted.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError(f"DistributedOptimizer wraps a torch.optim.Optimizer, not "
                                   f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin):
        raise InvalidArgumentError("this optimizer is already a DistributedOptimizer")
    base = type(optimizer)
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_DistributedMixin, base),
                                    {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    # Share groups, state and hooks. An LR scheduler made on the original optimizer left a
    # `step` wrapper on the instance that would bypass the reduction: leave it behind.
    state = dict(optimizer.__dict__)
    if "step" in state:
        warnings.warn("an LR scheduler was created on the optimizer before wrapping it; create "
                      "schedulers on the DistributedOptimizer instead", stacklevel=2)
        del state["step"]
    wrapped.__dict__.update(state)
    wrapped._so_setup(named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, sparse_as_dense, num_groups, groups, process_set)
    return wrapped
