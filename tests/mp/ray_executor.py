"""Run by tests/test_ray.py::test_ray_executor_runs_horovod_style_functions (and by
tests/test_ray.py::test_ray_executor_across_two_ray_nodes, with argv[3] "spread": a cluster of
one-CPU nodes on hosts apart, so each worker has a host of its own).

scaleout.ray.RayExecutor (Horovod's) on the Ray cluster at argv[2] with argv[1] workers:
start() with an executable class, then run() of a Horovod-style function (hvd.init(), rank,
size and the machine's ranks, an allreduce of numpy and of torch, a DistributedOptimizer step
equal to one process's), execute() and execute_single() on the executable, run_remote(); a
second executor's job after shutdown(); and what it refuses (GPUs, elastic). Prints "all checks
passed"."""

import sys

import ray

from scaleout.ray import RayExecutor

failures = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr, flush=True)


class Counter:
    """An executable: state kept on each worker between calls."""

    def __init__(self, start: int):
        self.value = start

    def bump(self) -> int:
        self.value += 1
        return self.value


def horovod_style(scale: float) -> dict:
    import numpy as np
    import torch

    import scaleout
    import scaleout.torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = scaleout.allreduce(np.array([scale * (r + 1)]), op=scaleout.Sum)
    mean = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Average)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.arange(8.0 * n, dtype=torch.float64).reshape(2 * n, 4) / 10
    opt.zero_grad()
    model(x[2 * r : 2 * r + 2]).pow(2).mean().backward()
    opt.step()
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 1).double()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x).pow(2).mean().backward()
    ref_opt.step()
    same = all(
        torch.allclose(p, q, atol=1e-12) for p, q in zip(model.parameters(), ref.parameters())
    )
    return {
        "ranks": (r, n, hvd.local_rank(), hvd.local_size()),
        "sum": float(total[0]),
        "mean": mean.tolist(),
        "step_equals_one_process": same,
    }


def main() -> None:
    n = int(sys.argv[1])
    spread = sys.argv[3:] == ["spread"]  # one worker per Ray node, each node a host of its own
    ray.init(address=sys.argv[2], log_to_driver=True)
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_workers=n, cpus_per_worker=1)
    check(
        (executor.num_workers, executor.cpus_per_worker) == (n, 1), "num_workers, cpus_per_worker"
    )
    executor.start(executable_cls=Counter, executable_args=[10])
    results = executor.run(horovod_style, kwargs={"scale": 2.0})
    for r, got in enumerate(results):
        want = (r, n, 0, 1) if spread else (r, n, r, n)
        check(got["ranks"] == want, f"rank {r}: rank, size, local rank and size {got['ranks']}")
        check(got["sum"] == 2.0 * n * (n + 1) / 2, f"rank {r}: numpy allreduce {got['sum']}")
        check(got["mean"] == [(n - 1) / 2] * 3, f"rank {r}: torch allreduce {got['mean']}")
        check(got["step_equals_one_process"], f"rank {r}: a DistributedOptimizer step")
    check(executor.execute(lambda c: c.bump()) == [11] * n, "execute() on the executable")
    check(executor.execute_single(lambda c: c.bump()) == 12, "execute_single() on rank 0's")
    check(executor.execute(lambda c: c.value) == [12] + [11] * (n - 1), "state per worker")
    refs = executor.run_remote(lambda: __import__("scaleout").rank())
    check(ray.get(refs) == list(range(n)), "run_remote(): rank order")
    executor.shutdown()
    # A second job on the same cluster after the first one's workers are gone.
    again = RayExecutor(settings, num_workers=n)
    again.start()
    got = again.run(lambda: __import__("scaleout").init() or __import__("scaleout").size())
    check(got == [n] * n, f"a second executor's job: sizes {got}")
    again.shutdown()
    for kwargs, kind, words in (
        ({"num_workers": n, "use_gpu": True}, ValueError, "GPUs are not supported yet"),
        ({"min_workers": 1, "max_workers": n}, NotImplementedError, "elastic executors"),
        ({"num_workers": 0}, ValueError, "num_workers must be a positive integer"),
    ):
        try:
            RayExecutor(settings, **kwargs)
            check(False, f"RayExecutor({kwargs}) was accepted")
        except kind as e:
            check(words in str(e), f"RayExecutor({kwargs}): {e}")
    try:
        RayExecutor(settings, num_workers=n).run(horovod_style)
        check(False, "run() before start() was accepted")
    except RuntimeError as e:
        check("call start() first" in str(e), f"run() before start(): {e}")
    ray.shutdown()
    if failures:
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
