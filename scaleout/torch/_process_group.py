"""The "scaleout" torch.distributed backend (issue 25, first step): `import scaleout.torch`
registers it, and `dist.init_process_group("scaleout")` in a job started by scaleoutrun (or
mpiexec) runs torch.distributed's collectives, DDP included, through scaleout's core.

Note [torch.distributed backend]
A Python `ProcessGroup` subclass (torch's Python process-group trampoline: no C++ built against
torch), one per torch group: the default group and world-sized groups run on the job's global
process set; a group of some ranks (new_group(ranks=[...]), which torch creates on those ranks
alone) on the process set its members make with MPI_Comm_create_group (Note [Process sets]).
Each collective is submitted to the core at once and returns a torch `Work` made from a
`Future`. Names come round (_Names): torch requires every rank to call a group's collectives in
one order, so the k-th call of a signature (the collective, dtype, shape, op or root) is the
same call everywhere, and it runs as "torch.<group>.<collective>.<signature>.<k mod 8>". A name
that comes round finds its response-cache slot (Note [Response cache]), so the core skips most
of a negotiation, and a small synchronous allreduce takes its fast lane (Note [Fast lane]).
The core refuses a name in flight twice on one rank: a call whose name's last user on this rank
may still be in flight is submitted later (_Later: by whoever first waits for it, once that one
is complete), so issuing a collective never blocks (8 calls of one signature in flight at once
make that happen). Alltoall and scatter, which the core does not cache, get names of their own.
A shape or dtype that differs between ranks makes different names: the core reports the
deadlock (every rank waits for a name no other rank submitted) within about a second, naming
each rank's, rather than a MismatchError; async calls of the same signatures issued before it
is waited for may pair with the other ranks' wrong ones first. A call that fails with a core
error gives its turn back (the same on every rank), so the ranks' names stay in step; an async
one whose signature was called again meanwhile cannot, and the group then raises on every later
call. A synchronous call (torch's asyncOp=False: dist.all_reduce(t) and the
like) is completed on the caller's thread before the Work returns; a synchronous all_reduce of
one tensor has a path of its own with no future or closure (_allreduce_now), the cost at 4 KiB
being this Python. One daemon thread per process completes the others' futures in submission
order: it waits for each core handle (without the GIL) and sets the future's result, or its
exception (a scaleout error, so a dead peer or a mismatch reaches `wait()` and DDP's backward
as an exception, never a hang). A future's callbacks run on that thread; one that starts and
waits for another collective gets it completed on the spot (see _Completer).

Under scaleoutrun every rank gets torch's env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) under SCALEOUT_TORCH_* names, and importing this
module sets torch's own from them, so `init_process_group("scaleout")` needs no arguments and
programs that do not use scaleout.torch see no torch variables.

This step covers: all_reduce (SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM), reduce, broadcast,
all_gather, all_gather_into_tensor, gather, scatter, reduce_scatter_tensor, all_to_all_single,
barrier, DDP (its hooks, no_sync, join) and FSDP2, on CPU tensors, for any group; the
ranks started by an MPI launcher, or by torchrun or a shell with torch's variables, which join
through torch's store before MPI starts (Note [PMI bootstrap], scaleout/_pmi_bootstrap.py).
Functional collectives (DTensor's redistribution) need a C++ backend and do not work yet.
send/recv go straight over MPI (scaleout/torch/_p2p.py). Not yet: recv from any source.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

import scaleout
from scaleout import _pmi_bootstrap
from scaleout._naming import torch_name
from scaleout._native import (
    ALLREDUCE,
    OP_NAMES,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allreduce_now,
    submit,
    synchronize,
    wait_all,
)
from scaleout._process_set_registry import member_process_set
from scaleout._process_sets import global_process_set
from scaleout.torch import _backend_errors as _errors
from scaleout.torch import _collectives as so
from scaleout.torch import _p2p, _tensors

NAME = "scaleout"

# torch's reduction (a ReduceOp's .op) -> the core's.
_OPS = {
    dist.ReduceOp.RedOpType.SUM: Sum,
    dist.ReduceOp.RedOpType.AVG: Average,
    dist.ReduceOp.RedOpType.MIN: Min,
    dist.ReduceOp.RedOpType.MAX: Max,
    dist.ReduceOp.RedOpType.PRODUCT: Product,
}


# The same by the enum's value: hashing torch's enum itself costs a few microseconds a call.
_OPS_BY_VALUE = {kind.value: core for kind, core in _OPS.items()}
_SUM = dist.ReduceOp.SUM


def _core_op(op: dist.ReduceOp, what: str) -> tuple:
    """The core's op and the prescale factor of torch's ReduceOp: PREMUL_SUM (each rank's input
    times the op's factor, then summed) is a Sum with that prescale."""
    kind = op.op
    core = _OPS_BY_VALUE.get(kind.value)
    if core is not None:
        return core, 1.0
    if kind == dist.ReduceOp.RedOpType.PREMUL_SUM:
        # Older torch (2.11 here) has no ReduceOp.factor; the op's pickled state holds it.
        factor = getattr(op, "factor", None)
        if factor is None:
            factor = op.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise ValueError(f"{what}: PREMUL_SUM's factor must be a scalar, not {factor}")
            factor = factor.item()
        return Sum, float(factor)
    _not_yet(f"{what} with ReduceOp.{kind.name}")


class _Completer:
    """Completes torch futures from core handles: each on whichever thread first asks, the
    waiting caller (_Work.wait: a synchronous dist.all_reduce completes on its own thread, with
    no hand-off between threads) or one daemon thread that takes them in submission order (for
    those nobody waits on: DDP's buckets, async work).

    Setting a future's result runs its callbacks (`.then()`) on that thread, and some wait there
    for another collective (torch's PowerSGD and quantization hooks do): a collective submitted
    from the completing thread is therefore finished there and then, or it would wait for the
    thread that is waiting for it."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None

    def submit(
        self, handle, finish: Callable, now: bool = False, names=None, turns=()
    ) -> "_Pending":
        """now: the caller waits at once (torch's asyncOp=False), so the collective is completed
        here, right after its submission (the core's caller then runs a small one itself, Note
        [Caller drives]): handing it to the thread too would wake that thread for nothing, and a
        wake-up between threads costs more than a 4 KiB collective on this VM. No other thread
        has seen such a pending, so it needs no lock. names, turns: the _Names the collective's
        names came from and its turns there, given back if it fails (_Names.failed)."""
        pending = _Pending(handle, finish)
        if turns:
            pending.turns = (names, turns)
        if now:
            pending.taken = True
            pending.result = _outcome(pending)
            return pending
        if threading.current_thread() is self._thread:
            self.complete(pending)
            return pending
        self._queue.put(pending)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="scaleout-torch-futures", daemon=True
                    )
                    self._thread.start()
        return pending

    def complete(self, pending: "_Pending") -> None:
        """Completes `pending` on this thread unless another thread has taken it."""
        with self._lock:
            if pending.taken:
                return
            pending.taken = True
        result = _outcome(pending)
        with self._lock:
            pending.result = result
            future = pending.future
        if future is not None:
            future.set_result(result)

    def future_of(self, pending: "_Pending") -> torch.futures.Future:
        """`pending`'s torch future, made when first asked (most collectives are waited for
        and need none: a future and its then() cost more than the collective at 4 KiB)."""
        with self._lock:
            future, made = pending.future, False
            if future is None:
                future = pending.future = torch.futures.Future()
                made = True
            result = pending.result
        if made and result is not _UNSET:
            future.set_result(result)
        return future

    def settle(self, pending: "_Pending") -> None:
        """Returns once `pending` is complete. The completing thread completes it here (it is
        later in the queue than the work this thread is on); another thread waits for it, so
        that its callbacks do not run inside that thread's collective call."""
        if threading.current_thread() is self._thread:
            self.complete(pending)
        if pending.result is _UNSET:
            self.future_of(pending).wait()

    def _run(self) -> None:
        while True:
            self.complete(self._queue.get())


_UNSET = object()


def _outcome(pending: "_Pending"):
    """What `pending` gives torch: its finish's result once its handle is done, or the error."""
    try:
        h = pending.handle
        return pending.finish(_wait(h) if h is not None else None)
    except Exception as exc:  # noqa: BLE001  (handed to whoever waits on the future)
        if pending.turns is not None and isinstance(exc, scaleout.ScaleoutError):
            names, turns = pending.turns
            names.failed(turns, exc)
        # The exception as the value: see _Work for how it reaches Python and C++ waiters.
        return _backend_error(exc)


class _Later:
    """A collective whose name is busy (its last user on this rank may be in flight): submitted
    by whoever first waits for it, once that one is complete (_Names). `start(name)` submits it
    and returns its handle."""

    __slots__ = ("start", "name", "before", "handle")

    def __init__(self, start: Callable, name: str, before: "_Pending"):
        self.start, self.name, self.before, self.handle = start, name, before, None

    def submitted(self):
        if self.handle is None:
            _COMPLETER.settle(self.before)
            self.before = None
            self.handle = self.start(self.name)
        return self.handle


def _wait(h):
    """synchronize(h) for a core handle or a _Later."""
    return synchronize(h.submitted() if type(h) is _Later else h)


def _wait_all(handles) -> list:
    """Every handle's result, once all are done (so that none is left in flight when one
    failed); raises the first error."""
    return wait_all([h.submitted() if type(h) is _Later else h for h in handles])


class _Pending:
    """A collective's core handle (or None: `finish` waits for its own), what makes torch's
    result of it, the result once made (or the exception), and the futures asked of it."""

    __slots__ = ("handle", "finish", "taken", "result", "future", "child", "turns", "__weakref__")

    def __init__(self, handle, finish: Callable):
        self.handle, self.finish = handle, finish
        self.taken = False
        self.result = _UNSET
        self.future = self.child = self.turns = None

    @classmethod
    def done(cls, result) -> "_Pending":
        pending = cls(None, None)
        pending.taken, pending.result = True, result
        return pending


_COMPLETER = _Completer()


_BACKEND_ERRORS: dict = {}


def _backend_error(exc: Exception) -> Exception:
    """A core error as torch's DistBackendError too, which torch's backends raise when a
    collective fails (a dead peer, a mismatch between ranks): the same type (ShutDownError, ...),
    message and details, also an instance of dist.DistBackendError."""
    if not isinstance(exc, scaleout.ScaleoutError) or isinstance(exc, dist.DistBackendError):
        return exc
    kind = type(exc)
    both = _BACKEND_ERRORS.get(kind)
    if both is None:
        # The same name, in a module of its own: pickle (torch's futures pickle a failed
        # value to find its tensors) finds the class again there.
        both = type(kind.__name__, (kind, dist.DistBackendError), {"__module__": _errors.__name__})
        setattr(_errors, kind.__name__, both)
        _BACKEND_ERRORS[kind] = both
    wrapped = both(*exc.args)
    wrapped.__dict__.update(exc.__dict__)
    wrapped.__cause__ = exc.__cause__
    return wrapped.with_traceback(exc.__traceback__)


class _Work(dist.Work):
    """A collective's torch Work over what the completer makes of it: the result or, when the
    collective failed, the exception. Two ways out, because an error must reach both kinds of
    waiter:
    - wait() (dist.all_reduce and friends, from Python) raises that exception itself: a Work
      that torch makes from a future (_create_work_from_future) returns True from wait() even
      when the future failed, so a synchronous all_reduce after a peer died returned with the
      tensor unreduced (torch 2.13);
    - get_future() (DDP's comm hooks, from C++) is `future.then(...)`, whose callback raises the
      exception: torch turns an error raised in a callback into a C++ error of the child future,
      which DDP's reducer rethrows from backward() as a RuntimeError with its message. A Python
      future's set_exception is only a value to C++: the reducer read it as tensors and crashed
      (a segmentation fault, torch 2.13)."""

    def __init__(self, pending: "_Pending"):
        super().__init__()
        self._pending = pending

    def _result(self):
        result = self._pending.result
        if result is _UNSET:
            result = _COMPLETER.future_of(self._pending).wait()
        return result

    def wait(self, timeout=None) -> bool:
        result = self._pending.result  # set once: a synchronous call's is set already
        if result is _UNSET:
            _COMPLETER.complete(self._pending)  # here and now, unless the completer has it
            result = self._result()
        if isinstance(result, BaseException):
            raise result
        return True

    def get_future(self) -> torch.futures.Future:
        if self._pending.child is None:
            self._pending.child = _COMPLETER.future_of(self._pending).then(_value_or_raise)
        return self._pending.child

    def is_completed(self) -> bool:
        return self._pending.result is not _UNSET

    def is_success(self) -> bool:
        return self.is_completed() and not isinstance(self._pending.result, BaseException)

    def exception(self):
        result = self._pending.result
        return result if isinstance(result, BaseException) else None


# A signature's names (Note [torch.distributed backend]): this many, taken in turn.
_WINDOW = 8
# Signatures a group remembers; past that it forgets them all, at the same call on every rank.
_MOST_SIGNATURES = 1024


class _Names:
    """The names of a process group's collectives: the k-th call of a signature (the
    collective and what the core compares: dtype, shape, op, root) runs as
    "torch.<group>.<collective>.<signature>.<k mod _WINDOW>", so a name comes round again and
    the core's response cache (and its fast lane) serve it; collectives the core does not cache
    get a name of their own. A name whose last user on this rank may still be in flight (the
    core refuses a name in flight twice) is busy: the process group then submits the new
    collective later (_Later), never blocking the call that issues it.

    The ranks' turns stay in step as long as every call of a signature either runs everywhere
    or fails everywhere (an error of the core: a mismatch, a deadlock, a dead peer): a failed
    call gives its turn back, so the next call of its signature has the name it would have had.
    A failed async call whose signature was called again meanwhile cannot: then the group is
    out of step, and every later call raises."""

    def __init__(self, prefix: str):
        self._prefix = prefix
        self._count = itertools.count()
        self._turns: dict = {}  # signature -> [its names, calls of it so far]
        self._last: dict = {}  # name -> weak reference to the async _Pending that used it last
        self._out_of_step: Optional[str] = None  # why the ranks' names may no longer match

    def one_off(self, collective: str) -> str:
        self._check()
        return f"{self._prefix}.{next(self._count)}.{collective}"

    def take(self, signature: tuple) -> tuple:
        """signature: (the collective, what the core compares...). The name and the turn."""
        if self._out_of_step is not None:
            self._check()
        turn = self._turns.get(signature)
        if turn is None:
            if len(self._turns) >= _MOST_SIGNATURES:  # the same call on every rank
                self._turns.clear()
                self._last = {k: r for k, r in self._last.items() if r() is not None}
            base = f"{self._prefix}.{signature[0]}.{_label(signature[1:])}"
            turn = self._turns[signature] = [[f"{base}.{k}" for k in range(_WINDOW)], 0]
        names, k = turn
        turn[1] = k + 1
        return names[k % _WINDOW], (signature, k)

    def busy(self, name: str) -> Optional["_Pending"]:
        """The async collective that used `name` last on this rank, while it may be in flight."""
        ref = self._last.get(name)
        if ref is None:
            return None
        before = ref()
        return before if before is not None and before.result is _UNSET else None

    def used(self, names, pending: "_Pending") -> None:
        """Names that `pending`, an async collective, runs under."""
        ref = weakref.ref(pending)
        for name in names:
            self._last[name] = ref

    def failed(self, turns, error: Exception) -> None:
        """The collectives of `turns` failed with a core error: each gives its turn back, or,
        where a later call of its signature has been made, leaves the group out of step."""
        for signature, k in reversed(turns):
            turn = self._turns.get(signature)
            if turn is not None and turn[1] == k + 1:
                turn[1] = k
            elif self._out_of_step is None:
                self._out_of_step = (
                    f"an async collective failed ({type(error).__name__}: {error}) after later "
                    "collectives of its kind were issued"
                )

    def _check(self) -> None:
        if self._out_of_step is not None:
            raise _backend_error(
                scaleout.MismatchError(
                    f"process group '{self._prefix}': {self._out_of_step}, so this rank's "
                    "collectives can no longer be matched with the other ranks'; destroy the "
                    "group (or restart the job) and make a new one"
                )
            )


def _label(signature: tuple) -> str:
    """A signature as a readable part of a name: float32.64x16.Sum (a factor other than 1 as
    times0.5)."""
    parts = []
    for v in signature:
        if isinstance(v, torch.dtype):
            parts.append(str(v).removeprefix("torch."))
        elif isinstance(v, torch.Size):
            parts.append("x".join(map(str, v)) or "scalar")
        elif isinstance(v, float):  # a prescale factor (PREMUL_SUM's)
            if v != 1.0:
                parts.append(f"times{v:g}")
        elif v is not None:  # None: a part left out (all_gather's shape)
            parts.append(str(v))
    return ".".join(parts)


# What a synchronous all_reduce of one tensor that succeeded returns (_allreduce_now): torch
# only waits for it (dist.all_reduce gives the user None), and making a Work costs more than a
# third of a 4 KiB allreduce; its future's value, if anyone asks, is an empty list.
_DONE = _Work(_Pending.done([]))


def _value_or_raise(done: torch.futures.Future):
    value = done.value()
    if isinstance(value, BaseException):
        raise value
    return value


def _all_of(handles, tensors) -> Callable:
    """A finish that waits for every in-place handle and gives torch its tensors."""

    def finish(_):
        _wait_all(handles)
        return tensors

    return finish


def _allreduce_(name: str, tensor: torch.Tensor, op: int, prescale: float, ps: int):
    """An in-place allreduce whose handle someone waits for soon: the caller of a synchronous
    dist.all_reduce (_Work.wait), else the completer's thread. So the core may run a small one
    on that thread instead of waking its own (Note [Caller drives]). The tensor's autograd
    version stays as it was, as torch's own backends leave it (scaleout.torch's allreduce_
    bumps it): a contiguous tensor goes straight to the binding, in submit's argument order."""
    try:
        return submit(
            ALLREDUCE, torch_name("allreduce", name), tensor, None, None, None, tensor, None, op,
            0, prescale, 1.0, None, None, ps, True, 0,
        )  # fmt: skip
    except BufferError:  # not contiguous, or not a dtype the core has: explained or copied
        return _tensors.submit_into(
            ALLREDUCE, tensor, name, True, op, 0, prescale, 1.0, "allreduce", ps, waits=True
        )


def _copied_into(outputs, handles) -> Callable:
    """A finish that copies each handle's result into its output tensor, in its shape."""

    def finish(_):
        for out, result in zip(outputs, _wait_all(handles)):
            out.copy_(result.reshape(out.shape))
        return outputs

    return finish


def _cpu(tensors: List[torch.Tensor], what: str) -> None:
    for t in tensors:
        if not t.is_cpu:
            raise ValueError(
                f"{what}: the scaleout backend takes CPU tensors; got one on {t.device} "
                "(GPU tensors are not supported yet)"
            )


def _not_yet(what: str):
    raise NotImplementedError(
        f"{what} is not supported by the scaleout torch.distributed backend yet "
        "(docs/torch-distributed.md lists what is)"
    )


class ScaleoutProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of a scaleout process set (Note [torch.distributed backend]):
    the global set, or for a group of some ranks the set its members made. Its rank and size
    are the group's; roots given to the core are the job's ranks (`_ranks`)."""

    def __init__(
        self,
        rank: int,
        size: int,
        group_name: str,
        process_set=global_process_set,
        timeout: Optional[float] = None,
    ):
        super().__init__(rank, size)
        self._timeout = timeout  # send/recv's bound (the group's timeout)
        self._names = _Names(f"torch.{group_name or 'world'}")
        self._set = process_set
        self._ranks = process_set.ranks or list(range(size))

    def getBackendName(self) -> str:
        return NAME

    # torch names each group after creating it; DeviceMesh (FSDP2) reads the name back.
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def _names_of(self, collective: str, tensors, *signature, by_shape: bool = True) -> tuple:
        """One name per tensor (each's dtype, and shape unless not `by_shape`, in its signature)
        and the turns taken (_Names), or names of their own when a call has more than _WINDOW
        tensors of one signature."""
        taken = [
            self._names.take((collective, t.dtype, t.shape if by_shape else None) + signature)
            for t in tensors
        ]
        names = [name for name, _ in taken]
        if len(names) > _WINDOW and len(set(names)) < len(names):
            return [self._names.one_off(collective) for _ in tensors], ()
        return names, [turn for _, turn in taken]

    def _start(self, name: str, submit_as: Callable, *args):
        """submit_as(name, *args): the collective's core handle, or a _Later while the name is
        busy (_Names.busy)."""
        before = self._names.busy(name)
        if before is None:
            return submit_as(name, *args)
        return _Later(lambda later: submit_as(later, *args), name, before)

    def _work(self, handle, finish: Callable, opts=None, names=(), turns=()):
        """opts: the collective's torch options; asyncOp=False (a synchronous dist.all_reduce
        and the like, which wait() at once) completes it on this thread before returning (options
        without asyncOp, in older torch: every call goes to the completer). names, turns: what
        the collective runs under, remembered while it may be in flight, and its turns, given
        back if it fails (_Names)."""
        now = opts is not None and not getattr(opts, "asyncOp", True)
        pending = _COMPLETER.submit(handle, finish, now, self._names, turns)
        if names and not now:
            self._names.used(names, pending)
        return _Work(pending)

    def allreduce(self, tensors, opts):
        if len(tensors) == 1 and not getattr(opts, "asyncOp", True):
            return self._allreduce_now(tensors[0], opts)
        _cpu(tensors, "all_reduce")
        op, pre = _core_op(opts.reduceOp, "all_reduce")
        ps = self._set.process_set_id
        names, turns = self._names_of("allreduce", tensors, OP_NAMES[op], pre)
        handles = [
            self._start(name, _allreduce_, t, op, pre, ps) for t, name in zip(tensors, names)
        ]
        return self._work(None, _all_of(handles, tensors), opts, names, turns)

    def _allreduce_now(self, tensor, opts):
        """A synchronous all_reduce of one tensor (`dist.all_reduce(t)`), whose cost at small
        sizes is mostly this Python: done here and now, with no future, list or closure."""
        if not tensor.is_cpu:
            _cpu([tensor], "all_reduce")
        kind = opts.reduceOp
        if kind == _SUM:  # the common case, tested the cheapest way
            op, pre = Sum, 1.0
        else:
            op, pre = _core_op(kind, "all_reduce")
        names = self._names
        name, turn = names.take(("allreduce", tensor.dtype, tensor.shape, OP_NAMES[op], pre))
        try:
            before = names.busy(name)
            if before is not None:
                _COMPLETER.settle(before)
            # The binding's synchronous allreduce (Note [Synchronous allreduce_]), which offers
            # it to the core's fast lane first; NotImplemented where it does not apply (a group
            # of some ranks, a tensor the binding cannot take as it is).
            done = allreduce_now(
                tensor, None, torch_name("allreduce", name), op, pre, 1.0, self._set
            )
            if done is NotImplemented:
                synchronize(_allreduce_(name, tensor, op, pre, self._set.process_set_id))
        except Exception as exc:  # noqa: BLE001  (raised by wait(), as _outcome's)
            if isinstance(exc, scaleout.ScaleoutError):
                names.failed((turn,), exc)
            return _Work(_Pending.done(_backend_error(exc)))
        return _DONE

    # torch's functional collectives (torch.distributed._functional_collectives: what a
    # DTensor's full_tensor() and redistribute() run) call the coalesced forms; torch's Python
    # process groups take those under their older names too (allgather_into_tensor_coalesced,
    # reduce_scatter_tensor_coalesced), so both are given. Without them torch looks for a C++
    # backend of the group, which a Python process group has not.
    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        _cpu(inputs, "all_gather_into_tensor")
        names, turns = self._names_of("allgather", inputs)
        handles = [self._start(name, self._gather_rows, t) for t, name in zip(inputs, names)]
        return self._work(None, _copied_into(outputs, handles), opts, names, turns)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        _cpu(inputs, "reduce_scatter_tensor")
        op, pre = _core_op(opts.reduceOp, "reduce_scatter_tensor")
        names, turns = self._names_of("reducescatter", inputs, OP_NAMES[op], pre)
        handles = [
            self._start(name, self._reduce_scatter_rows, t, op, pre)
            for t, name in zip(inputs, names)
        ]
        return self._work(None, _copied_into(outputs, handles), opts, names, turns)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce(self, tensors, opts):
        # The reduction lands in the root's tensors; the others' stay as they were (an
        # allreduce into copies there: every rank takes part in the core's collective).
        _cpu(tensors, "reduce")
        op, pre = _core_op(opts.reduceOp, "reduce")
        root, ps = self.rank() == opts.rootRank, self._set.process_set_id
        names, turns = self._names_of("reduce", tensors, OP_NAMES[op], pre)
        handles = [
            self._start(name, _allreduce_, t if root else t.clone(), op, pre, ps)
            for t, name in zip(tensors, names)
        ]
        return self._work(None, _all_of(handles, tensors), opts, names, turns)

    def broadcast(self, tensors, opts):
        _cpu(tensors, "broadcast")
        root = self._ranks[opts.rootRank]  # the job's rank, as the core takes it
        names, turns = self._names_of("broadcast", tensors, f"from{root}")
        handles = [self._start(name, self._broadcast, t, root) for t, name in zip(tensors, names)]
        return self._work(None, _all_of(handles, tensors), opts, names, turns)

    def allgather(self, output_tensors, input_tensors, opts):
        _cpu(input_tensors, "all_gather")
        # Each rank's part may have a size of its own: only the dtype is in the signature.
        names, turns = self._names_of("allgather", input_tensors, by_shape=False)
        handles = [self._start(name, self._gather_flat, t) for t, name in zip(input_tensors, names)]

        def finish(_):
            for outs, gathered in zip(output_tensors, _wait_all(handles)):
                # Each rank's part is as large as its output tensor (they may differ).
                parts = gathered.split([out.numel() for out in outs])
                for out, part in zip(outs, parts):
                    out.copy_(part.reshape(out.shape))
            return output_tensors

        return self._work(None, finish, opts, names, turns)

    def _allgather_base(self, output, input, opts):
        _cpu([input], "all_gather_into_tensor")
        names, turns = self._names_of("allgather", [input])
        handle = self._start(names[0], self._gather_rows, input)

        def finish(gathered):
            output.copy_(gathered.reshape(output.shape))
            return [output]

        return self._work(handle, finish, opts, names, turns)

    all_gather_single = _allgather_base

    def _reduce_scatter_base(self, output, input, opts):
        _cpu([input], "reduce_scatter_tensor")
        op, pre = _core_op(opts.reduceOp, "reduce_scatter_tensor")
        names, turns = self._names_of("reducescatter", [input], OP_NAMES[op], pre)
        handle = self._start(names[0], self._reduce_scatter_rows, input, op, pre)

        def finish(mine):
            output.copy_(mine.reshape(output.shape))
            return [output]

        return self._work(handle, finish, opts, names, turns)

    reduce_scatter_single = _reduce_scatter_base

    # What _start submits, each given the collective's name first.
    def _broadcast(self, name: str, tensor, root: int):
        return so.broadcast_async_(tensor, root, name=name, process_set=self._set)

    def _gather_flat(self, name: str, tensor):
        """all_gather's allgather: each rank's tensor flat (their sizes may differ)."""
        return so.allgather_async(tensor.reshape(-1), name=name, process_set=self._set)

    def _gather_rows(self, name: str, tensor):
        """The allgather of all_gather_into_tensor and gather: each rank's tensor as one row."""
        return so.allgather_async(tensor.reshape(1, -1), name=name, process_set=self._set)

    def _reduce_scatter_rows(self, name: str, tensor, op: int, prescale: float):
        """The reducescatter of reduce_scatter_tensor: rank k gets the k-th of size() rows."""
        return so.reducescatter_async(
            tensor.reshape(self.size(), -1),
            name=name,
            op=op,
            prescale_factor=prescale,
            process_set=self._set,
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        _cpu([input], "all_to_all_single")
        size = self.size()
        rows = input.shape[0] if input.dim() > 0 else 0
        splits = list(input_split_sizes) or [rows // size] * size
        handle = so.alltoall_async(
            input, splits=splits, name=self._names.one_off("alltoall"), process_set=self._set
        )

        expected = list(output_split_sizes)

        def finish(result):
            received, counts = result
            if expected and counts.tolist() != expected:
                raise ValueError(
                    f"all_to_all_single: output_split_sizes={expected}, but the ranks sent "
                    f"{counts.tolist()}"
                )
            output.copy_(received.reshape(output.shape))
            return [output]

        return self._work(handle, finish, opts)

    def barrier(self, opts):
        so.barrier(process_set=self._set)  # synchronous in the core: done when it returns
        return self._work(None, lambda _: [], opts)

    def send(self, tensors, dst, tag):
        _cpu(tensors, "send")
        return self._work(None, _p2p.start_send(tensors, self._ranks[dst], tag, self._timeout))

    def recv(self, tensors, src, tag):
        _cpu(tensors, "recv")
        return self._work(None, _p2p.start_recv(tensors, self._ranks[src], tag, self._timeout))

    def recv_anysource(self, tensors, tag):
        _not_yet("recv from any source (recv without src)")

    def gather(self, output_tensors, input_tensors, opts):
        # An allgather whose result only the root keeps (torch gives the others no outputs).
        _cpu(input_tensors, "gather")
        root = self.rank() == opts.rootRank
        names, turns = self._names_of("gather", input_tensors)
        handles = [self._start(name, self._gather_rows, t) for t, name in zip(input_tensors, names)]

        def finish(_):
            for i, rows in enumerate(_wait_all(handles)):
                if root:
                    for out, row in zip(output_tensors[i], rows):
                        out.copy_(row.reshape(out.shape))
            return output_tensors

        return self._work(None, finish, opts, names, turns)

    def scatter(self, output_tensors, input_tensors, opts):
        # An alltoall in which only the root sends: part i of its list to rank i.
        _cpu(output_tensors, "scatter")
        size, root = self.size(), opts.rootRank
        handles = []
        for i, out in enumerate(output_tensors):
            if self.rank() == root:
                parts = input_tensors[i]
                send = torch.cat([p.reshape(-1).to(out.dtype) for p in parts])
                splits = [p.numel() for p in parts]
            else:
                send, splits = out.new_empty(0), [0] * size
            handles.append(
                so.alltoall_async(
                    send, splits=splits, name=self._names.one_off("scatter"), process_set=self._set
                )
            )

        def finish(_):
            for out, (received, _counts) in zip(output_tensors, _wait_all(handles)):
                out.copy_(received.reshape(out.shape))
            return output_tensors

        return self._work(None, finish, opts)


def _create(options, _backend_options):
    """torch's creator for the backend (extended API: it names the group's global ranks)."""
    if not scaleout.is_initialized():
        if _pmi_bootstrap.wanted(os.environ, options.group_size) and (
            not _pmi_bootstrap.bootstrapped()
        ):
            # torchrun, Ray or hand-started ranks: MPI joins them through torch's store.
            _pmi_bootstrap.bootstrap(options.store, options.group_rank, options.group_size)
        scaleout.init()
    size, rank = scaleout.size(), scaleout.rank()
    ranks = list(options.global_ranks_in_group or range(options.group_size))
    if dist.is_initialized() and ranks != list(range(size)):
        # new_group(ranks=...), called by the group's ranks only: the set its members make.
        if ranks != sorted(ranks):
            _not_yet(f"a group whose ranks are not in increasing order ({ranks})")
        process_set = member_process_set(ranks)
        return ScaleoutProcessGroup(
            options.group_rank, options.group_size, options.group_id, process_set, _timeout(options)
        )
    if options.group_size != size or ranks != list(range(size)):
        raise ValueError(
            f"init_process_group(backend='scaleout'): world_size={options.group_size}, but the "
            f"job that scaleout runs in has {size} ranks: give the launcher's size, or none"
        )
    if options.group_rank != rank:
        raise ValueError(
            f"init_process_group(backend='scaleout'): rank={options.group_rank}, but this "
            f"process is rank {rank} of the job: give the launcher's rank, or none"
        )
    _p2p.prepare()
    return ScaleoutProcessGroup(rank, size, options.group_id, timeout=_timeout(options))


def _timeout(options) -> Optional[float]:
    timeout = getattr(options, "timeout", None)
    return timeout.total_seconds() if timeout is not None else None


# torch's env:// variables, which scaleoutrun gives every rank under SCALEOUT_TORCH_* names
# (launcher/plan.py, launcher/rank_env.py): the job's own, so they replace any set; an address
# or port the user set wins.
_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_STORE_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")


def _torch_environment() -> None:
    for name in _JOB_VARIABLES:
        value = os.environ.get("SCALEOUT_TORCH_" + name)
        if value:
            os.environ[name] = value
    for name in _STORE_VARIABLES:
        value = os.environ.get("SCALEOUT_TORCH_" + name)
        if value and not os.environ.get(name):
            os.environ[name] = value


def register() -> None:
    _torch_environment()
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
