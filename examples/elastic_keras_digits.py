"""Elastic Keras training on scikit-learn's digits (8x8 images of 0-9, shipped with scikit-learn,
no download), written as a Horovod elastic Keras script with one changed import line: the job
goes on when a rank is lost, at the new number of ranks, from its last commit.

    scaleoutrun -np 3 --min-np 2 --host-discovery-script ./discover.sh \\
        python examples/elastic_keras_digits.py

The state (model, optimizer, epoch, batch) is committed every few batches and at the end of
every epoch. When a rank dies, or the discovered hosts change, the job stops and scaleoutrun
starts it again on the hosts there are; `hvd.elastic.run` resumes it from the last commit,
runs the reset callbacks (which rescale the learning rate to the new number of ranks) and the
interrupted epoch goes on with the steps it had left.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import scaleout.tensorflow.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=1e-3, help="one process's learning rate")
parser.add_argument("--batches-per-commit", type=int, default=4)
parser.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
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

model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ]
)
# The global batch is size() times larger: scale the learning rate with it.
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * hvd.size()))
model.compile(
    optimizer=optimizer,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)

# What survives a restart: the model, the optimizer, and where the training was.
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


def on_state_reset():
    # A resumed job may have another number of ranks: the committed learning rate was scaled
    # for the old one.
    state.model.optimizer.learning_rate = args.lr * hvd.size()
    if hvd.rank() == 0:
        print(
            f"resumed at epoch {state.epoch}, batch {state.batch} on {hvd.size()} ranks", flush=True
        )


state.register_reset_callbacks([on_state_reset])

callbacks = [
    # Report metrics averaged over ranks.
    hvd.callbacks.MetricAverageCallback(),
    # Keep state.epoch and state.batch, and commit the state every few batches and at every
    # epoch's end (in this order, so that a commit holds where the training is).
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
]


@hvd.elastic.run
def train(state):
    # Each rank trains on its own shard of the ranks there are now, all of the same length (so
    # that every rank runs the same number of steps).
    rows = len(x_train) // hvd.size()
    x_shard = x_train[hvd.rank() :: hvd.size()][:rows]
    y_shard = y_train[hvd.rank() :: hvd.size()][:rows]
    state.model.fit(
        x_shard,
        y_shard,
        batch_size=args.batch_size,
        epochs=args.epochs - state.epoch,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )


train(state)

if hvd.rank() == 0:
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"ranks: {hvd.size()}, test accuracy: {accuracy:.4f}")
