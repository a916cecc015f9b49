"""Elastic data-parallel training of an MLP on scikit-learn's digits (1,797 real 8x8 images,
shipped with scikit-learn: works offline): the job survives losing ranks and grows when hosts
are added, from its last commit.

    cat > hosts.sh <<'EOF'
    #!/bin/sh
    echo localhost:2
    echo 127.0.0.1:1
    EOF
    chmod +x hosts.sh
    scaleoutrun -np 3 --min-np 2 --host-discovery-script ./hosts.sh \\
        python examples/elastic_pytorch_digits.py

(localhost and 127.0.0.1 are two names of this machine, so one machine shows what a cluster
does: `kill -9` rank 2, the one on 127.0.0.1, and the job goes on at 2 ranks on localhost,
127.0.0.1 left out as a failed host; make hosts.sh print one more host, `hostname`:1 say, and
the job grows at its next commit.)

This is a Horovod elastic script: with `import horovod.torch as hvd` it runs on Horovod
unchanged. Each rank trains --batch-size samples per step and the learning rate is scaled by
the number of ranks, rescaled by a reset callback whenever the job restarts at another size.
The ElasticSampler resumes an epoch where the last commit left it, sharded over the ranks
there are then, so every sample of an epoch is trained once (a few more at the end of an epoch,
to give every rank the same number of batches).
"""

import argparse

import digits_data  # beside this script: scikit-learn's digits, without importing it
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import scaleout.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=16, help="per rank")
parser.add_argument("--lr", type=float, default=0.02, help="per rank: scaled by the ranks")
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument(
    "--count-samples",
    action="store_true",
    help="count, in the committed state, how often each training sample was "
    "trained on, and print the counts at the end",
)
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)

pixels, targets = digits_data.load()
images = torch.tensor(pixels.reshape(len(pixels), 64) / 16.0, dtype=torch.float32)
labels = torch.tensor(targets)
train_idx, test_idx = digits_data.split(targets, test_fraction=0.25, seed=0)
train_set = torch.utils.data.TensorDataset(
    torch.arange(len(train_idx)), images[train_idx], labels[train_idx]
)

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

# What a restart goes back to: the model, the optimizer, the sampler's place in the epoch, and
# the epoch itself (and, with --count-samples, how often each sample was trained on).
state = hvd.elastic.TorchState(
    model=model,
    optimizer=optimizer,
    sampler=sampler,
    epoch=0,
    times_seen=np.zeros(len(train_set), np.int64),
)


def on_reset():
    """After a restart at another size: the learning rate follows the number of ranks."""
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        model.train()
        for batch, (indices, x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if args.count_samples:
                seen = np.concatenate(hvd.allgather_object(indices.numpy()))
                state.times_seen = state.times_seen + np.bincount(seen, minlength=len(train_set))
            state.sampler.record_batch(batch, args.batch_size)
            if (batch + 1) % args.batches_per_commit == 0:
                state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()
        if hvd.rank() == 0:
            print(
                f"epoch {state.epoch:3d}/{args.epochs}  {hvd.size()} ranks  "
                f"last loss {loss.item():.4f}",
                flush=True,
            )


train(state)

model.eval()
mine = torch.arange(hvd.rank(), len(test_idx), hvd.size())  # each rank scores a part
with torch.no_grad():
    correct = (model(images[test_idx][mine]).argmax(1) == labels[test_idx][mine]).sum()
total = hvd.allreduce(
    torch.tensor([float(correct), float(len(mine))]), op=hvd.Sum, name="test_counts"
)
if hvd.rank() == 0:
    print(
        f"test accuracy {(total[0] / total[1]).item():.4f} on {len(test_idx)} images, "
        f"{hvd.size()} ranks at the end",
        flush=True,
    )
    if args.count_samples:
        counts = np.bincount(state.times_seen, minlength=args.epochs + 2).tolist()
        print(
            f"times each of the {len(train_set)} training samples was trained on: "
            f"{dict((n, c) for n, c in enumerate(counts) if c)}",
            flush=True,
        )
