"""Data-parallel training of a small CNN on scikit-learn's digits (1,797 real 8x8 images of
handwritten digits, shipped with scikit-learn: works offline).

    scaleoutrun -np 2 python examples/pytorch_digits.py
    python examples/pytorch_digits.py                  # one process, for comparison

This is a Horovod PyTorch script: replace the scaleout import with `import horovod.torch as hvd`
and it runs on Horovod unchanged. The global batch and the hyper-parameters are those of one
process; each rank computes its slice of every global batch and DistributedOptimizer averages the
gradients, so N ranks take the same steps as one process (synchronous SGD) and reach the same
test accuracy, each rank doing 1/N of the arithmetic.
"""

import argparse

import digits_data  # beside this script: scikit-learn's digits, without importing it
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import scaleout.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=64, help="global, split over the ranks")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients")
parser.add_argument(
    "--topk",
    type=float,
    default=0.0,
    metavar="DENSITY",
    help="send only this fraction of each gradient (top-k with error feedback)",
)
parser.add_argument(
    "--momentum-correction",
    action="store_true",
    help="with --topk: move SGD's momentum into the compression (DGC)",
)
parser.add_argument("--warmup-steps", type=int, default=0, help="with --topk: dense steps first")
parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(args.threads)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


pixels, targets = digits_data.load()
images = torch.tensor(pixels / 16.0, dtype=torch.float32).unsqueeze(1)
labels = torch.tensor(targets)
train_idx, test_idx = digits_data.split(targets, test_fraction=0.25, seed=0)
train_x, train_y = images[train_idx], labels[train_idx]
test_x, test_y = images[test_idx], labels[test_idx]

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
# Every rank starts from rank 0's weights and optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
if args.topk:
    compression = hvd.Compression.topk(
        args.topk, momentum_correction=args.momentum_correction, warmup_steps=args.warmup_steps
    )
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=compression
)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)


def my_part(batch):
    """This rank's slice of a global batch (equal parts; the first ranks take the remainder)."""
    per_rank, extra = divmod(len(batch), hvd.size())
    start = hvd.rank() * per_rank + min(hvd.rank(), extra)
    return batch[start : start + per_rank + (hvd.rank() < extra)]


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def evaluate():
    model.eval()
    mine = torch.arange(hvd.rank(), len(test_y), hvd.size())  # each rank scores a part
    with torch.no_grad():
        correct = (model(test_x[mine]).argmax(1) == test_y[mine]).sum()
    total = hvd.allreduce(
        torch.tensor([float(correct), float(len(mine))]), op=hvd.Sum, name="test_counts"
    )
    return (total[0] / total[1]).item()


for epoch in range(args.epochs):
    model.train()
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(epoch))
    losses = []
    for start in range(0, len(order), args.batch_size):
        global_batch = order[start : start + args.batch_size]
        mine = my_part(global_batch)
        optimizer.zero_grad()
        # This rank's share of the global batch's mean loss (its samples' sum over the global
        # batch's size, times size() since DistributedOptimizer averages over ranks), so the
        # average is the gradient of the global batch. A rank may get no sample of the last,
        # short batch: it contributes zeros, and still takes part in the step.
        out = model(train_x[mine])
        loss = F.cross_entropy(out, train_y[mine], reduction="sum") * (
            hvd.size() / len(global_batch)
        )
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # averaged over ranks below: the global batch's mean loss
    scheduler.step()
    train_loss = metric_average(float(np.mean(losses)), "train_loss")
    if hvd.rank() == 0 and (epoch + 1) % 10 == 0:
        print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}", flush=True)

accuracy = evaluate()
if hvd.rank() == 0:
    print(
        f"test accuracy {accuracy:.4f} on {len(test_y)} images, {hvd.size()} rank(s), "
        f"global batch {args.batch_size}",
        flush=True,
    )
