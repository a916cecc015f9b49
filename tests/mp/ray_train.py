"""Run by tests/test_ray.py::test_torch_trainer_trains_over_the_backend (and
tests/test_ray.py::test_torch_trainer_across_two_ray_nodes, with argv[4] "spread").

Ray Train's TorchTrainer with `TorchConfig(backend="scaleout")` on the Ray cluster at argv[2]
(argv[1]: the number of workers; argv[3]: Ray Train's storage folder; argv[4] "spread": each
worker on a Ray node of its own, STRICT_SPREAD, and checked to be on hosts apart).
Ray's workers call init_process_group("scaleout") themselves, with nothing of scaleout imported:
the backend's name comes from torch's entry point (scaleout/_torch_plugin.py), and the ranks join
through torch's store (Note [PMI bootstrap]). Each worker trains DDP (float64, SGD with momentum,
three steps) on its rows of a global batch and reports the loss over the global batch (the
mean of the workers' losses) at each step; this script checks those against one process on the
whole batch, and that the workers ran on scaleout's core with Ray's rank and size. Prints "all
checks passed"."""

import os
import socket
import sys
import tempfile

import ray
import torch
import torch.nn as nn
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).double()


def batch(n: int):
    g = torch.Generator().manual_seed(5)
    return torch.randn(4 * n, 8, generator=g).double(), torch.randn(4 * n, 2, generator=g).double()


def three_steps(net: nn.Module, x, y, global_loss=lambda loss: loss.item()) -> list:
    """Three steps of SGD with momentum on (x, y): each step's loss, as global_loss makes it."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(global_loss(loss))
    return losses


def one_process(n: int) -> list:
    return three_steps(model(), *batch(n))


def train(config: dict) -> None:
    import ray.train
    import torch.distributed as dist

    import scaleout.torch as hvd

    ctx = ray.train.get_context()
    r, n = ctx.get_world_rank(), ctx.get_world_size()
    ddp = nn.parallel.DistributedDataParallel(model())
    x, y = batch(n)

    def global_loss(loss):  # the global batch's: the mean of the workers' equal parts
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        return mean.item()

    losses = three_steps(ddp, x[4 * r : 4 * r + 4], y[4 * r : 4 * r + 4], global_loss)
    hosts = [None] * n
    dist.all_gather_object(hosts, socket.gethostname())
    metrics = {
        "losses": losses,
        "backend": dist.get_backend(),
        "ranks": [dist.get_rank(), dist.get_world_size(), hvd.rank(), hvd.size()],
        "expected_ranks": [r, n, r, n],
        "hosts": hosts,
        "local_size": hvd.local_size(),
    }
    # Ray keeps the metrics reported with a checkpoint (rank 0's, here: the model).
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if r == 0:
            torch.save(ddp.module.state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def main() -> None:
    n, address, storage = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    spread = sys.argv[4:] == ["spread"]
    ray.init(address=address, log_to_driver=True)
    scaling = ScalingConfig(num_workers=n, use_gpu=False)
    if spread:
        scaling = ScalingConfig(num_workers=n, use_gpu=False, placement_strategy="STRICT_SPREAD")
    trainer = TorchTrainer(
        train,
        torch_config=TorchConfig(backend="scaleout"),
        scaling_config=scaling,
        run_config=RunConfig(storage_path=storage, name="scaleout"),
    )
    metrics = trainer.fit().metrics
    ray.shutdown()
    failures = []
    if metrics["backend"] != "scaleout":
        failures.append(f"backend {metrics['backend']}")
    if metrics["ranks"] != metrics["expected_ranks"]:
        failures.append(f"torch's and scaleout's rank and size: {metrics['ranks']}")
    if spread and (len(set(metrics["hosts"])) != n or metrics["local_size"] != 1):
        failures.append(
            f"workers on hosts {metrics['hosts']}, local_size {metrics['local_size']}: not "
            "one worker per host"
        )
    want = one_process(n)
    if not all(abs(a - b) <= 1e-10 * max(1.0, abs(b)) for a, b in zip(metrics["losses"], want)):
        failures.append(f"losses {metrics['losses']}, one process {want}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
    if failures:
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
