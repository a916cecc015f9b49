"""Run by tests/test_autotune.py::test_autotune_tries_settings_then_keeps_the_best and
tests/test_autotune.py::test_bad_autotune_settings_fail_init_on_every_rank.

argv[1] "train": steps of four named allreduces (as a training step's gradients) while rank 0
tunes (the test sets HOROVOD_AUTOTUNE and a short sample); every step's sums are checked on
every rank, whatever the settings of the moment. "bad": init must fail on every rank with the
message argv[2]."""

import sys

import numpy as np
from _harness import RANK, check, check_close, expect_error, finish

import scaleout as so

SIZES = {"fc2.weight": 50_000, "fc2.bias": 10, "fc1.weight": 400_000, "fc1.bias": 1000}


def train(steps: int) -> None:
    so.init()
    size = so.size()
    for step in range(steps):
        grads = {
            name: np.full(n, (so.rank() + 1) * (step + 1), np.float32) for name, n in SIZES.items()
        }
        handles = [so.allreduce_async_(g, name=name, op=so.Sum) for name, g in grads.items()]
        for h in handles:
            so.synchronize(h)
        want = (step + 1) * size * (size + 1) / 2
        for name, g in grads.items():
            check_close(g, np.full(g.shape, want, np.float32), f"step {step}: {name}")
    check(so.config()["SCALEOUT_AUTOTUNE"] == "1", "config() shows autotuning on")
    so.shutdown()


def bad(message: str) -> None:
    expect_error(ValueError, so.init, message, what=f"rank {RANK}: init")


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(int(sys.argv[2]))
    else:
        bad(sys.argv[2])
    finish()
