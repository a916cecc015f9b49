"""send/recv of the "scaleout" torch.distributed backend (Note [torch.distributed backend]).

Point-to-point messages do not go through the core, whose work is collectives that every rank
of a process set names: they go straight over MPI, on a duplicate of the job's communicator
made with the default group, where every rank takes part (MPI runs with MPI_THREAD_MULTIPLE
for the core, so these calls may come from any thread). isend/irecv post MPI_Isend/MPI_Irecv at
once, on the caller's thread, so `batch_isend_irecv` and rings of them cannot deadlock on the
order of posting; waiting polls the request (MPI progresses a large message only while someone
tests it) and, between tests, scaleout's liveness: a peer that dies makes the wait raise
scaleout's ShutDownError naming it (from the core: a collective started then fails naming the
rank) instead of waiting forever, and the group's timeout (init_process_group's `timeout=`)
bounds the wait. The bytes of the tensor are sent as they are (any dtype); a receive of fewer
bytes than were sent fails in MPI.
Not here: a receive from any source (`dist.recv` without `src`).
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import torch

from scaleout import _binding, _runtime
from scaleout._errors import ScaleoutError, ShutDownError
from scaleout.torch import _collectives as so

_comm: Any = None
_tag_ub = 0  # MPI's largest tag on _comm


def prepare() -> None:
    """Makes the communicator for the messages: collective over the job, so it runs where every
    rank is, when the default group is made (at the first send, the other ranks would not
    come, and a dead rank would never come)."""
    global _comm, _tag_ub
    if _comm is None:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() == _runtime.size():
            _comm = MPI.COMM_WORLD.Dup()
            _tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)


def _communicator(tag: int, what: str):
    """The messages' communicator, once `tag` is one MPI takes."""
    if _comm is None:
        raise NotImplementedError(
            "send/recv of the scaleout backend need scaleout to run on every process of the "
            "MPI job (scaleout.init(comm=...) on a part of it leaves them out)"
        )
    if not 0 <= tag <= _tag_ub:
        raise ValueError(f"{what}: tag {tag} is not in MPI's range 0..{_tag_ub}")
    return _comm


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def start_send(tensors: List[torch.Tensor], dst: int, tag: int, timeout: Optional[float]):
    """Posts the send of each tensor (the job's rank `dst`); a finish that waits for them."""
    what = f"send to rank {dst} (tag {tag})"
    comm = _communicator(tag, what)
    held = [_bytes(t.contiguous()).numpy() for t in tensors]  # alive until the sends end
    requests = [comm.Isend(b, dest=dst, tag=tag) for b in held]

    def finish(_):
        _wait_all(requests, what, timeout)
        del held[:]
        return tensors

    return finish


def start_recv(tensors: List[torch.Tensor], src: int, tag: int, timeout: Optional[float]):
    """Posts the receive of each tensor (from the job's rank `src`); a finish that waits for
    them and fills the tensors."""
    what = f"recv from rank {src} (tag {tag})"
    comm = _communicator(tag, what)
    into = [
        t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in tensors
    ]
    held = [_bytes(t).numpy() for t in into]  # alive until the receives end
    requests = [comm.Irecv(b, source=src, tag=tag) for b in held]

    def finish(_):
        _wait_all(requests, what, timeout)
        del held[:]
        for t, got in zip(tensors, into):
            if got is not t:
                t.copy_(got)
        return tensors

    return finish


def _wait_all(requests: list, what: str, timeout: Optional[float]) -> None:
    from mpi4py import MPI

    start, pause = time.monotonic(), 1e-6
    while True:
        try:
            if MPI.Request.Testall(requests):
                return
        except MPI.Exception as exc:
            raise ScaleoutError(f"{what}: MPI failed: {exc.Get_error_string()}") from None
        if _binding.peer_died():
            _raise_dead(what)
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(
                f"{what} did not complete in {timeout:g} s (the group's timeout): no matching "
                "send or recv on the other rank"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


def _raise_dead(what: str) -> None:
    """A rank died: the core's next collective fails naming it, and so does this."""
    try:
        so.barrier()
    except ScaleoutError as exc:
        raise type(exc)(f"{what}: {exc}") from None
    raise ShutDownError(f"{what}: a rank of the job died")
