"""Data-parallel Keras training on scikit-learn's digits (8x8 images of 0-9, 1,797 samples,
shipped with scikit-learn, no download), written as a Horovod Keras script with one changed
import line.

    scaleoutrun -np 2 python examples/tensorflow2_keras_digits.py
    python examples/tensorflow2_keras_digits.py            # one process, for comparison

Every rank trains on its own shard of the training set with the same per-rank batch size; the
learning rate is scaled by the number of ranks and warmed up, and the final test accuracy (on
the whole test set) matches the one-process run.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import scaleout.tensorflow.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=1e-3, help="one process's learning rate")
parser.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
parser.add_argument("--save", default="", help="save the trained model here (rank 0)")
args = parser.parse_args()

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)
keras.utils.set_random_seed(1234 + hvd.rank())  # each rank starts elsewhere; rank 0's wins

digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int32")
x_train, x_test, y_train, y_test = train_test_split(
    x, y, test_size=0.25, random_state=0, stratify=y
)
# Each rank trains on its own shard.
x_shard, y_shard = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ]
)
# The global batch is size() times larger: scale the learning rate with it.
scaled_lr = args.lr * hvd.size()
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr))
model.compile(
    optimizer=optimizer,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)

callbacks = [
    # Rank 0's initial weights (and optimizer state) on every rank.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Report metrics averaged over ranks.
    hvd.callbacks.MetricAverageCallback(),
    # Start at the one-process learning rate and reach the scaled one after 3 epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3),
]
model.fit(
    x_shard,
    y_shard,
    batch_size=args.batch_size,
    epochs=args.epochs,
    validation_data=(x_test, y_test),
    callbacks=callbacks,
    verbose=2 if hvd.rank() == 0 else 0,
)

# Each rank evaluates a shard of the test set; summing correct answers over ranks gives the
# accuracy on the whole test set.
test_x, test_y = x_test[hvd.rank() :: hvd.size()], y_test[hvd.rank() :: hvd.size()]
_, accuracy = model.evaluate(test_x, test_y, verbose=0)
counts = hvd.allreduce(
    np.array([accuracy * len(test_y), len(test_y)]), op=hvd.Sum, name="test_accuracy"
).numpy()
if hvd.rank() == 0:
    print(
        f"ranks: {hvd.size()}, per-rank batch: {args.batch_size}, "
        f"test accuracy: {counts[0] / counts[1]:.4f}"
    )
    if args.save:
        model.save(args.save)
