"""SyncBatchNorm: batch normalisation with statistics over the whole global batch."""

from __future__ import annotations

import itertools
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from scaleout._naming import gradient, part
from scaleout._native import Sum, synchronize
from scaleout._runtime import size
from scaleout.torch._collectives import allgather_async
from scaleout.torch._tensors import check_device, start_allreduce

__all__ = ["SyncBatchNorm"]

_instances = itertools.count()


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d in data-parallel training: in training mode the
    mean and variance are those of the batch across all ranks (as one process with the global
    batch would compute them), and so are the gradients. In eval mode, or on one rank, it is
    plain batch normalisation with the running statistics.

    Each instance has a name that identifies its collectives across ranks (by default its
    construction order: build the model identically on every rank, or pass `name`)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        name: Optional[str] = None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.name = name or f"SyncBatchNorm.{next(_instances)}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        check_device(input.device)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        if not use_batch_stats or size() == 1:
            return F.batch_norm(
                input,
                running_mean,
                running_var,
                self.weight,
                self.bias,
                use_batch_stats,
                factor,
                self.eps,
            )
        return _SyncBatchNormFn.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, self.name
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Returns `module` with every BatchNorm*d layer replaced by a SyncBatchNorm holding the
        same parameters and statistics."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            with torch.no_grad():
                if module.affine:
                    out.weight = module.weight
                    out.bias = module.bias
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for child_name, child in module.named_children():
            out.add_module(child_name, cls.convert_sync_batchnorm(child))
        return out


def _channel_shape(x: torch.Tensor):
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, name):
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        compute = torch.promote_types(x.dtype, torch.float32)
        xc = x.detach().to(compute)
        count = x.numel() // channels if channels else 0
        if count:
            mean, var = xc.mean(dims), xc.var(dims, unbiased=False)
        else:
            mean = var = torch.zeros(channels, dtype=compute)
        # One row per rank: [count, mean, biased var]; combined with the parallel-variance
        # formula in float64 (stable, unlike a global sum of squares).
        local = torch.cat(
            [torch.tensor([float(count)], dtype=torch.float64), mean.double(), var.double()]
        ).reshape(1, -1)
        rows = synchronize(allgather_async(local, part(name, "stats")))
        counts, means, variances = rows[:, :1], rows[:, 1 : channels + 1], rows[:, channels + 1 :]
        total = float(counts.sum())
        if total == 0:
            raise ValueError("SyncBatchNorm got an empty batch on every rank")
        gmean = (counts * means).sum(0) / total
        gvar = (counts * (variances + (means - gmean) ** 2)).sum(0) / total
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(gmean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = gvar * (total / (total - 1)) if total > 1 else gvar
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = _channel_shape(x)
        invstd = torch.rsqrt(gvar + eps).to(compute)
        xhat = (xc - gmean.to(compute).view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(compute).view(shape)
        if bias is not None:
            y = y + bias.detach().to(compute).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.args = (name, total, x.dtype, None if bias is None else bias.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xhat, invstd, weight = ctx.saved_tensors
        name, total, dtype, bias_dtype = ctx.args
        dims = [0] + list(range(2, xhat.dim()))
        shape = _channel_shape(xhat)
        dy = grad.to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(bias_dtype) if bias_dtype is not None else None
        # Each output depends on every rank's inputs through the mean and variance, so the two
        # channel sums are taken over the global batch.
        both = synchronize(
            start_allreduce(
                torch.cat([sum_dy, sum_dy_xhat]), gradient(name), Sum, 1.0, 1.0, False, 0
            )
        )
        mean_dy, mean_dy_xhat = (both / total).split(sum_dy.numel())
        scale = invstd if weight is None else invstd * weight.detach().to(invstd.dtype)
        dx = scale.view(shape) * (dy - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape))
        return dx.to(dtype), grad_weight, grad_bias, None, None, None, None, None
