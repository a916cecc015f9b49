"""The autograd Functions behind the differentiable (out-of-place) torch collectives.

The backward passes apply the rules of scaleout._gradient_rules (Horovod's definitions, shared
with scaleout.tensorflow) to torch tensors.
"""

from __future__ import annotations

import torch

from scaleout import _gradient_rules, _naming
from scaleout._native import ALLGATHER, synchronize
from scaleout.torch._tensors import (
    start_allreduce,
    start_alltoall,
    start_broadcast,
    start_grouped_allreduce,
    start_reducescatter,
    submit_owned,
)

__all__ = [
    "AllreduceFn",
    "GroupedAllreduceFn",
    "AllgatherFn",
    "BroadcastFn",
    "AlltoallFn",
    "ReducescatterFn",
]


class _TorchOps(_gradient_rules.Ops):
    """The gradient rules' primitives on torch tensors, on one process set (the forward's)."""

    def allreduce_async(self, x, name, op, prescale, postscale):
        return start_allreduce(x, name, op, prescale, postscale, False, self.process_set)

    def allgather_async(self, x, name):
        return submit_owned(ALLGATHER, x, name, "allgather", self.process_set)

    def alltoall(self, x, splits, name):
        return synchronize(start_alltoall(x, splits, name, self.process_set))

    def rows_tensor(self, rows):
        return torch.tensor([rows], dtype=torch.int64)

    def narrow(self, x, start, length):
        return x.narrow(0, start, length)

    def zeros_like(self, x):
        return torch.zeros_like(x)

    def scale(self, x, factor):
        return x * factor


class AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        ctx.ps = ps
        return synchronize(
            start_allreduce(tensor, name, op, prescale_factor, postscale_factor, False, ps)
        )

    @staticmethod
    def backward(ctx, grad):
        g = _gradient_rules.gradient("allreduce")(_TorchOps(ctx.ps), grad, *ctx.args)
        return g, None, None, None, None, None


class GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (name, op, prescale_factor, postscale_factor, ps)
        return tuple(
            synchronize(
                start_grouped_allreduce(
                    tensors, None, name, op, prescale_factor, postscale_factor, False, ps
                )
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post, ps = ctx.args
        _gradient_rules.check_gradient_op("allreduce", op)
        gs = synchronize(
            start_grouped_allreduce(grads, None, _naming.gradient(name), op, pre, post, False, ps)
        )
        return (None, None, None, None, None, *gs)


class AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.name = name
        ctx.shape = tensor.shape
        ctx.ps = ps
        return synchronize(submit_owned(ALLGATHER, tensor, name, "allgather", ps))

    @staticmethod
    def backward(ctx, grad):
        rows = ctx.shape[0] if len(ctx.shape) else 1
        g = _gradient_rules.gradient("allgather")(_TorchOps(ctx.ps), grad, ctx.name, rows)
        return g.reshape(ctx.shape), None, None


class BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.args = (root_rank, name)
        ctx.ps = ps
        return synchronize(start_broadcast(tensor, root_rank, name, False, ps))

    @staticmethod
    def backward(ctx, grad):
        root_rank, name = ctx.args
        g = _gradient_rules.gradient("broadcast")(_TorchOps(ctx.ps), grad, name, root_rank)
        return g, None, None, None


class AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = synchronize(start_alltoall(tensor, splits, name, ps))
        ctx.args = (received, name)
        ctx.ps = ps
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _grad_received):
        received, name = ctx.args
        g = _gradient_rules.gradient("alltoall")(_TorchOps(ctx.ps), grad, name, received)
        return g, None, None, None


class ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        ctx.ps = ps
        return synchronize(
            start_reducescatter(tensor, name, op, prescale_factor, postscale_factor, ps)
        )

    @staticmethod
    def backward(ctx, grad):
        g = _gradient_rules.gradient("reducescatter")(_TorchOps(ctx.ps), grad, *ctx.args)
        return g, None, None, None, None, None
