"""Model-parallel embedding tables for DLRM: which rank holds which rows, and the lookup that
hands every rank the embeddings of its own rows of the batch.

Layout (the DLRM paper's reference implementation's): a global batch of B rows is split into
local batches of b = B / N rows, rank r holding rows [r b, (r + 1) b) for the data-parallel part
(dense features, labels, both MLPs). Every rank reads the categorical ids of the WHOLE global
batch and looks up the tables it holds, giving pooled embeddings [B, D] per table. One forward
alltoall then sends rank q the rows [q b, (q + 1) b) of every table, so each rank ends with
[b, T, D] for its local batch. The alltoall is differentiable: its backward sends the gradients
back the way the rows came.

Tables are placed two ways:

- table-wise: the whole table on one rank (the default);
- row-wise: a table with more rows than `row_wise_threshold` is cut into N contiguous row
  ranges, one per rank. Each rank looks up the ids that fall in its range (others count zero),
  so its [B, D] result is a partial sum. The same alltoall carries these partial sums like any
  table's rows, and the receiver adds the N partial sums of the table: one index_add over
  everything received.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from model import init_table_rows

import scaleout.torch as so

__all__ = ["Shard", "ShardPlan", "plan_shards", "ShardedEmbeddings"]


@dataclass(frozen=True)
class Shard:
    """Rows [lo, hi) of table `table`, held by one rank."""

    table: int
    lo: int
    hi: int
    row_wise: bool


@dataclass(frozen=True)
class ShardPlan:
    table_sizes: Tuple[int, ...]
    # shards[r]: what rank r holds, by table number; also the order in which r sends them.
    shards: Tuple[Tuple[Shard, ...], ...]

    @property
    def size(self) -> int:
        return len(self.shards)

    def describe(self) -> str:
        lines = []
        for r, held in enumerate(self.shards):
            parts = [f"{s.table}[{s.lo}:{s.hi}]" if s.row_wise else str(s.table) for s in held]
            rows = sum(s.hi - s.lo for s in held)
            lines.append(f"rank {r}: tables {', '.join(parts) or '-'} ({rows} rows)")
        return "\n".join(lines)


def _row_bounds(rows: int, parts: int) -> List[int]:
    """Boundaries of `parts` contiguous ranges, sizes differing by at most one."""
    base, extra = divmod(rows, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


def plan_shards(
    table_sizes: Sequence[int], size: int, row_wise_threshold: Optional[int] = None
) -> ShardPlan:
    """Places tables on `size` ranks. Tables with more rows than `row_wise_threshold` (and at
    least one row per rank) are split by rows over every rank; the others go whole, largest
    first, to the rank holding the fewest rows so far (ties: the lowest rank), so counts per rank
    may differ and a rank may hold no whole table at all. Pure: every rank computes the same
    plan."""
    if size < 1:
        raise ValueError(f"size must be at least 1, not {size}")
    if any(rows < 1 for rows in table_sizes):
        raise ValueError(f"every table needs at least one row: {list(table_sizes)}")
    held: List[List[Shard]] = [[] for _ in range(size)]
    load = [0] * size
    whole = []
    for t, rows in enumerate(table_sizes):
        if row_wise_threshold is not None and rows > row_wise_threshold and rows >= size:
            bounds = _row_bounds(rows, size)
            for r in range(size):
                held[r].append(Shard(t, bounds[r], bounds[r + 1], True))
                load[r] += bounds[r + 1] - bounds[r]
        else:
            whole.append(t)
    for t in sorted(whole, key=lambda t: (-table_sizes[t], t)):
        owner = min(range(size), key=lambda r: (load[r], r))
        held[owner].append(Shard(t, 0, table_sizes[t], False))
        load[owner] += table_sizes[t]
    return ShardPlan(
        tuple(int(n) for n in table_sizes),
        tuple(tuple(sorted(h, key=lambda s: s.table)) for h in held),
    )


class ShardedEmbeddings(nn.Module):
    """This rank's shards of the tables. forward(ids of the global batch [B, T]) -> embeddings
    of this rank's local batch [B / N, T, D], as `model.LocalEmbeddings` would give for those
    rows. Every rank must call forward (and backward) together: each is one alltoall.

    Gradient scale. The reference is one process on the global batch with loss
    L = (1/B) sum_i l_i, so a row's gradient is (1/B) sum of dl_i/de over the rows i using it.
    Here each rank's loss is the mean over its local batch, L_q = (1/b) sum_{i in q} l_i with
    b = B / N, which DistributedOptimizer's averaging of the MLP gradients turns into exactly
    (1/N) sum_q dL_q = dL. The embedding gradients are not averaged: the backward alltoall
    brings the holder of a row dL_q/de_i = (1/b) dl_i/de for every row i of every rank's batch,
    and the holder adds them up, giving (1/b) sum_i dl_i/de = N dL/de. So the gradient that the
    backward alltoall delivers to this rank's pooled lookups is multiplied by `gradient_scale`
    = 1/N (the default; a hook on them), after which the table gradients equal the reference's
    and a plain local optimizer with the reference's learning rate trains identically. (Scaling
    the learning rate of the tables' optimizer by 1/N instead would match plain SGD too, but not
    optimizers that are not linear in the gradient, such as Adagrad.)
    """

    def __init__(
        self,
        plan: ShardPlan,
        rank: int,
        embedding_dim: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        name: str = "dlrm.embeddings",
        gradient_scale: Optional[float] = None,
    ):
        super().__init__()
        self.plan = plan
        self.rank = rank
        self.embedding_dim = embedding_dim
        self.dtype = dtype
        self.name = name
        self.gradient_scale = 1.0 / plan.size if gradient_scale is None else gradient_scale
        self.shards = plan.shards[rank]
        self.bags = nn.ModuleList()
        for s in self.shards:
            bag = nn.EmbeddingBag(s.hi - s.lo, embedding_dim, mode="sum", sparse=True, dtype=dtype)
            with torch.no_grad():
                bag.weight.copy_(
                    init_table_rows(
                        seed, s.table, plan.table_sizes[s.table], s.lo, s.hi, embedding_dim, dtype
                    )
                )
            self.bags.append(bag)
        # Where each received slot goes: rank 0's shards, then rank 1's, ... (the order the
        # alltoall delivers them). A row-wise table appears once per rank; index_add sums them.
        self.register_buffer(
            "_slot_tables",
            torch.tensor([s.table for held in plan.shards for s in held], dtype=torch.int64),
            persistent=False,
        )
        self._table_sizes = torch.tensor(plan.table_sizes, dtype=torch.int64)

    def _lookup(self, bag: nn.EmbeddingBag, shard: Shard, ids: torch.Tensor) -> torch.Tensor:
        """[B] ids -> [B, D]: the embedding, or for a row-wise shard the sum over the ids in
        its range (an empty bag, zero, for the others)."""
        if not shard.row_wise:
            return bag(ids, torch.arange(ids.shape[0], dtype=torch.int64))
        mine = (ids >= shard.lo) & (ids < shard.hi)
        counts = mine.to(torch.int64)
        offsets = torch.cumsum(counts, 0) - counts
        return bag(ids[mine] - shard.lo, offsets)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, tables = ids.shape
        n, dim = self.plan.size, self.embedding_dim
        if tables != len(self.plan.table_sizes):
            raise ValueError(f"ids have {tables} columns for {len(self.plan.table_sizes)} tables")
        if batch % n:
            raise ValueError(f"the global batch ({batch} rows) must split evenly over {n} ranks")
        if bool((ids < 0).any()) or bool((ids >= self._table_sizes).any()):
            raise ValueError("an id is outside its table")
        local = batch // n
        if self.shards:
            pooled = torch.stack(
                [
                    self._lookup(bag, s, ids[:, s.table].contiguous())
                    for bag, s in zip(self.bags, self.shards)
                ],
                dim=1,
            )
        else:
            # Holds nothing, but still takes part in both alltoalls: an empty input that
            # requires grad keeps this rank in the backward one too.
            pooled = torch.zeros(
                batch, 0, dim, dtype=self.dtype, requires_grad=torch.is_grad_enabled()
            )
        if pooled.requires_grad and self.gradient_scale != 1.0:
            pooled.register_hook(lambda grad: grad * self.gradient_scale)
        # [B, S, D] rows are in batch order, so rank q's rows [q b, (q + 1) b) are one
        # contiguous run of b * S rows of D values.
        held = len(self.shards)
        received, _ = so.alltoall(
            pooled.reshape(batch * held, dim), splits=[local * held] * n, name=self.name
        )
        parts, start = [], 0
        for sender in self.plan.shards:
            rows = local * len(sender)
            parts.append(received[start : start + rows].reshape(local, len(sender), dim))
            start += rows
        slots = torch.cat(parts, dim=1)
        out = torch.zeros(local, tables, dim, dtype=slots.dtype)
        return out.index_add(1, self._slot_tables, slots)

    @torch.no_grad()
    def gather_tables(self) -> List[torch.Tensor]:
        """Every table, whole, on every rank (one allgather per table, rows in rank order, which
        is the row order of a row-wise table): for checkpoints and tests."""
        mine = {s.table: bag.weight for s, bag in zip(self.shards, self.bags)}
        empty = torch.empty(0, self.embedding_dim, dtype=self.dtype)
        return [
            so.allgather(mine.get(t, empty).detach(), name=f"{self.name}.gather.{t}")
            for t in range(len(self.plan.table_sizes))
        ]
