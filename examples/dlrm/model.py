"""DLRM (Naumov et al., 2019) in PyTorch: the architecture, in one process.

    dense [rows, 13] --bottom MLP--> x [rows, D]
    ids [rows, T] --one EmbeddingBag(sum) per table--> e [rows, T, D]
    interaction: the dot products of every pair of the T + 1 vectors (x, e_1, ..., e_T), lower
                 triangle without the diagonal, concatenated with x
    top MLP --> one logit per row; loss: binary cross-entropy with logits

The model is split into the part every rank replicates (`DenseArch`: both MLPs and the
interaction) and the embedding tables, so that the same `DLRM` runs either with all tables in
this process (`LocalEmbeddings`) or with tables sharded over ranks (`sharding.ShardedEmbeddings`,
the same forward contract).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "NUM_DENSE",
    "mlp",
    "interact",
    "DenseArch",
    "LocalEmbeddings",
    "DLRM",
    "init_table_rows",
    "bce_loss",
]

NUM_DENSE = 13

# Rows are initialised in blocks seeded by (seed, table, block), so a table's values do not
# depend on how it is sharded: the same seed gives the same model on 1, 2 or 3 ranks.
_INIT_BLOCK = 4096


def init_table_rows(
    seed: int,
    table: int,
    num_rows: int,
    lo: int,
    hi: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rows [lo, hi) of table `table` (with `num_rows` rows in all): uniform in
    +-1/sqrt(num_rows), as the DLRM reference initialises its tables."""
    bound = 1.0 / np.sqrt(num_rows)
    parts = []
    for block in range(lo // _INIT_BLOCK, -(-hi // _INIT_BLOCK)):
        start = block * _INIT_BLOCK
        rows = min(_INIT_BLOCK, num_rows - start)
        state = np.random.SeedSequence([seed, table, block]).generate_state(1)[0]
        values = torch.rand(rows, dim, generator=torch.Generator().manual_seed(int(state)))
        parts.append(values[max(lo - start, 0) : hi - start])
    if not parts:
        return torch.empty(0, dim, dtype=dtype)
    return ((torch.cat(parts) * 2 - 1) * bound).to(dtype)


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers sizes[0] -> sizes[1] -> ... with ReLU between (and after the last one when
    `last_relu`)."""
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def interact(bottom: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
    """[rows, D] and [rows, T, D] -> [rows, D + (T + 1) T / 2]: x followed by the dot products
    <v_i, v_j>, i > j, of v = (x, e_1, ..., e_T)."""
    vectors = torch.cat([bottom.unsqueeze(1), embedded], dim=1)
    dots = torch.bmm(vectors, vectors.transpose(1, 2))
    n = vectors.shape[1]
    i, j = torch.tril_indices(n, n, offset=-1)
    return torch.cat([bottom, dots[:, i, j]], dim=1)


class DenseArch(nn.Module):
    """Everything but the embedding tables: replicated on every rank, its gradients allreduced."""

    def __init__(
        self,
        num_tables: int,
        embedding_dim: int,
        bottom_hidden: Sequence[int] = (64,),
        top_hidden: Sequence[int] = (64, 32),
    ):
        super().__init__()
        self.bottom = mlp([NUM_DENSE, *bottom_hidden, embedding_dim], last_relu=True)
        interactions = (num_tables + 1) * num_tables // 2
        self.top = mlp([embedding_dim + interactions, *top_hidden, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """dense [rows, 13], embedded [rows, T, D] -> logits [rows]."""
        return self.top(interact(self.bottom(dense), embedded)).squeeze(1)


class LocalEmbeddings(nn.Module):
    """All tables in this process: ids [rows, T] (one id per row and table) -> [rows, T, D]."""

    def __init__(
        self,
        table_sizes: Sequence[int],
        embedding_dim: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.table_sizes = list(table_sizes)
        self.tables = nn.ModuleList()
        for t, rows in enumerate(self.table_sizes):
            bag = nn.EmbeddingBag(rows, embedding_dim, mode="sum", sparse=True, dtype=dtype)
            with torch.no_grad():
                bag.weight.copy_(init_table_rows(seed, t, rows, 0, rows, embedding_dim, dtype))
            self.tables.append(bag)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = ids.shape[0]
        offsets = torch.arange(rows, dtype=torch.int64)
        return torch.stack(
            [bag(ids[:, t].contiguous(), offsets) for t, bag in enumerate(self.tables)], dim=1
        )


class DLRM(nn.Module):
    """dense_arch(dense, embeddings(ids)). With `LocalEmbeddings`, dense and ids cover the same
    rows; with `ShardedEmbeddings`, ids are the global batch's and dense this rank's rows."""

    def __init__(self, dense_arch: DenseArch, embeddings: nn.Module):
        super().__init__()
        self.dense_arch = dense_arch
        self.embeddings = embeddings

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.dense_arch(dense, self.embeddings(ids))


def bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the rows given."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
