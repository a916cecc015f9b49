"""Top-k sparsification with error feedback (Compression.topk), written once for every front end.

Note [Top-k sparsification]
Each rank adds its gradient to a residual (what it has not sent yet), selects the k entries of
largest magnitude (k = ceil(density * n), at least 1), sends their (index, value) pairs and keeps
the rest as the next step's residual: nothing is dropped, only delayed (error feedback). The
ranks allgather the pairs and add every rank's contribution into a dense gradient, scaled as the
reduce op says (Average: divided by the set's size). One allgather per gradient, of a byte
array holding the indices (int32, or int64 past 2**31 entries) and then the values, so the core
fuses them as it fuses any allgathers.

With momentum correction (Deep Gradient Compression), the momentum moves from the optimizer into
the compression, per rank: u = m*u + g and the residual v += u (Nesterov: u = m*u + g,
v += g + m*u); the top k of v are sent, and both v and u are cleared where they were sent
(momentum factor masking), so stale momentum does not push a coordinate again. The optimizer
then steps without momentum: it applies the summed velocities, which is momentum SGD when
nothing is held back.

For the first `warmup_steps` steps the exchange is a dense allreduce of what would have been
sparsified (residual + gradient, or residual + velocity without masking), so early training,
where gradients change fastest, is exactly dense (momentum) SGD.

Selection (`select_topk`) does not sort: it estimates the threshold from a random sample of the
magnitudes, keeps the entries at or above it in one pass, and partitions only those (about 1.5k)
to take exactly the top k; a sample that overshoots falls back to a full partition. Small
tensors are partitioned directly.

Who owns the state: a `TopK` object (what Compression.topk returns) holds its settings only.
The residuals and momenta are arrays the caller owns and passes in (torch keeps them in the
DistributedOptimizer's state_dict; TensorFlow in variables), and the step count comes from the
caller too; `TopKExchange` is the arithmetic and the communication.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import numpy as np

from scaleout._core import ALLGATHER, Average, Sum, synchronize
from scaleout._errors import InvalidArgumentError
from scaleout._ops import _allreduce_async, _submit_owned
from scaleout._process_sets import set_size

__all__ = ["TopK", "TopKExchange", "Momentum", "select_topk", "topk_count", "residual_dtype",
           "given_momentum", "check_optimizer_momentum"]

# Below this many entries a full partition is as fast as sampling.
_DIRECT = 32768
_SAMPLE = 4096


def topk_count(n: int, density: float) -> int:
    """How many entries of an n-entry gradient are sent."""
    return min(n, max(1, math.ceil(density * n)))


def select_topk(x: np.ndarray, k: int, seed: int = 0,
                scratch: Optional[np.ndarray] = None) -> np.ndarray:
    """Indices of the k entries of the flat array x with the largest magnitude (in no particular
    order; ties broken arbitrarily). `scratch`: a float array of x's size to hold |x|."""
    n = x.size
    if k >= n:
        return np.arange(n)
    magnitudes = np.abs(x, out=scratch) if scratch is not None else np.abs(x)
    if n <= _DIRECT:
        return np.argpartition(magnitudes, n - k)[n - k:]
    rng = np.random.default_rng(seed)
    sample = magnitudes[rng.integers(0, n, _SAMPLE)]
    # Aim at about 1.5k candidates (a few samples more for very small k).
    keep = min(_SAMPLE, int(math.ceil(_SAMPLE * k / n * 1.5)) + 4)
    threshold = np.partition(sample, _SAMPLE - keep)[_SAMPLE - keep]
    candidates = np.flatnonzero(magnitudes >= threshold)
    if candidates.size < k:  # the sample overestimated the threshold: rare
        return np.argpartition(magnitudes, n - k)[n - k:]
    if candidates.size > k:
        top = np.argpartition(magnitudes[candidates], candidates.size - k)[candidates.size - k:]
        candidates = candidates[top]
    return candidates


