"""Run by tests/test_torch_distributed.py::test_torchrun_starts_the_ranks,
tests/test_torch_distributed.py::test_horovod_style_init_under_torchrun,
tests/test_torch_distributed.py::test_processes_given_torch_variables and
tests/test_torch_distributed.py::test_torchrun_on_other_mpis.

Ranks that no MPI launcher started (Note [PMI bootstrap]): torchrun's, or processes given torch's
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE. No test harness that imports mpi4py first (MPI
must start after the bootstrap). argv[1]:
- "ddp": init_process_group("scaleout"); rank, size and the machine's ranks are torch's; a
  collective of each kind against values every rank computes; a Horovod-style allreduce of
  scaleout.torch in the same script (one core under both); an all_reduce over a group of some
  ranks; DDP (SGD with momentum, float64,
  three steps) equal to one process on the global batch.
- "horovod": scaleout.init() alone under torchrun, then a Horovod-style allreduce.
- "refused": scaleout.init() in processes given torch's variables by hand (no store for it to
  join through) raises MPIMismatchError naming what to do, on every rank.
- "killed": DDP training in which the last rank kills itself (SIGKILL) in its third step; every
  survivor's backward must raise naming that rank within 5 s, and its next all_reduce torch's
  DistBackendError (also scaleout's ShutDownError), as must a recv from the dead rank.
Prints "all checks passed" on success.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch_common import model, train_beside_one_process

import scaleout.torch as hvd

failures = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)
        print(f"rank {os.environ.get('RANK')}: FAILED: {what}", file=sys.stderr, flush=True)


def close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-6) -> None:
    ok = got.shape == want.shape and torch.allclose(got.double(), want.double(), tol, tol)
    check(ok, f"{what}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")


def ddp_equals_one_process(r: int, n: int) -> None:
    ours, ref = model(), model()
    ddp = nn.parallel.DistributedDataParallel(ours)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    train_beside_one_process(r, n, ddp, opt, ref, ref_opt, seed=1)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), f"DDP {name}", 1e-10)


def survive_a_killed_rank(r: int, n: int) -> None:
    dist.init_process_group("scaleout")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    for step in range(100):
        start = time.monotonic()
        try:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            if step == 2 and r == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)  # dies before its gradients go out
            loss.backward()
            opt.step()
        except Exception as exc:  # noqa: BLE001
            took = time.monotonic() - start
            # DDP's reducer rethrows a failed bucket's error as a RuntimeError with its message.
            check(isinstance(exc, RuntimeError), f"{type(exc).__mro__} is no RuntimeError")
            check(f"rank {n - 1} (pid" in str(exc), f"the error names rank {n - 1}: {exc}")
            check("ShutDownError" in str(exc), f"the error is scaleout's: {exc}")
            # The next collective, from Python, raises torch's DistBackendError itself.
            try:
                dist.all_reduce(torch.ones(2))
            except dist.DistBackendError as again:
                check(isinstance(again, hvd.ShutDownError), f"not scaleout's: {again!r}")
            else:
                check(False, "all_reduce after a rank died returned")
            # A receive from the dead rank (straight over MPI) raises naming it too.
            try:
                dist.recv(torch.empty(1), n - 1)
            except dist.DistBackendError as gone:
                check(f"recv from rank {n - 1}" in str(gone), f"recv: {gone}")
                check(f"rank {n - 1} (pid" in str(gone), f"recv names the dead rank: {gone}")
            else:
                check(False, "recv from a dead rank returned")
            check(took < 5.0, f"raised {took:.1f} s into the step")
            print(f"rank {r}: raised after {took:.2f} s: {str(exc)[:200]}", flush=True)
            return
    check(False, "no step failed after the last rank died")


def main() -> None:
    mode = sys.argv[1]
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if mode == "killed":
        survive_a_killed_rank(r, n)
    elif mode == "refused":
        try:
            hvd.init()
        except hvd.MPIMismatchError as e:
            check("init_process_group" in str(e), f"the refusal says what to do: {e}")
        else:
            check(False, "scaleout.init() without a store ran as a job of one")
    elif mode == "horovod":
        hvd.init()
        check((hvd.rank(), hvd.size()) == (r, n), f"rank {hvd.rank()} of {hvd.size()}")
        t = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum)
        close(t, torch.full((3,), n * (n + 1) / 2), "Horovod-style allreduce")
    else:
        dist.init_process_group("scaleout")
        check(dist.get_backend() == "scaleout", f"backend {dist.get_backend()}")
        check((dist.get_rank(), dist.get_world_size()) == (r, n), "torch's rank and size")
        check((hvd.rank(), hvd.size()) == (r, n), f"scaleout's rank {hvd.rank()} of {hvd.size()}")
        local = os.environ.get("LOCAL_WORLD_SIZE")
        if local:  # torchrun's: this machine's ranks, which scaleout finds for itself
            check(hvd.local_size() == int(local), f"local size {hvd.local_size()} != {local}")
            check(hvd.local_rank() == int(os.environ["LOCAL_RANK"]), "local rank")
        t = torch.full((5,), float(r + 1))
        dist.all_reduce(t)
        close(t, torch.full((5,), n * (n + 1) / 2), "all_reduce SUM")
        outs = [torch.empty(2) for _ in range(n)]
        dist.all_gather(outs, torch.full((2,), float(r)))
        close(torch.stack(outs)[:, 0], torch.arange(n).double(), "all_gather")
        t = torch.full((3,), float(r))
        dist.broadcast(t, src=n - 1)
        close(t, torch.full((3,), float(n - 1)), "broadcast")
        t = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Average)
        close(t, torch.full((3,), (n - 1) / 2), "Horovod-style allreduce beside torch's")
        # A group of every rank but the first (a process set its members make).
        group = dist.new_group(list(range(1, n)))
        if r > 0:
            t = torch.full((3,), float(r))
            dist.all_reduce(t, group=group)
            close(t, torch.full((3,), (n - 1) * n / 2), "all_reduce over new_group(1..n-1)")
        ddp_equals_one_process(r, n)
        dist.destroy_process_group()
    if failures:
        print(f"rank {r}: {len(failures)} checks failed", file=sys.stderr, flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
