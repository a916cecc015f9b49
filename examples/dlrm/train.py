"""Train DLRM on Criteo-format data with hybrid parallelism: model-parallel embedding tables,
data-parallel MLPs.

    scaleoutrun -np 2 python examples/dlrm/train.py --synthetic-rows 50000 --steps 200
    scaleoutrun -np 4 python examples/dlrm/train.py --data train.txt \\
        --table-sizes 1000000 --row-wise-threshold 500000 --batch-size 2048

--data takes the Criteo Kaggle train.txt (or any file in its format, see data.py); without it,
--synthetic-rows N writes a synthetic file of N rows to a temporary directory first (every rank
writes the same file for itself, so no shared file system is needed).

Per step, with a global batch of B rows on N ranks (b = B / N per rank):
  - every rank reads the whole global batch's categorical ids and its own b rows of dense
    features and labels (data.local_batches);
  - each rank looks up the tables (or row ranges) it holds for all B rows, and one alltoall
    hands every rank the embeddings of its b rows (sharding.ShardedEmbeddings);
  - the MLPs run data-parallel on b rows; loss = mean over them; backward runs the reverse
    alltoall (embedding gradients to the ranks holding the rows) and allreduces the MLP
    gradients (DistributedOptimizer, averaged);
  - the MLPs step with the averaged gradients, each rank's tables with their sparse gradients
    (a plain local optimizer: embedding gradients are never allreduced).
This is the same computation as one process on the global batch (tests/mp/dlrm_equivalence.py
checks it step by step).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import torch
from data import NUM_CATEGORICAL, default_table_sizes, local_batches, write_synthetic
from model import DLRM, DenseArch, bce_loss
from sharding import ShardedEmbeddings, plan_shards

import scaleout.torch as so


def int_list(text: str):
    return [int(v) for v in text.split(",") if v]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="a file in the Criteo Kaggle format")
    parser.add_argument(
        "--synthetic-rows",
        type=int,
        default=20000,
        help="without --data: rows of the synthetic file to write and train on",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="global, over all ranks")
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument(
        "--table-sizes",
        type=int_list,
        default=None,
        help="rows of each of the 26 tables, comma-separated; one number for "
        "all of them (default: Criteo's cardinalities capped at 20000)",
    )
    parser.add_argument(
        "--row-wise-threshold",
        type=int,
        default=15000,
        help="a table with more rows is split by rows over every rank",
    )
    parser.add_argument(
        "--bottom-mlp",
        type=int_list,
        default=[64],
        help="hidden sizes of the bottom MLP (its output is --embedding-dim)",
    )
    parser.add_argument(
        "--top-mlp",
        type=int_list,
        default=[64, 32],
        help="hidden sizes of the top MLP (its output is one logit)",
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.5, help="SGD, for the MLPs and the tables")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args(argv)
    if args.table_sizes is None:
        args.table_sizes = default_table_sizes()
    elif len(args.table_sizes) == 1:
        args.table_sizes = args.table_sizes * NUM_CATEGORICAL
    return args


def batches_forever(path, args, rank: int, size: int):
    """Global batches of the file, epoch after epoch."""
    for epoch in itertools.count():
        count = 0
        for batch in local_batches(path, args.batch_size, args.table_sizes, rank, size):
            count += 1
            yield epoch, batch
        if count == 0:
            raise SystemExit(f"{path} has fewer rows than one global batch ({args.batch_size})")


def train(args: argparse.Namespace, path: Path) -> None:
    rank, size = so.rank(), so.size()
    plan = plan_shards(args.table_sizes, size, args.row_wise_threshold)
    if rank == 0:
        print(
            f"{size} rank(s), global batch {args.batch_size}, {len(args.table_sizes)} tables "
            f"of dim {args.embedding_dim}:\n{plan.describe()}",
            flush=True,
        )

    torch.manual_seed(args.seed)  # the same MLPs everywhere (and broadcast below)
    dense_arch = DenseArch(len(args.table_sizes), args.embedding_dim, args.bottom_mlp, args.top_mlp)
    embeddings = ShardedEmbeddings(plan, rank, args.embedding_dim, seed=args.seed)
    model = DLRM(dense_arch, embeddings)
    so.broadcast_parameters(dense_arch.state_dict(), root_rank=0)
    dense_optimizer = so.DistributedOptimizer(
        torch.optim.SGD(dense_arch.parameters(), lr=args.lr),
        named_parameters=dense_arch.named_parameters(),
    )
    # The tables' sparse gradients stay on this rank (see ShardedEmbeddings for their scale).
    # A rank holding no table (more ranks than tables) has nothing to step.
    held = list(embeddings.parameters())
    table_optimizer = torch.optim.SGD(held, lr=args.lr) if held else None

    start, losses = None, []
    data = batches_forever(path, args, rank, size)
    for step in range(1, args.steps + 1):
        epoch, batch = next(data)
        dense_optimizer.zero_grad()
        if table_optimizer is not None:
            table_optimizer.zero_grad()
        logits = model(torch.from_numpy(batch.dense), torch.from_numpy(batch.ids))
        loss = bce_loss(logits, torch.from_numpy(batch.labels))
        loss.backward()
        dense_optimizer.step()
        if table_optimizer is not None:
            table_optimizer.step()
        losses.append(loss.detach())
        if step % args.log_every == 0 or step == args.steps:
            # Equal local batches: the average of the local means is the global batches' mean.
            global_loss = so.allreduce(torch.stack(losses).mean(), name="dlrm.loss")
            if rank == 0:
                print(
                    f"step {step}/{args.steps} epoch {epoch} loss {float(global_loss):.4f} "
                    f"(mean of the last {len(losses)} steps)",
                    flush=True,
                )
            losses = []
        if step == 1:
            start = time.perf_counter()  # after the first step's one-off costs
    if args.steps > 1:
        elapsed = time.perf_counter() - start
        if rank == 0:
            rate = (args.steps - 1) * args.batch_size / elapsed
            print(
                f"samples/s: {rate:.1f} on {size} rank(s) (global batch {args.batch_size}, "
                f"data reading included)",
                flush=True,
            )


def main() -> None:
    args = parse_args()
    so.init()
    torch.set_num_threads(args.threads)
    if args.data is not None:
        train(args, args.data)
        return
    with tempfile.TemporaryDirectory(prefix="dlrm-") as tmp:
        path = Path(tmp) / "synthetic.tsv"
        write_synthetic(
            path, args.synthetic_rows, seed=args.seed, num_categorical=len(args.table_sizes)
        )
        train(args, path)


if __name__ == "__main__":
    main()
