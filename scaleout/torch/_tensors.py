"""torch CPU tensors handed to the core, and each collective's start on them.

The core reads and writes a contiguous tensor's memory directly through `data_ptr()` (no copy,
no compiled code against torch); a non-contiguous tensor goes through a contiguous copy.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch.autograd.graph import increment_version

from scaleout import _naming
from scaleout._arrays import splits_array
from scaleout._errors import InvalidArgumentError
from scaleout._native import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    COLLECTIVE_CODES,
    DTYPE_CODES,
    REDUCESCATTER,
    Handle,
    Sum,
    auto_name,
    group,
    register_tensor_type,
    resolve_op,
    submit,
)

__all__ = [
    "check_device",
    "submit_owned",
    "start_allreduce",
    "start_grouped_allreduce",
    "start_broadcast",
    "start_alltoall",
    "start_reducescatter",
]

# The core's element type codes, by torch dtype (from the core's table).
_DTYPE_CODES = {
    getattr(torch, name): code
    for name, code in DTYPE_CODES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


register_tensor_type(torch.Tensor, _DTYPE_CODES, torch.strided)


# allreduce -> "allreduce", ...: the prefix of torch's names (_naming.torch_name).
_COLLECTIVE_NAMES = {code: name for name, code in COLLECTIVE_CODES.items()}


def check_device(device: torch.device) -> None:
    """Raises the error a tensor on `device` gets: only CPU tensors are supported so far."""
    if device.type == "cpu":
        return
    if device.type in ("cuda", "xpu", "mps", "hip"):
        raise InvalidArgumentError(
            f"GPU tensors are not supported yet: got a tensor on '{device}'. scaleout reduces CPU "
            "tensors; move it with tensor.cpu() (and the result back with .to(device))."
        )
    raise InvalidArgumentError(
        f"tensors on device '{device}' are not supported; scaleout works on CPU tensors"
    )


def _dtype_code(tensor, what: str) -> int:
    if isinstance(tensor, torch.Tensor):
        code = _DTYPE_CODES.get(tensor.dtype)
        if code is not None and tensor.is_cpu and tensor.layout is torch.strided:
            return code
    _refuse(tensor, what)


def _refuse(tensor, what: str):
    """Raises the error that says why the core cannot take `tensor`."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"{what} takes a torch.Tensor, not {type(tensor).__name__} "
            "(use scaleout's numpy API for arrays)"
        )
    check_device(tensor.device)
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(
            f"{what}: {tensor.layout} tensors are not supported; convert with tensor.to_dense()"
        )
    raise InvalidArgumentError(
        f"{what}: dtype {tensor.dtype} is not supported; scaleout handles "
        f"{', '.join(str(d).replace('torch.', '') for d in _DTYPE_CODES)}"
    )


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when the core can use its memory as it is, else a contiguous copy."""
    return tensor if tensor.is_contiguous() else tensor.detach().contiguous()


def _allocator(dtype: torch.dtype):
    """A core-owned result (allgather, alltoall, reducescatter) as a tensor viewing the core's
    bytes (no copy; the tensor keeps them alive)."""

    def alloc(shape, buffer):
        if 0 in shape:
            return torch.empty(shape, dtype=dtype)  # frombuffer refuses an empty buffer
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)

    return alloc


def _bumped(tensor: torch.Tensor) -> torch.Tensor:
    """Finishes an in-place collective that wrote into the tensor's own memory: tells autograd
    (its version counter)."""
    increment_version(tensor)
    return tensor


def _copied_back(tensor: torch.Tensor):
    """Finishes an in-place collective that went through a contiguous stand-in."""

    def finish(result: torch.Tensor) -> torch.Tensor:
        tensor.detach().copy_(result)
        return tensor

    return finish


def submit_into(
    collective: int,
    tensor,
    name: Optional[str],
    inplace: bool,
    op: int,
    root: int,
    prescale: float,
    postscale: float,
    what: str,
    ps: int,
    waits: bool = False,
    priority: int = 0,
) -> Handle:
    """allreduce / broadcast: the result in a new tensor, or written into `tensor`. `waits`:
    the caller synchronizes at once (Note [Caller drives] in the core); `priority`: higher goes
    first among work ready together (Note [Priority] in the core)."""
    name = _naming.torch_name(_COLLECTIVE_NAMES[collective], name)
    if inplace:
        # The hot path of every DistributedOptimizer hook and synchronous dist.all_reduce: the
        # binding reads the tensor itself; submit's arguments in its order (collective, name,
        # data, address, dtype, shape, output, out_address, op, root_rank, prescale_factor,
        # postscale_factor, splits, finish, process_set, caller_waits, priority), which skips
        # matching 11 keywords.
        try:
            return submit(
                collective, name, tensor, None, None, None, tensor, None, op, root,
                prescale, postscale, None, _bumped, ps, waits, priority,
            )  # fmt: skip
        except BufferError:
            pass  # not a contiguous CPU tensor of a core dtype: explained or copied below
    code = _dtype_code(tensor, what)
    src = _dense(tensor)
    if inplace:
        ptr = src.data_ptr()
        return submit(
            collective,
            name=name,
            data=src,
            address=ptr,
            dtype=code,
            shape=src.shape,
            output=src,
            out_address=ptr,
            op=op,
            root_rank=root,
            prescale_factor=prescale,
            postscale_factor=postscale,
            finish=_copied_back(tensor),
            process_set=ps,
            caller_waits=waits,
            priority=priority,
        )
    dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    return submit(
        collective,
        name=name,
        data=src,
        address=src.data_ptr(),
        dtype=code,
        shape=src.shape,
        output=dst,
        out_address=dst.data_ptr(),
        op=op,
        root_rank=root,
        prescale_factor=prescale,
        postscale_factor=postscale,
        process_set=ps,
        caller_waits=waits,
        priority=priority,
    )


def submit_owned(
    collective: int,
    tensor,
    name: Optional[str],
    what: str,
    ps: int,
    op: int = Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    splits=None,
    finish=None,
) -> Handle:
    """allgather / alltoall / reducescatter: the core owns the result until completion."""
    name = _naming.torch_name(_COLLECTIVE_NAMES[collective], name)
    code = _dtype_code(tensor, what)
    src = _dense(tensor)
    if collective == ALLGATHER and src.dim() == 0:
        src = src.reshape(1)
    return submit(
        collective,
        name=name,
        data=src,
        address=src.data_ptr(),
        dtype=code,
        shape=src.shape,
        output=_allocator(src.dtype),
        op=op,
        prescale_factor=prescale,
        postscale_factor=postscale,
        splits=splits,
        finish=finish,
        process_set=ps,
    )


# ---- each collective's start (a Handle), for the public functions and the autograd ones ----


def start_allreduce(
    tensor,
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    inplace: bool,
    ps: int,
    waits: bool = False,
    priority: int = 0,
) -> Handle:
    return submit_into(
        ALLREDUCE,
        tensor,
        name,
        inplace,
        op,
        0,
        prescale_factor,
        postscale_factor,
        "allreduce",
        ps,
        waits,
        priority,
    )


def start_grouped_allreduce(
    tensors, average, name, op, prescale_factor, postscale_factor, inplace, ps: int
) -> Handle:
    op = resolve_op(op, average)
    base = auto_name(ALLREDUCE, name, ps)
    return group(
        [
            start_allreduce(
                t, _naming.member(base, i), op, prescale_factor, postscale_factor, inplace, ps
            )
            for i, t in enumerate(tensors)
        ],
        base,
    )


def start_broadcast(
    tensor, root_rank: int, name: Optional[str], inplace: bool, ps: int, waits: bool = False
) -> Handle:
    return submit_into(
        BROADCAST, tensor, name, inplace, Sum, root_rank, 1.0, 1.0, "broadcast", ps, waits
    )


def _splits_array(splits) -> Optional[np.ndarray]:
    if isinstance(splits, torch.Tensor):
        check_device(splits.device)
        splits = splits.detach().cpu().numpy()
    return splits_array(splits)


def _with_received_splits(result):
    out, received = result
    return out, torch.tensor(received, dtype=torch.int32)


def start_alltoall(tensor, splits, name: Optional[str], ps: int) -> Handle:
    return submit_owned(
        ALLTOALL,
        tensor,
        name,
        "alltoall",
        ps,
        splits=_splits_array(splits),
        finish=_with_received_splits,
    )


def start_reducescatter(
    tensor, name: Optional[str], op: int, prescale_factor: float, postscale_factor: float, ps: int
) -> Handle:
    return submit_owned(
        REDUCESCATTER, tensor, name, "reducescatter", ps, op, prescale_factor, postscale_factor
    )
