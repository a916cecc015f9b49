#!/usr/bin/env python
"""TensorFlow training-step time: no communication vs scaleout vs MultiWorkerMirroredStrategy.

    scaleoutrun -np 2 python benchmarks/tf_step.py          # or: mpiexec -n 2 python ...
    scaleoutrun -np 2 python benchmarks/tf_step.py --steps 20 --rounds 2     # quicker

The model is the MLP of the PyTorch benchmark (784-1024-1024-10, ReLU, float32, plain SGD),
batch 64 per rank, 1 TensorFlow thread per rank (--threads). Two kinds of step:
- custom loop: a tf.function with GradientTape and optimizer.apply_gradients;
- Keras: model.train_on_batch on a compiled model.
Three ways to run them, all in the same launch:
- no communication: every rank trains alone (the floor);
- scaleout: DistributedGradientTape (custom loop) / hvd.DistributedOptimizer (Keras);
- MWMS: tf.distribute.MultiWorkerMirroredStrategy, one worker per rank, ring collectives over
  gRPC on localhost ports (TF_CONFIG is built from the rank and size), model and optimizer
  created in its scope, the custom step run through strategy.run (the Keras optimizer sums the
  gradients over workers). Keras 3.15's own training under MWMS fails (see the table's note),
  so its Keras cell is n/a.

Method: warm-up steps first; modes take turns in rounds (order reversed every other round) so
machine noise hits them alike; a barrier before each block; every step is timed on every rank,
a step's time is the maximum over ranks, and the table reports medians (and p10/p90 with
--spread). After timing, each distributed model is checked to hold the same weights on every
rank. MultiWorkerMirroredStrategy must exist before TensorFlow runs any op, so it is created
first; it exists (idle) while the other modes run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np
from _common import free_port

import scaleout as so

perf = time.perf_counter


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
    p.add_argument("--spread", action="store_true", help="also print p10 and p90")
    p.add_argument("--no-mwms", action="store_true", help="skip MultiWorkerMirroredStrategy")
    return p.parse_args()


args = parse_args()
so.init()
RANK, SIZE = so.rank(), so.size()
if not args.no_mwms:
    # Every rank picks its own free port; TF_CONFIG must be set before TensorFlow starts.
    ports = so.allgather_object(free_port())
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"localhost:{p}" for p in ports]},
            "task": {"type": "worker", "index": RANK},
        }
    )
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)
tf.get_logger().setLevel("ERROR")
strategy = None
if not args.no_mwms:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    )

import keras  # noqa: E402

import scaleout.tensorflow as hvd  # noqa: E402
import scaleout.tensorflow.keras as hvd_keras  # noqa: E402

B = args.batch_size
rng = np.random.default_rng(RANK)
X = rng.normal(size=(B, 784)).astype(np.float32)
Y = rng.integers(0, 10, B).astype(np.int32)
x_t, y_t = tf.constant(X), tf.constant(Y)


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def steps_of(step):
    """A block of `steps` calls of `step`: returns the time of each."""

    def run(steps):
        times = np.empty(steps)
        for i in range(steps):
            t0 = perf()
            step()
            times[i] = perf() - t0
        return times

    return run


def custom_step(distributed: bool):
    model, optimizer = mlp(), keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, steps_of(lambda: step(x_t, y_t))


def keras_step(distributed: bool):
    model = mlp()
    optimizer = keras.optimizers.SGD(0.01)
    if distributed:
        optimizer = hvd_keras.DistributedOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model, steps_of(lambda: model.train_on_batch(X, Y))


def mwms_custom_step():
    with strategy.scope():
        model, optimizer = mlp(), keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=B * SIZE)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # sums over workers
            return loss

        return strategy.run(replica_step, args=(x, y))

    return model, steps_of(lambda: step(x_t, y_t))


modes = {  # (kind, way) -> (model, step function, trained together with the other ranks)
    ("custom loop", "none"): (*custom_step(False), False),
    ("custom loop", "scaleout"): (*custom_step(True), True),
    ("Keras train_on_batch", "none"): (*keras_step(False), False),
    ("Keras train_on_batch", "scaleout"): (*keras_step(True), True),
}
if strategy is not None:
    modes[("custom loop", "mwms")] = (*mwms_custom_step(), True)

for _model, run_steps, _ in modes.values():
    run_steps(args.warmup)
# Distributed models start from the same weights (mlp() is seeded), but make sure.
for key, (model, _, together) in modes.items():
    if together and key[1] == "scaleout":
        hvd.broadcast_variables(model.weights, root_rank=0)

times = {key: [] for key in modes}
order = list(modes)
for rnd in range(args.rounds):
    for key in order if rnd % 2 == 0 else order[::-1]:
        so.barrier()
        times[key].append(modes[key][1](args.steps))

worst = {
    key: so.allreduce(np.concatenate(blocks), op=so.Max, name=f"times.{'.'.join(key)}")
    for key, blocks in times.items()
}

in_sync = {}
for key, (model, _, together) in modes.items():
    if together:
        digest = [float(np.sum(w, dtype=np.float64)) for w in model.get_weights()]
        everyone = so.allgather_object(digest, name=f"sync.{'.'.join(key)}")
        in_sync[key] = all(d == everyone[0] for d in everyone)

if RANK == 0:

    def ms(values, q):
        return f"{np.percentile(values, q) * 1e3:.1f} ms"

    print(
        f"# benchmarks/tf_step.py  {datetime.datetime.now():%Y-%m-%d %H:%M}  "
        f"host {platform.node()}  nproc {os.cpu_count()}"
    )
    print(
        f"# TensorFlow {tf.__version__}, Keras {keras.__version__}, scaleout {so.__version__}, "
        f"{SIZE} ranks, {args.threads} TF thread(s) per rank"
    )
    print(
        f"# MLP 784-1024-1024-10 float32, SGD, batch {B} per rank; median step time "
        f"(max over ranks), {args.rounds} rounds x {args.steps} steps per mode"
    )
    ways = [("none", "no communication"), ("scaleout", "scaleout")]
    if strategy is not None:
        ways.append(("mwms", "MultiWorkerMirroredStrategy"))
    print()
    print("| step | " + " | ".join(title for _, title in ways) + " |")
    print("|---|" + "---|" * len(ways))
    for kind in ("custom loop", "Keras train_on_batch"):
        base = np.median(worst[(kind, "none")])
        cells = []
        for way, _ in ways:
            if (kind, way) not in worst:
                cells.append("n/a (*)")
                continue
            values = worst[(kind, way)]
            cell = ms(values, 50)
            if way != "none":
                cell += f" ({np.median(values) / base:.2f}x)"
            if args.spread:
                cell += f" [p10 {ms(values, 10)}, p90 {ms(values, 90)}]"
            cells.append(cell)
        print(f"| {kind} | " + " | ".join(cells) + " |")
    if strategy is not None:
        print(
            "\n(*) Keras 3.15 cannot train under MultiWorkerMirroredStrategy here: "
            "train_on_batch fails in\n    reduce_per_replica ('Invalid reduction dimension 0 "
            "for input with 0 dimensions') and fit\n    in _maybe_symbolic_build "
            "(strategy.reduce of the first batch: 'unsupported type PerReplica')."
        )
    print()
    print(
        "weights identical on every rank after training: "
        + ", ".join(
            f"{kind} / {way}: {'yes' if ok else 'NO'}" for (kind, way), ok in in_sync.items()
        )
    )
    sys.stdout.flush()