def residual_dtype(dtype: Any) -> np.dtype:
    """Residuals and velocities of 16-bit gradients are kept in float32 (so that small entries
    still accumulate); others in the gradient's dtype."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


class TopK:
    """Compression.topk(density=0.01, momentum_correction=False, warmup_steps=0): send the
    `density` fraction of each gradient's entries with the largest magnitude, as (index, value)
    pairs, and keep the rest in a residual added to the next step's gradient (Note [Top-k
    sparsification] in scaleout/_topk.py).

    - momentum_correction: Deep Gradient Compression's momentum correction and factor masking.
      With a DistributedOptimizer pass True: the momentum is taken from the wrapped SGD
      optimizer, which then steps without momentum. With DistributedGradientTape (no optimizer
      to take it from) pass the momentum itself (e.g. 0.9) and apply the gradients with an
      optimizer without momentum.
    - warmup_steps: the first steps are reduced densely.

    Only for DistributedOptimizer and DistributedGradientTape, which keep the residuals (a
    single allreduce has nowhere to keep them). Create it once: with DistributedGradientTape,
    which is made anew at every step, the residuals live in this object.
    """

    def __init__(self, density: float = 0.01, momentum_correction: Union[bool, float] = False,
                 warmup_steps: int = 0, nesterov: bool = False) -> None:
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not (
                0.0 < density <= 1.0):
            raise InvalidArgumentError(f"Compression.topk: density must be in (0, 1], not "
                                       f"{density!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise InvalidArgumentError(f"Compression.topk: warmup_steps must be an int >= 0, not "
                                       f"{warmup_steps!r}")
        if not isinstance(momentum_correction, bool) and not (
                isinstance(momentum_correction, (int, float)) and 0.0 < momentum_correction < 1.0):
            raise InvalidArgumentError(
                "Compression.topk: momentum_correction is True (take the momentum from the "
                f"wrapped optimizer), False, or a momentum in (0, 1); not {momentum_correction!r}")
        self.density = float(density)
        self.momentum_correction = momentum_correction
        self.warmup_steps = warmup_steps
        self.nesterov = bool(nesterov)
        # TensorFlow keeps a DistributedGradientTape's state here (the tape is made per step).
        self.tf_state: Any = None

    def __repr__(self) -> str:
        return (f"Compression.topk(density={self.density}, momentum_correction="
                f"{self.momentum_correction}, warmup_steps={self.warmup_steps})")

    # A plain collective's `compression=` has no residual to keep.
    def compress(self, tensor):
        raise InvalidArgumentError(
            "Compression.topk keeps a residual per gradient between steps: use it with "
            "DistributedOptimizer or DistributedGradientTape, not with a single collective")

    def decompress(self, tensor, ctx):
        self.compress(tensor)


@dataclass(frozen=True)
class Momentum:
    """Momentum correction's factor (and Nesterov's variant), from the optimizer or the user."""
    momentum: float
    nesterov: bool = False


def given_momentum(config: TopK, what: str) -> Optional[Momentum]:
    """The momentum of a `what` without an optimizer to take it from (a gradient tape): None
    without momentum correction; the number given, else an error."""
    if config.momentum_correction is False:
        return None
    if config.momentum_correction is True:
        raise InvalidArgumentError(
            f"Compression.topk(momentum_correction=True) with {what}: there is no optimizer to "
            "take the momentum from; pass the momentum itself, e.g. momentum_correction=0.9, and "
            "apply the gradients without momentum")
    return Momentum(float(config.momentum_correction), config.nesterov)


def check_optimizer_momentum(config: TopK, what: str) -> bool:
    """Whether an optimizer's momentum moves into the compression (momentum_correction=True);
    raises for a number (the optimizer's own momentum is the one used)."""
    if config.momentum_correction is not True and config.momentum_correction is not False:
        raise InvalidArgumentError(
            f"Compression.topk(momentum_correction={config.momentum_correction}) with {what}: "
            "the momentum is the wrapped optimizer's own; pass momentum_correction=True")
    return config.momentum_correction is True


class _Pending:
    __slots__ = ("handle", "sparse", "k", "index_dtype", "value_dtype", "scale")

    def __init__(self, handle, sparse, k=0, index_dtype=None, value_dtype=None, scale=1.0):
        self.handle, self.sparse, self.k = handle, sparse, k
        self.index_dtype, self.value_dtype, self.scale = index_dtype, value_dtype, scale


class TopKExchange:
    """The exchange of one optimizer's (or tape's) gradients over the set `ps` (the core's id):
    start() per gradient, then finish() per gradient in any order."""

    def __init__(self, config: TopK, op: int, prescale: float, postscale: float,
                 ps: int = 0) -> None:
        if op not in (Average, Sum):
            raise InvalidArgumentError("Compression.topk reduces gradients with op=Average or "
                                       "op=Sum")
        self.config = config
        self.ps = ps
        self.size = set_size(ps)
        self.dense_op, self.prescale, self.postscale = op, prescale, postscale
        self.scale = prescale * postscale / (self.size if op == Average else 1)

    def start(self, name: str, grad: np.ndarray, residual: np.ndarray, step: int,
              velocity: Optional[np.ndarray] = None, momentum: Optional[Momentum] = None,
              out: Optional[np.ndarray] = None) -> _Pending:
        """Starts the exchange of this rank's flat gradient `grad` (read only). `residual` (and
        `velocity` with momentum correction) are this gradient's flat state arrays, updated here;
        `step` counts the finished exchanges (the first warmup_steps are dense). `out` (flat,
        grad's size) receives the result at finish(); in the dense case the allreduce writes
        into it."""
        acc = residual
        if momentum is not None:
            velocity *= momentum.momentum
            velocity += grad
            if momentum.nesterov:
                acc += grad
                acc += momentum.momentum * velocity
            else:
                acc += velocity
        else:
            acc += grad
        if step < self.config.warmup_steps:
            out[...] = acc
            acc[...] = 0  # velocity keeps its value: dense momentum SGD
            return _Pending(_allreduce_async(out, f"{name}.dense", self.dense_op, self.prescale,
                                             self.postscale, True, self.ps), sparse=False)
        k = topk_count(acc.size, self.config.density)
        chosen = select_topk(acc, k, seed=zlib.crc32(name.encode()) ^ step)
        index_dtype = np.dtype(np.int32 if acc.size < 2 ** 31 else np.int64)
        payload = np.empty(k * (index_dtype.itemsize + acc.itemsize), np.uint8)
        split = k * index_dtype.itemsize
        payload[:split].view(index_dtype)[...] = chosen
        payload[split:].view(acc.dtype)[...] = acc[chosen]
        acc[chosen] = 0
        if velocity is not None and momentum is not None:
            velocity[chosen] = 0
        handle = _submit_owned(ALLGATHER, f"{name}.topk", payload, ps=self.ps)
        return _Pending(handle, True, k, index_dtype, acc.dtype, self.scale)

    def finish(self, pending: _Pending, out: np.ndarray) -> np.ndarray:
        """Waits for one exchange and writes the dense reduced gradient into the flat `out`."""
        result = synchronize(pending.handle)
        if not pending.sparse:
            return out
        blocks = np.asarray(result).reshape(self.size, -1)
        split = pending.k * pending.index_dtype.itemsize
        total = out if out.dtype == pending.value_dtype else np.zeros(out.size,
                                                                      pending.value_dtype)
        total[...] = 0
        for block in blocks:  # each rank's indices are distinct, so += adds every pair
            total[block[:split].view(pending.index_dtype)] += block[split:].view(
                pending.value_dtype)
        if pending.scale != 1.0:
            total *= pending.scale
        if total is not out:
            out[...] = total
        return out

