"""Local SGD, hierarchical model averaging and DiLoCo's outer step: the schedule, written once for
every front end (scaleout.torch.LocalSGDOptimizer; scaleout.tensorflow.LocalSGD, under Keras's
LocalSGDCallback too).

Note [Local SGD]
Bulk-synchronous training (DistributedOptimizer) reduces every gradient at every step, so every
step waits for the slowest rank and the slowest link. Local SGD lets each rank step on its own
gradients and averages the model (parameters, and buffers such as BatchNorm's running
statistics, whose ranks would otherwise drift apart) every `period` steps: a period of 16 sends
a sixteenth of the bytes, at the price of ranks that differ between averaging rounds.

- Warm-up: the first `warmup_steps` steps are bulk-synchronous (the gradients reduced as
  DistributedOptimizer reduces them, overlapped with backward), where training moves fastest;
  the local steps start from the identical model this leaves on every rank.
- `period=1` without an outer optimizer is bulk-synchronous at every step, exactly
  DistributedOptimizer (not an average of models after every step, which differs from it in
  the last bits).
- Hierarchical: where the job's allreduces are hierarchical (ranks on several machines, Note
  [Host sets]), the ranks of a machine also average after every local step, through shared
  memory, and the machines every `period` steps: only the rounds over the whole job cross the
  slow link.
- Outer optimizer (DiLoCo, Douillard et al.): every rank keeps the model of the last round over
  the whole set (the anchor); at a round the averaged change (anchor - average) is handed to the
  outer optimizer as the gradient of the anchor, and the model becomes the outer step from the
  anchor instead of the average (SGD with lr 1 and no momentum is plain local SGD). Every rank
  makes the same outer step from the same averaged numbers, so the models stay identical.

- Bounded staleness (`staleness=S`, stale-synchronous parallel): a round over the set does not
  stop the ranks. At the round's step each rank snapshots its model, starts averaging the
  snapshots (nonblocking collectives, fused by the core) and steps on; when the average arrives
  it takes it plus its own progress since the snapshot (model = average + (model - snapshot)).
  The round must have arrived S steps after it started: a rank that gets there first waits (the
  bound), so no rank runs more than S steps past a round that the slowest rank has not yet
  joined, and a straggler costs the others a wait every period at most instead of every step.
  S <= period (a round arrives before the next starts); not with an outer optimizer. A round
  is taken at exactly S steps after it started on every rank, never earlier even if it arrived
  (taking it as soon as it arrives would make the trajectory depend on timing), so runs repeat.

The step count decides everything, so every rank makes the same choice at the same step; it is
in the optimizer's state_dict (with the anchor and the outer optimizer's state), so a resumed
run - an elastic commit included - continues the period where it stopped (a round in flight is
taken first).
"""

from __future__ import annotations

import itertools
import operator
from typing import Dict, Optional

from scaleout import _runtime
from scaleout._errors import InvalidArgumentError
from scaleout._host_sets import Hosts, host_sets
from scaleout._native import poll, synchronize

__all__ = ["Schedule", "counters"]

# Note [Local SGD]: a round over the whole process set, or among the ranks of one machine.
ALL, HOST = "all", "host"

_counters: Dict[str, Dict[str, int]] = {
    ALL: {"rounds": 0, "bytes": 0, "waits": 0},
    HOST: {"rounds": 0, "bytes": 0, "waits": 0},
}


def counters() -> dict:
    """stats()["local_sgd"]: the averaging rounds this process made, by scope, and their bytes."""
    return {scope: dict(c) for scope, c in _counters.items()}


_runtime.add_stats("local_sgd", counters)

# Every schedule's collectives are named with its own number: a round of an earlier optimizer
# over the same model may still be in flight. Every rank makes its optimizers (and callbacks) in
# the same order, so the numbers agree.
_made = itertools.count()


def _whole(value, name: str, least: int, what: str) -> int:
    try:
        number = None if isinstance(value, bool) else operator.index(value)  # numpy's too
    except TypeError:
        number = None
    if number is None or number < least:
        raise InvalidArgumentError(f"{what}: {name} must be an integer >= {least}, not {value!r}")
    return number


