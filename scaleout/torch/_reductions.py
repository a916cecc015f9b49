"""How a DistributedOptimizer combines the ranks' gradients: one class per strategy, behind one
interface (Reduction), chosen once when the optimizer is built (reduction_for).

The optimizer decides when a parameter's reduction starts (once backward has produced its
gradient backward_passes_per_step times, or with the rest of its fusion group) and keeps
Horovod's synchronize() / skip_synchronize() protocol. A strategy decides what starting one
means, how the started ones finish, what the wrapped optimizer's step runs under, and what it
adds to state_dict():

- Allreduce: each gradient reduced in place in p.grad (cast for the wire by the compression); a
  sparse gradient's indices and values allgathered, unless sparse_as_dense.
- TopKReduction: Note [Top-k sparsification] (scaleout/_topk.py).
- AdasumDeltas: Note [Adasum optimizer].
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, NamedTuple, Optional

import torch
from torch.autograd.graph import increment_version

from scaleout._errors import InvalidArgumentError
from scaleout._gradient_rules import check_adasum_compression
from scaleout._naming import parameter_delta, parameter_gradient, torch_name
from scaleout._native import Adasum, Handle, resolve_op, synchronize, wait_all
from scaleout._process_sets import set_size
from scaleout._topk import Momentum, TopK, TopKExchange, check_optimizer_momentum
from scaleout.torch._collectives import sparse_allreduce_async
from scaleout.torch._tensors import start_allreduce

__all__ = ["Reduction", "Allreduce", "TopKReduction", "AdasumDeltas", "reduction_for", "STATE_KEY"]

# Where state_dict() keeps a strategy's own state (top-k's residuals); saved optimizer files
# have it under this key.
STATE_KEY = "scaleout_topk"


class Reduction:
    """The interface the optimizer calls. `opt` is the DistributedOptimizer (passed in, never
    kept: a dropped optimizer must stay collectable, its hooks go with it)."""

    # True when the ranks combine the parameters' updates rather than their gradients: start()
    # steps the wrapped optimizer itself, so step() only finishes the reductions and
    # synchronize() has no reduced gradients to leave in p.grad.
    combines_updates = False

    def start(self, opt, p: torch.Tensor, name: str, priority: int = 0):
        """Starts the reduction of p's gradient (backward has produced it, or step() found it
        missing: then p.grad is None); returns what finish() takes for p. `priority`: Note
        [Priority] in the core."""
        raise NotImplementedError

    def finish(self, opt, pending: Dict[torch.Tensor, object]) -> None:
        """Waits for every started reduction (all of them, even after a failure, so that the
        core no longer writes into any tensor) and leaves each result in place."""
        raise NotImplementedError

    def stepping(self, opt) -> contextlib.AbstractContextManager:
        """What the wrapped optimizer's step runs under."""
        return contextlib.nullcontext()

    def state(self) -> Optional[dict]:
        """What state_dict() saves under STATE_KEY (None: nothing)."""
        return None

    def load_state(self, saved: Optional[dict]) -> None:
        """Restores what state() saved (None: the file has none)."""


class _InPlace(NamedTuple):
    """A dense tensor being reduced in its own memory: the gradient itself, or with
    sparse_as_dense a densified copy of a sparse gradient, whose result goes back into the
    sparse gradient as Horovod's does (`grad.zero_().add_(result.to_sparse())`: every dimension
    sparse, exact zeros dropped), so that optimizers that take sparse gradients only
    (torch.optim.SparseAdam) keep working. `ctx` is the compression's, to cast the result back
    (None: nothing to cast)."""

    handle: Handle
    ctx: object
    dense: torch.Tensor


class _Gathered(NamedTuple):
    """A sparse gradient's indices and values being allgathered; wait() returns the result."""

    wait: Callable[[], torch.Tensor]


class _TopKStarted(NamedTuple):
    """A top-k exchange under way, and the flat tensor its result is written into."""

    started: object
    out: torch.Tensor


