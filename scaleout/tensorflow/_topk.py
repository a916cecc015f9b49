"""Compression.topk for TensorFlow: the residuals (and velocities) of Note [Top-k sparsification]
(scaleout/_topk.py) kept in variables, and every gradient of a step exchanged in one op.

The op takes the gradients, the residuals, the velocities and the step count, and returns the
reduced gradients and the updated state, which is then assigned to the variables; so the state
is ordinary TensorFlow state (checkpointed, broadcast, saved with a Keras optimizer) and the op
works eagerly, in tf.function and in TF1 graphs alike.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from scaleout._topk import Momentum, TopK, TopKExchange, residual_dtype
from scaleout.tensorflow._op_runner import call

__all__ = ["TopKVariables"]


class TopKVariables:
    """One optimizer's (or tape's) top-k state: per gradient label a flat residual variable
    (and a velocity with momentum correction), and the count of exchanges done."""

    def __init__(self, config: TopK, momentum: Optional[Momentum], prefix: str) -> None:
        self.config = config
        self.momentum = momentum
        self.prefix = prefix
        self.step: Optional[tf.Variable] = None
        self.residuals: Dict[str, tf.Variable] = {}
        self.velocities: Dict[str, tf.Variable] = {}
        self.on_create = None  # called with each new variable (a Keras optimizer tracks them)
        self.restore: List[np.ndarray] = []  # initial values, in creation order (a loaded model)

    @property
    def variables(self) -> List[tf.Variable]:
        """Every state variable, in creation order (the step count first)."""
        out = [] if self.step is None else [self.step]
        for label, residual in self.residuals.items():
            out.append(residual)
            if label in self.velocities:
                out.append(self.velocities[label])
        return out

    def _variable(self, initial, name: str) -> tf.Variable:
        if self.restore:
            saved = self.restore.pop(0)
            if tuple(saved.shape) == tuple(initial.shape):
                initial = tf.constant(saved, dtype=initial.dtype)
            else:  # not the state this optimizer makes: start afresh
                self.restore = []
        variable = tf.Variable(initial, trainable=False, name=name)
        # Per rank (what this rank has not sent): the broadcast callback leaves it alone.
        variable._scaleout_per_rank = True
        if self.on_create is not None:
            self.on_create(variable)
        return variable

    def ensure(self, labels: Sequence[str], sizes: Sequence[int], dtypes: Sequence) -> None:
        """Creates the missing variables (outside any tf.function)."""
        with tf.init_scope():
            if self.step is None:
                self.step = self._variable(tf.constant(0, tf.int64), f"{self.prefix}_topk_step")
            for label, size, dtype in zip(labels, sizes, dtypes):
                if label in self.residuals:
                    continue
                keep = residual_dtype(dtype)
                self.residuals[label] = self._variable(
                    tf.zeros([size], keep), f"{self.prefix}_topk_residual_{len(self.residuals)}"
                )
                if self.momentum is not None:
                    self.velocities[label] = self._variable(
                        tf.zeros([size], keep),
                        f"{self.prefix}_topk_velocity_{len(self.velocities)}",
                    )

    def reduce(
        self,
        grads: Sequence[tf.Tensor],
        labels: Sequence[str],
        op: int,
        prescale: float,
        postscale: float,
        ps: int,
    ) -> List[tf.Tensor]:
        """The dense reduced gradients (Note [Top-k sparsification]), the state updated."""
        grads = list(grads)
        labels = list(labels)
        sizes = [int(np.prod(g.shape.as_list())) for g in grads]
        self.ensure(labels, sizes, [g.dtype.as_numpy_dtype for g in grads])
        residuals = [self.residuals[label] for label in labels]
        velocities = [self.velocities[label] for label in labels] if self.momentum else []
        exchange = TopKExchange(self.config, op, prescale, postscale, ps)
        momentum, count = self.momentum, len(grads)
        out_dtypes = [g.dtype.as_numpy_dtype for g in grads]

        def np_fn(*arrays):
            gs, rs = arrays[:count], arrays[count : 2 * count]
            vs, step = arrays[2 * count : -1], int(arrays[-1])
            new_rs = [np.array(r, copy=True).reshape(-1) for r in rs]
            new_vs = [np.array(v, copy=True).reshape(-1) for v in vs]
            outs, started = [], []
            for i, (label, g) in enumerate(zip(labels, gs)):
                flat = np.asarray(g).reshape(-1).astype(new_rs[i].dtype, copy=False)
                out = np.empty(flat.size, new_rs[i].dtype)
                started.append(
                    exchange.start(
                        label, flat, new_rs[i], step, new_vs[i] if momentum else None, momentum, out
                    )
                )
                outs.append(out)
            exchange.finish_all(list(zip(started, outs)))
            reduced = [
                out.reshape(np.shape(g)).astype(dtype, copy=False)
                for out, g, dtype in zip(outs, gs, out_dtypes)
            ]
            return reduced + new_rs + new_vs

        inputs = (
            grads
            + [r.read_value() for r in residuals]
            + [v.read_value() for v in velocities]
            + [self.step.read_value()]
        )
        results = call(
            np_fn,
            inputs,
            [g.dtype for g in grads] + [r.dtype for r in residuals] + [v.dtype for v in velocities],
            [g.shape for g in grads] + [r.shape for r in residuals] + [v.shape for v in velocities],
            "scaleout_topk",
        )
        reduced = results[:count]
        updates = [
            var.assign(value, read_value=False)
            for var, value in zip(residuals + velocities, results[count:])
        ]
        with tf.control_dependencies(results):  # (a TF1 graph has no automatic order)
            updates.append(self.step.assign_add(1, read_value=False))
        with tf.control_dependencies([u for u in updates if u is not None]):
            return [tf.identity(g) for g in reduced]
