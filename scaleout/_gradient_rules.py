"""What each collective means, written once for every front end: the reduce ops it accepts, its
gradient (Horovod's definitions), the error raised where a gradient is not defined, and gradient
predivision, and the argument rules of the gradient reducers (DistributedOptimizer,
DistributedGradientTape): backward_passes_per_step, the predivide factor, Adasum's limits. (The
compression classes are scaleout._compression's.)

The gradient rules are functions over a small set of primitives a front end supplies (`Ops`):
scaleout.torch passes torch tensors, scaleout.tensorflow passes the numpy arrays its gradient ops
receive. So torch and TensorFlow compute the same gradient by construction; tests check both
against the same expected values (tests/mp/gradient_rules.py).

Convention (Horovod's): the gradient a collective hands back on each rank combines every rank's
output gradient the way Horovod does, so that a data-parallel optimizer that then averages
parameter gradients sees what it would see under Horovod. Backward collectives are named after
the forward one (scaleout._naming.gradient), so ranks match them whatever order autograd runs
them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Tuple

import numpy as np

from scaleout import _naming, _process_sets, _runtime
from scaleout._arrays import splits_array, submit_into, submit_owned
from scaleout._errors import InvalidArgumentError, NoGradientError, NotYetImplementedError
from scaleout._native import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    OP_NAMES,
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    Product,
    Sum,
    synchronize,
    wait_all,
)

__all__ = [
    "Collective",
    "COLLECTIVES",
    "Ops",
    "check_gradient_op",
    "gradient",
    "predivided",
    "numpy_ops",
    "check_backward_passes_per_step",
    "check_predivide_op",
    "check_adasum_process_set",
    "check_adasum_compression",
    "check_adasum_aggregation",
    "check_adasum_keras",
]

ALL_OPS = (Average, Sum, Min, Max, Product)


@dataclass(frozen=True)
class Collective:
    """One row of the table."""

    name: str
    ops: Tuple[int, ...]  # reduce ops the forward accepts (the core checks them)
    gradient_ops: Tuple[int, ...]  # ops for which the gradient is defined
    gradient: str  # Horovod's definition, in words (the code is below)


COLLECTIVES = {
    c.name: c
    for c in (
        Collective(
            "allreduce",
            ALL_OPS,
            (Average, Sum),
            "an allreduce of the output gradients with the same op and scale factors",
        ),
        Collective(
            "allgather", (), (), "this rank's rows of the Average-allreduce of the output gradients"
        ),
        Collective(
            "broadcast",
            (),
            (),
            "on the root, the Average-allreduce of the output gradients; zeros elsewhere",
        ),
        Collective(
            "reducescatter",
            ALL_OPS,
            (Average, Sum),
            "the allgather of the output gradients, times size() for Sum, times the scale factors",
        ),
        Collective(
            "alltoall",
            (),
            (),
            "the output gradients sent back the way the rows came (the received splits)",
        ),
    )
}


def check_gradient_op(what: str, op: int) -> None:
    """Raises NoGradientError (an InvalidArgumentError and a NotImplementedError, the classes
    torch and TensorFlow users catch) when the gradient of `what` with `op` is not defined."""
    if op not in COLLECTIVES[what].gradient_ops:
        raise NoGradientError(
            f"the gradient of {what} is defined for the Average and Sum ops only, not "
            f"{OP_NAMES.get(op, op)}"
        )


class Ops:
    """The primitives a front end supplies for the gradient rules, on its own tensor type, for
    the collectives of one process set (the core's id, 0: the global set). The *_async methods
    return scaleout Handles on that set."""

    def __init__(self, process_set: int = 0) -> None:
        self.process_set = process_set

    def set_rank(self) -> int:
        """This rank's place in the set (rows, offsets and splits follow the set's order)."""
        return _process_sets.set_rank(self.process_set)

    def set_size(self) -> int:
        return _process_sets.set_size(self.process_set)

    def allreduce_async(self, x, name: str, op: int, prescale: float, postscale: float) -> Handle:
        raise NotImplementedError

    def allgather_async(self, x, name: str) -> Handle:
        raise NotImplementedError

    def alltoall(self, x, splits, name: str) -> Tuple[Any, Any]:
        """(received, received_splits)"""
        raise NotImplementedError

    def rows_tensor(self, rows: int):
        """A one-element int64 tensor holding `rows` (allgathered to find row offsets)."""
        raise NotImplementedError

    def narrow(self, x, start: int, length: int):
        """Rows [start, start + length) of x."""
        raise NotImplementedError

    def zeros_like(self, x):
        raise NotImplementedError

    def scale(self, x, factor: float):
        raise NotImplementedError


def _allreduce_grad(
    ops: Ops, dy, name: str, op: int, prescale: float = 1.0, postscale: float = 1.0
):
    check_gradient_op("allreduce", op)
    return synchronize(ops.allreduce_async(dy, _naming.gradient(name), op, prescale, postscale))


def _allgather_grad(ops: Ops, dy, name: str, rows: int):
    grad = _naming.gradient(name)
    reduced, counts = wait_all(
        [
            ops.allreduce_async(dy, grad, Average, 1.0, 1.0),
            ops.allgather_async(ops.rows_tensor(rows), _naming.part(grad, _naming.ROWS)),
        ]
    )
    offset = int(sum(int(c) for c in list(counts)[: ops.set_rank()]))
    return ops.narrow(reduced, offset, rows)


def _broadcast_grad(ops: Ops, dy, name: str, root_rank: int):
    reduced = synchronize(ops.allreduce_async(dy, _naming.gradient(name), Average, 1.0, 1.0))
    # root_rank is the job's rank, as in the forward (Horovod's convention).
    return reduced if _runtime.rank() == root_rank else ops.zeros_like(reduced)


def _reducescatter_grad(
    ops: Ops, dy, name: str, op: int, prescale: float = 1.0, postscale: float = 1.0
):
    check_gradient_op("reducescatter", op)
    gathered = synchronize(ops.allgather_async(dy, _naming.gradient(name)))
    factor = prescale * postscale * (ops.set_size() if op == Sum else 1)
    return gathered if factor == 1.0 else ops.scale(gathered, factor)


def _alltoall_grad(ops: Ops, dy, name: str, received_splits):
    back, _ = ops.alltoall(dy, received_splits, _naming.gradient(name))
    return back


_GRADIENTS: dict = {
    "allreduce": _allreduce_grad,
    "allgather": _allgather_grad,
    "broadcast": _broadcast_grad,
    "reducescatter": _reducescatter_grad,
    "alltoall": _alltoall_grad,
}


def gradient(what: str) -> Callable[..., Any]:
    """The gradient rule of collective `what`: rule(ops, dy, name, ...forward arguments)."""
    return _GRADIENTS[what]


# ---- the gradient reducers' argument rules ----
# Each rule is written once, in one wording, and each front end calls it where (and in the
# order) it checks. Where Horovod has words for a rule, they begin the message. `error`: the
# class a front end raises, where front ends differ (Horovod's TensorFlow and Keras raise
# ValueError, scaleout.torch InvalidArgumentError, a ValueError too; the TensorFlow shim turns
# a scaleout error into a TensorFlow-typed one, so it passes ValueError to keep raising that).


def check_backward_passes_per_step(passes, error: type = InvalidArgumentError) -> None:
    """backward_passes_per_step is an int >= 1 (the TensorFlow front ends pass int() of it, as
    Horovod's check converts it)."""
    if not isinstance(passes, int) or passes < 1:
        raise error(f"backward_passes_per_step must be > 0 (an int >= 1), not {passes!r}")


def check_predivide_op(op, gradient_predivide_factor) -> None:
    """A predivide factor other than 1 needs op=Average (it splits Average's division)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidArgumentError(
            "gradient_predivide_factor not supported with op != Average: "
            "predivision needs op=Average"
        )


def check_adasum_process_set(process_set_id: int) -> None:
    """op=Adasum reduces over the global set only (as Horovod's)."""
    if process_set_id != 0:
        raise NotYetImplementedError("Adasum does not support non-global process sets yet")


def check_adasum_compression(op, uses_topk: bool) -> None:
    """op=Adasum combines whole updates: top-k's sparse exchange cannot carry them. (`uses_topk`
    because Compression.topk's class is a layer above.)"""
    if op == Adasum and uses_topk:
        raise InvalidArgumentError("Compression.topk cannot be combined with op=Adasum")


def check_adasum_aggregation(average_aggregated_gradients: bool) -> None:
    """op=Adasum sums locally aggregated gradients (the TF1 DistributedOptimizer's option)."""
    if average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")


def check_adasum_keras(op) -> None:
    """No op=Adasum for a Keras optimizer (Horovod refuses it)."""
    if op == Adasum:
        raise ValueError("op == Adasum is not supported with Keras optimizers (as in Horovod)")


# ---- gradient predivision (DistributedOptimizer, DistributedGradientTape) ----


def predivided(
    op: int, gradient_predivide_factor: float, world_size: int
) -> Tuple[int, float, float]:
    """(op, prescale, postscale) for reducing gradients: with a predivide factor f, Average
    becomes a Sum of g / f multiplied by f / size afterwards (smaller partial sums in low
    precision). Raises for a non-positive factor, or a factor with another op."""
    if not gradient_predivide_factor > 0:
        raise InvalidArgumentError("gradient_predivide_factor must be positive")
    if gradient_predivide_factor == 1.0:
        return op, 1.0, 1.0
    check_predivide_op(op, gradient_predivide_factor)
    return Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / world_size


# ---- the primitives on numpy arrays ----


class _NumpyOps(Ops):
    """The gradient rules' primitives on numpy arrays, on one process set (scaleout.tensorflow's
    gradient ops run them on the arrays TensorFlow hands a numpy_function)."""

    def allreduce_async(self, x, name, op, prescale, postscale):
        return submit_into(
            ALLREDUCE,
            name,
            x,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self.process_set,
        )

    def allgather_async(self, x, name):
        return submit_owned(ALLGATHER, name, x, process_set=self.process_set)

    def alltoall(self, x, splits, name):
        return synchronize(
            submit_owned(
                ALLTOALL, name, x, splits=splits_array(splits), process_set=self.process_set
            )
        )

    def rows_tensor(self, rows):
        return np.asarray([rows], np.int64)

    def narrow(self, x, start, length):
        return np.ascontiguousarray(x[start : start + length])

    def zeros_like(self, x):
        return np.zeros_like(x)

    def scale(self, x, factor):
        return (x * np.asarray(factor, x.dtype)).astype(x.dtype, copy=False)


def numpy_ops(process_set: int = 0) -> _NumpyOps:
    """The gradient rules' primitives on numpy arrays for the set with core id `process_set`."""
    return _NumpyOps(process_set)
