"""Synthetic training benchmark, as Horovod's: images per second per rank and in total.

    scaleoutrun -np 2 python examples/pytorch_synthetic_benchmark.py
    scaleoutrun -np 2 python examples/pytorch_synthetic_benchmark.py --model mlp --fp16-allreduce

A Horovod script (swap the import for `import horovod.torch as hvd`). The models are small and
built in (no torchvision needed), sized for CPUs: a ResNet-style CNN on 3x32x32 images or an
MLP on 784 features.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import scaleout.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--num-warmup-batches", type=int, default=5)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=5)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(args.threads)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


def small_resnet():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        Block(32, 32, 1),
        Block(32, 64, 2),
        Block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


if args.model == "cnn":
    model, shape = small_resnet(), (3, 32, 32)
else:
    model = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )
    shape = (784,)

optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=compression
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, *shape)
target = torch.randint(0, 10, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


log(
    f"Model: {args.model}, batch size {args.batch_size} per rank, {hvd.size()} rank(s), "
    f"{args.threads} thread(s) per rank"
)
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for i in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    rate = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{i}: {rate:.1f} img/sec per rank")
    img_secs.append(rate)

mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
