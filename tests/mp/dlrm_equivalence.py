"""Run by tests/test_dlrm.py::test_hybrid_parallel_dlrm_trains_like_one_process_on_the_global_batch.

Hybrid-parallel DLRM (examples/dlrm) trains exactly like one process on the global batch.

N ranks: embedding tables sharded table-wise (uneven counts per rank) and row-wise, one
alltoall forward and back, MLPs under DistributedOptimizer, tables under a local SGD. Every rank
also trains the single-process reference (all tables, the global batch, loss = mean over B)
and compares, after every step: the global loss, the embeddings its local rows receive, the MLP
parameters, and every table gathered from the rank(s) holding it. float64, so "exactly" means to
rounding.
"""

import sys
import tempfile
from pathlib import Path

import torch
from _harness import check, check_close, main_tests

import scaleout.torch as so

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "dlrm"))
import data  # noqa: E402
from model import DLRM, NUM_DENSE, DenseArch, LocalEmbeddings, bce_loss  # noqa: E402
from sharding import ShardedEmbeddings, plan_shards  # noqa: E402

torch.set_num_threads(1)

DIM = 4
LOCAL_ROWS = 4  # rows per rank per step
STEPS = 5
DENSE_LR, DENSE_MOMENTUM, TABLE_LR = 0.1, 0.9, 0.5
TOL = dict(rtol=1e-9, atol=1e-12)


def random_batches(table_sizes, global_rows, steps):
    """Global batches: ids skewed toward low ids, so rows repeat within a batch (a row's
    gradient sums over its uses) and row-wise tables get ids on every rank's range."""
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 + step)
        dense = torch.rand(global_rows, NUM_DENSE, generator=g, dtype=torch.float64) * 3
        labels = (torch.rand(global_rows, generator=g) < 0.4).to(torch.float64)
        skew = torch.rand(global_rows, len(table_sizes), generator=g, dtype=torch.float64) ** 2
        ids = (skew * torch.tensor(table_sizes, dtype=torch.float64)).long()
        yield dense, labels, ids


def build(table_sizes, embeddings):
    torch.manual_seed(7)
    dense_arch = DenseArch(len(table_sizes), DIM, bottom_hidden=(8,), top_hidden=(8,))
    return DLRM(dense_arch.to(torch.float64), embeddings)


def train_and_compare(r, n, what, table_sizes, threshold, distributed_batches, global_batches_):
    """distributed_batches: (dense of my rows, labels of my rows, ids of the global batch) per
    step; global_batches_: (dense, labels, ids) of the whole global batch per step."""
    plan = plan_shards(table_sizes, n, threshold)
    model = build(
        table_sizes,
        ShardedEmbeddings(plan, r, DIM, seed=3, dtype=torch.float64, name=f"{what}.embeddings"),
    )
    ref = build(table_sizes, LocalEmbeddings(table_sizes, DIM, seed=3, dtype=torch.float64))
    dense_opt = so.DistributedOptimizer(
        torch.optim.SGD(model.dense_arch.parameters(), lr=DENSE_LR, momentum=DENSE_MOMENTUM),
        named_parameters=model.dense_arch.named_parameters(),
    )
    held = list(model.embeddings.parameters())
    # A rank may hold no table at all (torch refuses an optimizer of nothing).
    table_opt = torch.optim.SGD(held, lr=TABLE_LR) if held else None
    ref_opt = torch.optim.SGD(
        [
            {"params": ref.dense_arch.parameters(), "lr": DENSE_LR, "momentum": DENSE_MOMENTUM},
            {"params": ref.embeddings.parameters(), "lr": TABLE_LR},
        ]
    )
    initial = [t.weight.detach().clone() for t in ref.embeddings.tables]

    steps = 0
    for (dense, labels, ids), (g_dense, g_labels, g_ids) in zip(
        distributed_batches, global_batches_
    ):
        at = f"{what}, {n} ranks, step {steps}"
        mine = slice(r * LOCAL_ROWS, (r + 1) * LOCAL_ROWS)
        check(
            torch.equal(ids, g_ids) and torch.equal(dense, g_dense[mine]),
            f"{at}: this rank reads the global batch's ids and its own dense rows",
        )

        dense_opt.zero_grad()
        if table_opt is not None:
            table_opt.zero_grad()
        embedded = model.embeddings(ids)
        loss = bce_loss(model.dense_arch(dense, embedded), labels)
        loss.backward()
        dense_opt.step()
        if table_opt is not None:
            table_opt.step()

        ref_opt.zero_grad()
        ref_embedded = ref.embeddings(g_ids)
        ref_loss = bce_loss(ref.dense_arch(g_dense, ref_embedded), g_labels)
        ref_loss.backward()
        ref_opt.step()

        check_close(
            embedded.detach().numpy(),
            ref_embedded[mine].detach().numpy(),
            f"{at}: the embeddings of my rows after the alltoall",
            **TOL,
        )
        check_close(
            so.allreduce(loss.detach(), name=f"{what}.loss").numpy(),
            ref_loss.detach().numpy(),
            f"{at}: global mean loss",
            **TOL,
        )
        for (name, p), q in zip(model.dense_arch.named_parameters(), ref.dense_arch.parameters()):
            check_close(p.detach().numpy(), q.detach().numpy(), f"{at}: MLP {name}", **TOL)
        for t, table in enumerate(model.embeddings.gather_tables()):
            check_close(
                table.numpy(),
                ref.embeddings.tables[t].weight.detach().numpy(),
                f"{at}: table {t} ({table_sizes[t]} rows) gathered from its holders",
                **TOL,
            )
        steps += 1
    check(steps == STEPS, f"{what}: trained {steps} steps, want {STEPS}")
    moved = max(
        float((t.weight.detach() - t0).abs().max()) for t, t0 in zip(ref.embeddings.tables, initial)
    )
    check(moved > 1e-3, f"{what}: the tables moved at all ({moved})")
    return plan