class Schedule:
    """The schedule of one local-SGD optimizer (Note [Local SGD]): which steps reduce gradients,
    and after which steps the model is averaged, and over whom. `what` names the caller in
    errors."""

    def __init__(
        self,
        period,
        warmup_steps,
        has_outer: bool,
        hierarchical: Optional[bool],
        process_set_id: int,
        staleness=0,
        what: str = "LocalSGDOptimizer",
    ) -> None:
        self.period = _whole(period, "period", 1, what)
        self.warmup_steps = _whole(warmup_steps, "warmup_steps", 0, what)
        self.staleness = _whole(staleness, "staleness", 0, what)
        if self.staleness > self.period:
            raise InvalidArgumentError(
                f"{what}: staleness={staleness} is more than period={period}: a round "
                "must arrive before the next one starts"
            )
        if self.staleness and self.period == 1 and not has_outer:
            raise InvalidArgumentError(
                f"{what}: staleness with period=1 (and no outer optimizer): every "
                "step is bulk-synchronous, there is no round to overlap"
            )
        if self.staleness and has_outer:
            raise InvalidArgumentError(
                f"{what}: staleness with an outer optimizer is not supported: the "
                "outer step needs every rank's change of the same round at once"
            )
        if hierarchical is not None and not isinstance(hierarchical, bool):
            raise InvalidArgumentError(
                f"{what}: hierarchical must be None, True or False, not {hierarchical!r}"
            )
        self.has_outer = has_outer
        self.process_set_id = process_set_id
        self.hosts: Optional[Hosts] = None
        if hierarchical is not False and process_set_id == 0 and not self.always_bulk:
            self.hosts = host_sets()  # collective, the same answer on every rank
        if hierarchical and self.hosts is None:
            raise InvalidArgumentError(
                f"{what}: hierarchical=True needs the global process set, rounds "
                "(a period > 1 or an outer optimizer) and a job whose allreduces are "
                "hierarchical over machines with the same number of ranks each; this one "
                "lacks one of them (leave hierarchical=None to average within machines only "
                "where it can be done)"
            )
        self.step = 0  # steps completed
        self._prefix = f"scaleout.local_sgd.{next(_made)}"

    @property
    def always_bulk(self) -> bool:
        return self.period == 1 and not self.has_outer

    def bulk(self) -> bool:
        """Whether the step under way reduces gradients (bulk-synchronous)."""
        return self.always_bulk or self.step < self.warmup_steps

    def finish_step(self) -> Optional[str]:
        """Counts the step just made; what to average now: ALL, HOST or None."""
        bulk = self.bulk()
        self.step += 1
        if bulk:
            return None
        if (self.step - self.warmup_steps) % self.period == 0:
            return ALL
        return HOST if self.hosts is not None else None

    def due(self, started: int) -> bool:
        """Whether a round over the set started after step `started` (Note [Local SGD]'s
        bounded staleness) is taken now, after the step just counted."""
        return self.step >= started + self.staleness

    def name(self, scope: str, tensor: str) -> str:
        """The name of the collective that averages `tensor` in a round of `scope`."""
        return f"{self._prefix}.{scope}.{tensor}"

    def process_set(self, scope: str) -> int:
        """The id of the process set a round of `scope` averages over."""
        return self.hosts.local if scope == HOST else self.process_set_id

    @staticmethod
    def record(scope: str, nbytes: int) -> None:
        _counters[scope]["rounds"] += 1
        _counters[scope]["bytes"] += nbytes

    def wait(self, handles: list, nbytes: int, counted: bool) -> None:
        """Waits for the collectives of a round over the set in flight (bounded staleness) and
        records its `nbytes`; `counted`: the schedule's own wait (not a checkpoint's), counted
        in stats() if the round had not arrived."""
        if counted and not all(poll(h) for h in handles):
            _counters[ALL]["waits"] += 1
        for h in handles:
            synchronize(h)
        self.record(ALL, nbytes)
