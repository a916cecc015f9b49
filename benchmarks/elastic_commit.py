#!/usr/bin/env python
"""What an elastic commit costs (Note [Commit store]): a 100 MB torch model's state serialized
and committed to every host's store, and a whole `hvd.elastic.TorchState.commit()`, beside the
checkpoint users write today (rank 0's torch.save to a file), in one run.

    scaleoutrun -np 2 python benchmarks/elastic_commit.py [--mb 100] [--iters 10]

Phases, each the slowest rank's time with a barrier before, medians over --iters:
  serialize   the model's state dict as a commit's pieces (Note [Commit format]: pickle with
              the tensors' bytes out of band, not copied)
  commit      every host's first rank writes the bytes to its store (/dev/shm), the ranks agree
              that every host wrote, each host marks it complete
  state.commit  TorchState(model, SGD optimizer).commit() as a training loop calls it: the
              saved copy (a deep copy of the state dicts), serialize, commit, and the check for
              host changes
  restore     the newest complete commit found, read and sent from a host holding it to every
              rank, unpacked and loaded into the model
  baseline    rank 0 torch.save(model.state_dict(), file) into the temporary directory
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import scaleout.torch as hvd
from scaleout._commit_protocol import commit, newest_commit
from scaleout._commit_store import CommitStore
from scaleout._elastic_protocol import job_directory
from scaleout._elastic_state import pack, unpack
from scaleout.torch._elastic_state import _reduce_tensor


def timed(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        hvd.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    worst = hvd.allreduce(
        torch.tensor(times, dtype=torch.float64),
        op=hvd.Max,
        name=f"elastic_commit.times.{fn.__name__}",
    )
    return statistics.median(worst.tolist())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    width = 2048
    layers = max(1, round(args.mb * 2**20 / (4 * (width * width + width))))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    job = f"bench-{os.getpid() if hvd.rank() == 0 else 0}"
    job = hvd.broadcast_object(job, root_rank=0)
    store = CommitStore(job_directory(job, {})) if hvd.local_rank() == 0 else None
    counter = iter(range(10**9))
    state = {}

    def serialize():
        state["bytes"] = pack(model.state_dict(), _reduce_tensor)

    def commit_state():
        commit(store, next(counter), state["bytes"])

    def restore():
        _, payload = newest_commit(store)
        model.load_state_dict(unpack(payload))

    elastic_state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state_store = CommitStore(store.directory / "state") if store is not None else None
    elastic_state.attach_store(state_store)

    def state_commit():
        elastic_state.commit()

    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "checkpoint.pt"

        def baseline():
            if hvd.rank() == 0:
                torch.save(model.state_dict(), target)

        serialize()
        results = {
            name: timed(fn, args.iters)
            for name, fn in (
                ("serialize", serialize),
                ("commit", commit_state),
                ("restore", restore),
                ("state.commit", state_commit),
                ("baseline", baseline),
            )
        }
    if store is not None:
        state_store.clear()
        store.clear()
    if hvd.rank() == 0:
        print(
            f"# {nbytes / 2**20:.0f} MiB state ({layers} x Linear({width}, {width})), "
            f"{hvd.size()} ranks on {hvd.cross_size()} host(s), median of {args.iters}, "
            "slowest rank"
        )
        print("| phase | time |")
        print("|---|---:|")
        for name, seconds in results.items():
            print(f"| {name} | {seconds * 1e3:.1f} ms |")
        total = results["serialize"] + results["commit"]
        print(
            f"# commit (serialize + commit) {total * 1e3:.1f} ms = "
            f"{total / results['baseline']:.2f}x rank 0's torch.save to a file; "
            f"TorchState.commit() {results['state.commit'] * 1e3:.1f} ms = "
            f"{results['state.commit'] / results['baseline']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