class Allreduce(Reduction):
    def __init__(
        self,
        compression,
        op: int,
        prescale: float,
        postscale: float,
        ps: int,
        process_set,
        sparse_as_dense: bool,
    ) -> None:
        self.compression = compression
        self.op, self.prescale, self.postscale = op, prescale, postscale
        self.ps = ps
        self.process_set = process_set
        self.sparse_as_dense = sparse_as_dense

    def start(self, opt, p, name, priority=0):
        dense = p.grad
        if dense is None:
            # Not used on this rank this step: contribute zeros so other ranks don't wait.
            p.grad = dense = torch.zeros_like(p)
        elif dense.layout != torch.strided:
            if not self.sparse_as_dense:
                # Horovod's default: indices and values allgathered (no compression).
                return _Gathered(
                    sparse_allreduce_async(
                        p.grad, parameter_gradient(name), self.op, self.process_set
                    )
                )
            dense = dense.to_dense()
            if p.grad.layout != torch.sparse_coo:  # (CSR and the like stay dense)
                p.grad = dense
        wire, ctx = self.compression.compress(dense)
        return _InPlace(
            start_allreduce(
                wire,
                parameter_gradient(name),
                self.op,
                self.prescale,
                self.postscale,
                True,
                self.ps,
                priority=priority,
            ),
            ctx,
            dense,
        )

    def finish(self, opt, pending):
        in_place = {p: q for p, q in pending.items() if isinstance(q, _InPlace)}
        wait_all([q.handle for q in in_place.values()])
        for p, q in pending.items():
            if isinstance(q, _Gathered):
                p.grad = q.wait()
        for p, q in in_place.items():
            if q.ctx is not None:
                q.dense.copy_(self.compression.decompress(synchronize(q.handle), q.ctx))
            if q.dense is not p.grad:  # a sparse gradient reduced densified (sparse_as_dense)
                p.grad.zero_().add_(q.dense.to_sparse())


