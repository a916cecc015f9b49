"""Synthetic-data training throughput of a Keras application model (ResNet50 by default) with
DistributedGradientTape, in images per second.

    scaleoutrun -np 2 python examples/tensorflow2_synthetic_benchmark.py
    scaleoutrun -np 2 python examples/tensorflow2_synthetic_benchmark.py \
        --model MobileNetV2 --image-size 64 --batch-size 16 --num-iters 3     # small CPU run

Each iteration runs --num-batches-per-iter training steps on one random batch per rank; the
script reports the mean and spread of the per-rank rate and the total over ranks.
"""

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import scaleout.tensorflow as hvd  # noqa: E402  (was: import horovod.tensorflow)

parser = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
)
parser.add_argument("--model", default="ResNet50", help="a keras.applications model")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
parser.add_argument("--eager", action="store_true", help="run the step eagerly")
parser.add_argument(
    "--threads",
    type=int,
    default=0,
    help="TensorFlow intra-op threads per rank (0: TensorFlow's choice)",
)
args = parser.parse_args()

hvd.init()
if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

model = getattr(keras.applications, args.model)(
    weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000
)
optimizer = keras.optimizers.SGD(0.01)
loss_fn = keras.losses.SparseCategoricalCrossentropy()
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

rng = np.random.default_rng(hvd.rank())
images = tf.constant(
    rng.random((args.batch_size, args.image_size, args.image_size, 3), dtype=np.float32)
)
labels = tf.constant(rng.integers(0, 1000, args.batch_size))


def step(first_batch: bool):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    # After the first step (which builds the optimizer), start every rank from rank 0's state.
    if first_batch:
        hvd.broadcast_variables(model.weights, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)


train_step = step if args.eager else tf.function(step)


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


log(
    f"Model: {args.model}, image size {args.image_size}, batch size {args.batch_size} per "
    f"rank, {hvd.size()} ranks, {'eager' if args.eager else 'tf.function'}, "
    f"{'fp16' if args.fp16_allreduce else 'no'} compression"
)
train_step(True)
timeit.timeit(lambda: train_step(False), number=args.num_warmup_batches)

rates = []
for i in range(args.num_iters):
    seconds = timeit.timeit(lambda: train_step(False), number=args.num_batches_per_iter)
    rate = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{i}: {rate:.1f} img/sec per rank")
    rates.append(rate)

mean, spread = float(np.mean(rates)), 1.96 * float(np.std(rates))
log(f"Img/sec per rank: {mean:.1f} +-{spread:.1f}")
log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +-{hvd.size() * spread:.1f}")