def split(batches, r):
    mine = slice(r * LOCAL_ROWS, (r + 1) * LOCAL_ROWS)
    for dense, labels, ids in batches:
        yield dense[mine], labels[mine], ids


def test_uneven_tables_and_row_wise_tables(r, n):
    # 40 and 33 rows > 30: split by rows over every rank; 5 whole tables over 2 or 3 ranks.
    sizes, threshold = [6, 40, 9, 3, 33, 12, 5], 30
    plan = train_and_compare(
        r,
        n,
        "uneven",
        sizes,
        threshold,
        split(random_batches(sizes, n * LOCAL_ROWS, STEPS), r),
        random_batches(sizes, n * LOCAL_ROWS, STEPS),
    )
    whole = [sum(not s.row_wise for s in held) for held in plan.shards]
    check(len(set(whole)) > 1, f"the test holds uneven table counts per rank: {whole}")
    check(
        all(sum(s.row_wise for s in held) == 2 for held in plan.shards),
        "every rank holds a part of both row-wise tables",
    )


def test_a_rank_holding_no_table(r, n):
    # Two whole tables: at 3 ranks one rank sends nothing forward and receives nothing back,
    # yet takes part in both alltoalls.
    sizes = [8, 5]
    train_and_compare(
        r,
        n,
        "few",
        sizes,
        None,
        split(random_batches(sizes, n * LOCAL_ROWS, STEPS), r),
        random_batches(sizes, n * LOCAL_ROWS, STEPS),
    )


def test_a_criteo_file_through_the_loader(r, n):
    # Every rank writes the same synthetic file for itself, reads its part with local_batches;
    # the reference reads whole global batches. Tables 0 and 2 are split by rows.
    sizes, threshold = [50, 7, 64, 20], 40
    with tempfile.TemporaryDirectory() as tmp:
        path = data.write_synthetic(
            Path(tmp) / "criteo.tsv",
            n * LOCAL_ROWS * STEPS + 3,
            seed=5,
            num_categorical=4,
            vocab_sizes=[50, 7, 300, 20],
        )

        def tensors(batches):
            for b in batches:
                yield (
                    torch.from_numpy(b.dense).double(),
                    torch.from_numpy(b.labels).double(),
                    torch.from_numpy(b.ids),
                )

        train_and_compare(
            r,
            n,
            "file",
            sizes,
            threshold,
            tensors(data.local_batches(path, n * LOCAL_ROWS, sizes, r, n)),
            tensors(data.global_batches(path, n * LOCAL_ROWS, sizes)),
        )


if __name__ == "__main__":
    main_tests(globals())