class TopKReduction(Reduction):
    """Note [Top-k sparsification] (scaleout/_topk.py): the exchange, its state by parameter
    name (flat 'residual' and, with momentum correction, 'velocity' tensors) and its count of
    finished steps."""

    def __init__(
        self, opt, config: TopK, op: int, prescale: float, postscale: float, ps: int
    ) -> None:
        if check_optimizer_momentum(config, "DistributedOptimizer"):
            _check_sgd(opt)
        self.exchange = TopKExchange(config, op, prescale, postscale, ps)
        # momentum correction: SGD's momentum moved into the compression
        self.momentum = self.exchange.config.momentum_correction is True
        self.slots: Dict[str, Dict[str, torch.Tensor]] = {}
        self.steps = 0

    def start(self, opt, p, name, priority=0):
        """p's gradient plus its residual, sparsified and sent. The result is written into
        p.grad by finish()."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.layout != torch.strided:
            p.grad = p.grad.to_dense()  # top-k is its own sparsification
        grad = p.grad.detach()
        slots = self.slots.get(name)
        if slots is None:
            # 16-bit gradients accumulate in float32 (small entries must still add up).
            dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
            slots = self.slots[name] = {"residual": torch.zeros(p.numel(), dtype=dtype)}
            if self.momentum:
                slots["velocity"] = torch.zeros(p.numel(), dtype=dtype)
        residual = slots["residual"]
        momentum = None
        flat = grad.reshape(-1)
        if flat.dtype != residual.dtype:
            flat = flat.to(residual.dtype)
        if self.momentum:
            group = opt.param_groups[opt._so_group_index[p]]
            momentum = Momentum(group["momentum"], group["nesterov"])
            if group["weight_decay"]:  # folded into the gradient before the momentum, as SGD
                flat = flat + group["weight_decay"] * p.detach().reshape(-1).to(flat.dtype)
        out = (
            grad.view(-1)
            if grad.dtype == residual.dtype and grad.is_contiguous()
            else torch.empty(p.numel(), dtype=residual.dtype)
        )
        started = self.exchange.start(
            # the numpy-level exchange adds no prefix: the name torch's allreduce would run as
            torch_name("allreduce", parameter_gradient(name)),
            flat.numpy(),
            residual.numpy(),
            self.steps,
            slots["velocity"].numpy() if self.momentum else None,
            momentum,
            out.numpy(),
        )
        return _TopKStarted(started, out)

    def finish(self, opt, pending):
        try:
            self.exchange.finish_all([(q.started, q.out.numpy()) for q in pending.values()])
        finally:
            self.steps += 1
        for p, q in pending.items():
            if q.out.data_ptr() != p.grad.data_ptr():
                p.grad.detach().copy_(q.out.view_as(p.grad))
            increment_version(p.grad)

    @contextlib.contextmanager
    def stepping(self, opt) -> Iterator[None]:
        """With momentum correction the compression applied the momentum and weight decay:
        the wrapped SGD steps without them."""
        if not self.momentum:
            yield
            return
        saved = [(g["momentum"], g["weight_decay"]) for g in opt.param_groups]
        for g in opt.param_groups:
            g["momentum"], g["weight_decay"] = 0.0, 0.0
        try:
            yield
        finally:
            for g, (m, wd) in zip(opt.param_groups, saved):
                g["momentum"], g["weight_decay"] = m, wd

    def state(self):
        """The residuals (and velocities) by parameter name and the step count."""
        return {
            "steps": self.steps,
            "slots": {name: dict(slots) for name, slots in self.slots.items()},
        }

    def load_state(self, saved):
        if saved is None:
            return
        self.steps = int(saved["steps"])
        self.slots = {
            name: {key: t.detach().to("cpu", copy=True).reshape(-1) for key, t in slots.items()}
            for name, slots in saved["slots"].items()
        }


def _check_sgd(opt) -> None:
    """Momentum correction moves SGD's momentum (and weight decay) into the compression; the
    wrapped SGD then steps without them (TopKReduction.stepping)."""
    if not isinstance(opt, torch.optim.SGD):
        raise InvalidArgumentError(
            "Compression.topk(momentum_correction=True) moves the optimizer's momentum into "
            "the compression (Deep Gradient Compression): it needs torch.optim.SGD with "
            f"momentum > 0, not {type(opt).__name__}"
        )
    for group in opt.param_groups:
        if not group["momentum"] > 0 or group["dampening"] != 0:
            raise InvalidArgumentError(
                "Compression.topk(momentum_correction=True) needs SGD with momentum > 0 and "
                f"dampening 0 in every parameter group; got momentum={group['momentum']}, "
                f"dampening={group['dampening']}"
            )


class AdasumDeltas(Reduction):
    """Note [Adasum optimizer]
    With op=Adasum, as Horovod's optimizer for it: when backward has produced a parameter's
    gradient (backward_passes_per_step times), the hook keeps the parameter's value, runs the
    wrapped optimizer's step for that parameter alone, and starts an in-place Adasum allreduce
    of the change (the parameter minus the kept value). step() starts those backward did not
    reach, waits, and sets each parameter to its kept value plus the combined change; the
    wrapped optimizer is not stepped again. synchronize() does nothing; skip_synchronize()
    raises. Adasum adapts to how aligned the ranks' updates are, so the learning rate is not
    scaled with the number of ranks."""

    combines_updates = True

    def __init__(self, compression, ps: int, sparse_as_dense: bool) -> None:
        self.compression = compression
        self.ps = ps
        self.sparse_as_dense = sparse_as_dense
        self.starts: Dict[torch.Tensor, torch.Tensor] = {}  # parameters before their step

    def start(self, opt, p, name, priority=0):
        """The wrapped optimizer's step for p alone, then the Adasum allreduce of p's change,
        in place in p (the start is kept to add the result to)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.layout != torch.strided:
            if not self.sparse_as_dense:
                raise InvalidArgumentError(
                    f"op=Adasum steps with dense gradients only; "
                    f"'{name}' has a sparse one (pass "
                    "sparse_as_dense=True)"
                )
            p.grad = p.grad.to_dense()
        start = self.starts.get(p)
        if start is None:
            start = self.starts[p] = torch.empty_like(p, memory_format=torch.contiguous_format)
        with torch.no_grad():
            start.copy_(p)
            groups = [group["params"] for group in opt.param_groups]
            try:
                for group, params in zip(opt.param_groups, groups):
                    group["params"] = [p] if any(q is p for q in params) else []
                opt._so_wrapped_step()
            finally:
                for group, params in zip(opt.param_groups, groups):
                    group["params"] = params
            p.sub_(start)
        wire, ctx = self.compression.compress(p.data)
        return _InPlace(
            start_allreduce(
                wire, parameter_delta(name), Adasum, 1.0, 1.0, True, self.ps, priority=priority
            ),
            ctx,
            p.data,
        )

    def finish(self, opt, pending):
        """Every parameter's combined change added to its start."""
        wait_all([q.handle for q in pending.values()])
        with torch.no_grad():
            for p, q in pending.items():
                start = self.starts[p]
                start.add_(self.compression.decompress(synchronize(q.handle), q.ctx))
                p.copy_(start)


def reduction_for(
    opt,
    op: int,
    compression,
    reduce_op: int,
    prescale: float,
    postscale: float,
    ps: int,
    process_set,
    sparse_as_dense: bool,
) -> Reduction:
    """The strategy for a DistributedOptimizer's arguments (checked already, but for top-k's):
    `op` as given, `reduce_op`/`prescale`/`postscale` after the predivide factor."""
    if isinstance(compression, TopK):
        check_adasum_compression(resolve_op(op), uses_topk=True)
        return TopKReduction(opt, compression, reduce_op, prescale, postscale, ps)
    # Note [Adasum optimizer]: on one rank there are no updates to combine, and the gradients
    # are reduced (a copy) as with any op.
    if resolve_op(op) == Adasum and set_size(ps) > 1:
        return AdasumDeltas(compression, ps, sparse_as_dense)
    return Allreduce(compression, reduce_op, prescale, postscale, ps, process_set, sparse_as_dense)
