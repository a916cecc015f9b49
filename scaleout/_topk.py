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

Who owns the state: a `TopK` object (what Compression.topk returns) holds its settings (and a
DistributedGradientTape's TensorFlow state, since the tape is made anew at every step). The
residuals and velocities are arrays the caller owns and passes in (torch keeps them in the
DistributedOptimizer's state_dict; TensorFlow in variables), and the step count comes from the
caller too; `TopKExchange` is the arithmetic and the communication.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from scaleout._arrays import submit_into, submit_owned
from scaleout._errors import InvalidArgumentError
from scaleout._host_sets import host_sets
from scaleout._naming import part
from scaleout._native import ALLGATHER, ALLREDUCE, Average, Sum, synchronize, wait_all
from scaleout._process_sets import set_size

__all__ = [
    "TopK",
    "TopKExchange",
    "Momentum",
    "select_topk",
    "topk_count",
    "residual_dtype",
    "given_momentum",
    "check_optimizer_momentum",
]

# Below this many entries a full partition is as fast as sampling.
_DIRECT = 32768
_SAMPLE = 4096


def topk_count(n: int, density: float) -> int:
    """How many entries of an n-entry gradient are sent."""
    return min(n, max(1, math.ceil(density * n)))


def select_topk(
    x: np.ndarray, k: int, seed: int = 0, scratch: Optional[np.ndarray] = None
) -> np.ndarray:
    """Indices of the k entries of the flat array x with the largest magnitude (in no particular
    order; ties broken arbitrarily; NaN counts as the largest). `scratch`: a float array of
    x's size to hold |x|."""
    n = x.size
    if k >= n:
        return np.arange(n)
    magnitudes = np.abs(x, out=scratch) if scratch is not None else np.abs(x)
    if n <= _DIRECT:
        return np.argpartition(magnitudes, n - k)[n - k :]
    rng = np.random.default_rng(seed)
    sample = magnitudes[rng.integers(0, n, _SAMPLE)]
    # Aim at about 1.5k candidates (a few samples more for very small k).
    keep = min(_SAMPLE, int(math.ceil(_SAMPLE * k / n * 1.5)) + 4)
    threshold = np.partition(sample, _SAMPLE - keep)[_SAMPLE - keep]
    # not (< threshold): a NaN counts as the largest magnitude (as in the partitions), so it is
    # sent and shows, rather than sitting in the residual for ever
    candidates = np.flatnonzero(~(magnitudes < threshold))
    if candidates.size < k:  # the sample overestimated the threshold: rare
        return np.argpartition(magnitudes, n - k)[n - k :]
    if candidates.size > k:
        top = np.argpartition(magnitudes[candidates], candidates.size - k)[candidates.size - k :]
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
      With torch's or Keras's DistributedOptimizer pass True: the momentum is taken from the
      wrapped SGD optimizer, which then steps without momentum. With DistributedGradientTape or
      a TF1 DistributedOptimizer (no momentum to take) pass the momentum itself (e.g. 0.9) and
      apply the gradients without momentum (nesterov=True: Nesterov's variant).
    - warmup_steps: the first steps are reduced densely.
    - hierarchical: None (default) exchanges as Note [Hierarchical top-k] says (dense inside a
      machine, sparse between machines) where the job's allreduces are hierarchical; False
      always exchanges every rank's own top k.

    Only for DistributedOptimizer and DistributedGradientTape, which keep the residuals (a
    single allreduce has nowhere to keep them). Create it once: with DistributedGradientTape,
    which is made anew at every step, the residuals live in this object.
    """

    def __init__(
        self,
        density: float = 0.01,
        momentum_correction: Union[bool, float] = False,
        warmup_steps: int = 0,
        hierarchical: Optional[bool] = None,
        nesterov: bool = False,
    ) -> None:
        if (
            isinstance(density, bool)
            or not isinstance(density, (int, float))
            or not (0.0 < density <= 1.0)
        ):
            raise InvalidArgumentError(
                f"Compression.topk: density must be in (0, 1], not {density!r}"
            )
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise InvalidArgumentError(
                f"Compression.topk: warmup_steps must be an int >= 0, not {warmup_steps!r}"
            )
        if not isinstance(momentum_correction, bool) and not (
            isinstance(momentum_correction, (int, float)) and 0.0 < momentum_correction < 1.0
        ):
            raise InvalidArgumentError(
                "Compression.topk: momentum_correction is True (take the momentum from the "
                f"wrapped optimizer), False, or a momentum in (0, 1); not {momentum_correction!r}"
            )
        if hierarchical not in (None, False):
            raise InvalidArgumentError(
                f"Compression.topk: hierarchical is None (where the "
                f"allreduces are) or False, not {hierarchical!r}"
            )
        self.density = float(density)
        self.momentum_correction = momentum_correction
        self.warmup_steps = warmup_steps
        self.hierarchical = hierarchical
        self.nesterov = bool(nesterov)
        # TensorFlow keeps a DistributedGradientTape's state here (the tape is made per step).
        self.tf_state: Any = None

    def __repr__(self) -> str:
        return (
            f"Compression.topk(density={self.density}, momentum_correction="
            f"{self.momentum_correction}, warmup_steps={self.warmup_steps}, "
            f"hierarchical={self.hierarchical})"
        )

    # A plain collective's `compression=` has no residual to keep.
    def compress(self, tensor):
        raise InvalidArgumentError(
            "Compression.topk keeps a residual per gradient between steps: use it with "
            "DistributedOptimizer or DistributedGradientTape, not with a single collective"
        )

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
            "apply the gradients without momentum"
        )
    return Momentum(float(config.momentum_correction), config.nesterov)


def check_optimizer_momentum(config: TopK, what: str) -> bool:
    """Whether an optimizer's momentum moves into the compression (momentum_correction=True);
    raises for a number (the optimizer's own momentum is the one used)."""
    if config.momentum_correction is not True and config.momentum_correction is not False:
        raise InvalidArgumentError(
            f"Compression.topk(momentum_correction={config.momentum_correction}) with {what}: "
            "the momentum is the wrapped optimizer's own; pass momentum_correction=True"
        )
    return config.momentum_correction is True


class _Pending:
    """One gradient's exchange in flight: the handle of its current stage and what the next
    stages need."""

    __slots__ = (
        "handle",
        "stage",
        "name",
        "residual",
        "velocity",
        "momentum",
        "step",
        "parts",
        "value_dtype",
    )

    def __init__(
        self,
        handle,
        stage: str,
        name: str = "",
        residual=None,
        velocity=None,
        momentum=None,
        step: int = 0,
        parts=None,
        value_dtype=None,
    ) -> None:
        self.handle, self.stage, self.name = handle, stage, name
        self.residual, self.velocity, self.momentum, self.step = residual, velocity, momentum, step
        # the pairs in each block of the gathered bytes, and the values' dtype
        self.parts, self.value_dtype = parts, value_dtype


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32 if n < 2**31 else np.int64)


def _pack(indices: np.ndarray, values: np.ndarray, index_dtype: np.dtype) -> np.ndarray:
    """(index, value) pairs as one byte array: the indices, then the values."""
    payload = np.empty(indices.size * (index_dtype.itemsize + values.itemsize), np.uint8)
    split = indices.size * index_dtype.itemsize
    payload[:split].view(index_dtype)[...] = indices
    payload[split:].view(values.dtype)[...] = values
    return payload


def _blocks(payload: np.ndarray, counts, index_dtype: np.dtype, value_dtype: np.dtype):
    """The (indices, values) of consecutive packed blocks of `counts` pairs each."""
    offset = 0
    for count in counts:
        split = offset + count * index_dtype.itemsize
        end = split + count * value_dtype.itemsize
        yield payload[offset:split].view(index_dtype), payload[split:end].view(value_dtype)
        offset = end


def _accumulate(
    acc: np.ndarray, grad: np.ndarray, velocity: Optional[np.ndarray], momentum: Optional[Momentum]
) -> None:
    """acc += grad, or with momentum correction u = m*u + g, acc += u (Nesterov: g + m*u)."""
    if momentum is None:
        acc += grad
        return
    velocity *= momentum.momentum
    velocity += grad
    if momentum.nesterov:
        acc += grad
        acc += momentum.momentum * velocity
    else:
        acc += velocity


def _take(acc: np.ndarray, velocity: Optional[np.ndarray], k: int, seed: int):
    """The top k of acc as (sorted indices, values), cleared in acc (and in the velocity:
    momentum factor masking)."""
    chosen = np.sort(select_topk(acc, k, seed=seed))
    values = acc[chosen]
    acc[chosen] = 0
    if velocity is not None:
        velocity[chosen] = 0
    return chosen, values


class TopKExchange:
    """The exchange of one optimizer's (or tape's) gradients over the set `ps` (the core's id):
    start() per gradient, then finish_all() for the started ones.

    Note [Hierarchical top-k]
    When the set is the job's and its allreduces are hierarchical (several machines with the
    same number of ranks each, SCALEOUT_HIERARCHICAL_ALLREDUCE auto or 1), bandwidth is cheap
    inside a machine and dear between machines, so: the ranks of a machine sum their gradients
    densely (an allreduce over a process set of the machine's ranks: shared memory); every rank
    of the machine adds the machine's sum to the machine's residual (the same bits on each);
    local rank j selects the top `density` of the j-th of local_size slices of it (each slice
    by the same density: top-k per slice, so the selection work is split, not repeated) and
    sends those pairs to the ranks with local rank j on the other machines (an allgather over a
    process set of those); the machine's ranks then allgather what they received (shared
    memory again), so every rank adds every machine's pairs, and clears in its copy of the
    residual (and velocity) what its machine sent, keeping the copies alike. Between machines
    each machine sends its pairs once, whatever its number of ranks; the residual is kept per
    machine, as if each machine were one worker. The two kinds of process sets are made once
    per job (every rank makes them, in the same order, when the first such exchange is made).
    """

    def __init__(
        self, config: TopK, op: int, prescale: float, postscale: float, ps: int = 0
    ) -> None:
        if op not in (Average, Sum):
            raise InvalidArgumentError(
                "Compression.topk reduces gradients with op=Average or op=Sum"
            )
        self.config = config
        self.ps = ps
        self.size = set_size(ps)
        self.dense_op, self.prescale, self.postscale = op, prescale, postscale
        self.scale = prescale * postscale / (self.size if op == Average else 1)
        self.hosts = host_sets() if ps == 0 and config.hierarchical is None else None

    @property
    def hierarchical(self) -> bool:
        return self.hosts is not None

    def start(
        self,
        name: str,
        grad: np.ndarray,
        residual: np.ndarray,
        step: int,
        velocity: Optional[np.ndarray] = None,
        momentum: Optional[Momentum] = None,
        out: Optional[np.ndarray] = None,
    ) -> _Pending:
        """Starts the exchange of this rank's flat gradient `grad` (read only). `residual` (and
        `velocity` with momentum correction) are this gradient's flat state arrays, updated
        (hierarchically: at finish_all); `step` counts the finished exchanges (the first
        warmup_steps are dense). `out` (flat, grad's size) receives the result at finish_all();
        in the dense case the allreduce writes into it."""
        velocity = velocity if momentum is not None else None
        if step < self.config.warmup_steps:
            if self.hierarchical:  # the machine sum's state, kept alike on its ranks
                out[...] = grad
                handle = submit_into(
                    ALLREDUCE, part(name, "host"), out, inplace=True, process_set=self.hosts.local
                )
                return _Pending(handle, "host dense", name, residual, velocity, momentum, step)
            _accumulate(residual, grad, velocity, momentum)
            out[...] = residual
            residual[...] = 0  # the velocity keeps its value: dense momentum SGD
            return _Pending(
                submit_into(
                    ALLREDUCE,
                    part(name, "dense"),
                    out,
                    inplace=True,
                    op=self.dense_op,
                    prescale_factor=self.prescale,
                    postscale_factor=self.postscale,
                    process_set=self.ps,
                ),
                "done",
            )
        if self.hierarchical:
            summed = np.array(grad, residual.dtype)
            handle = submit_into(
                ALLREDUCE, part(name, "host"), summed, inplace=True, process_set=self.hosts.local
            )
            return _Pending(
                handle, "host", name, residual, velocity, momentum, step, value_dtype=residual.dtype
            )
        k = topk_count(residual.size, self.config.density)
        _accumulate(residual, grad, velocity, momentum)
        chosen, values = _take(residual, velocity, k, _seed(name, step))
        handle = submit_owned(
            ALLGATHER,
            part(name, "topk"),
            _pack(chosen, values, _index_dtype(residual.size)),
            process_set=self.ps,
        )
        return _Pending(handle, "pairs", name, parts=[k] * self.size, value_dtype=residual.dtype)

    def finish_all(self, started: Sequence[Tuple[_Pending, np.ndarray]]) -> None:
        """Waits for the exchanges and writes each dense reduced gradient into its flat `out`
        (every exchange advancing a stage together, so they are fused together)."""
        started = list(started)
        self._wait(started)
        if self.hierarchical:
            self._across_hosts(started)
        for pending, out in started:
            if pending.stage != "pairs":
                continue
            total = (
                out if out.dtype == pending.value_dtype else np.empty(out.size, pending.value_dtype)
            )
            total[...] = 0
            payload = np.asarray(synchronize(pending.handle)).reshape(-1)
            blocks = _blocks(payload, pending.parts, _index_dtype(total.size), total.dtype)
            for b, (indices, values) in enumerate(blocks):
                total[indices] += values  # a block's indices are distinct: += adds every pair
                if pending.residual is not None and self.hosts.sent_here(b):
                    # what this machine sent: cleared (and its momentum masked)
                    pending.residual[indices] = 0
                    if pending.velocity is not None:
                        pending.velocity[indices] = 0
            if self.scale != 1.0:
                total *= self.scale
            if total is not out:
                out[...] = total

    @staticmethod
    def _wait(started) -> None:
        wait_all([pending.handle for pending, _ in started])

    def _across_hosts(self, started) -> None:
        """Note [Hierarchical top-k]: from the machine sums to every machine's pairs."""
        hosts = self.hosts
        for pending, out in started:
            if pending.stage != "host dense":
                continue
            # Dense warmup: the machine's sum and state, then the machines' sums added.
            summed = np.array(out, pending.residual.dtype)
            _accumulate(pending.residual, summed, pending.velocity, pending.momentum)
            out[...] = pending.residual
            pending.residual[...] = 0
            pending.handle = submit_into(
                ALLREDUCE,
                part(pending.name, "hosts"),
                out,
                inplace=True,
                postscale_factor=self.scale,
                process_set=hosts.cross,
            )
            pending.stage = "done"
        sparse = [(p, out) for p, out in started if p.stage == "host"]
        j, parts = hosts.local_rank, hosts.local_size
        for pending, _ in sparse:
            residual = pending.residual
            _accumulate(
                residual,
                np.asarray(synchronize(pending.handle)),
                pending.velocity,
                pending.momentum,
            )
            # This rank's slice of the machine's sum: its top entries, by the same density.
            bounds = [residual.size * q // parts for q in range(parts + 1)]
            counts = [
                topk_count(hi - lo, self.config.density) for lo, hi in zip(bounds, bounds[1:])
            ]
            chosen = bounds[j] + np.sort(
                select_topk(
                    residual[bounds[j] : bounds[j + 1]],
                    counts[j],
                    _seed(pending.name, pending.step),
                )
            )
            pending.handle = submit_owned(
                ALLGATHER,
                part(pending.name, "hosts"),
                _pack(chosen, residual[chosen], _index_dtype(residual.size)),
                process_set=hosts.cross,
            )
            # after the machine's ranks gather: each one's slice from every machine
            pending.parts = [counts[q] for q in hosts.slices for _ in range(hosts.count)]
            pending.stage = "cross"
        self._wait(started)
        for pending, _ in sparse:
            received = np.asarray(synchronize(pending.handle)).reshape(-1)
            pending.handle = submit_owned(
                ALLGATHER, part(pending.name, "gathered"), received, process_set=hosts.local
            )
            pending.stage = "pairs"
        self._wait(started)


def _seed(name: str, step: int) -> int:
    """The selection's sample seed: the same on every rank for a gradient and step."""
    return zlib.crc32(name.encode()) ^ step
