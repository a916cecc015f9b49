"""The Criteo Kaggle display-advertising format: a streaming loader and a synthetic generator.

Each line holds 40 tab-separated fields: the label (0 or 1), 13 integer features (counts; may be
empty or negative) and 26 categorical features (32-bit hashes as 8 hex digits; may be empty).
Preprocessing, as in the DLRM reference: integer x -> log(1 + max(x, 0)), empty -> 0;
categorical h -> int(h, 16) % table_size, empty -> 0.

Make a synthetic file (no download):

    python examples/dlrm/data.py --write synthetic.tsv --rows 100000 --seed 0

Numpy only (no torch, no scaleout), so the loader can be tested on its own.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np

__all__ = [
    "NUM_DENSE",
    "NUM_CATEGORICAL",
    "CRITEO_KAGGLE_CARDINALITIES",
    "default_table_sizes",
    "Batch",
    "parse_dense_and_labels",
    "parse_ids",
    "global_batches",
    "local_batches",
    "write_synthetic",
]

NUM_DENSE = 13
NUM_CATEGORICAL = 26
# Distinct values of each categorical feature in the Kaggle training set (the DLRM paper's).
CRITEO_KAGGLE_CARDINALITIES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)

PathLike = Union[str, Path]


def default_table_sizes(cap: int = 20000, count: int = NUM_CATEGORICAL) -> List[int]:
    """Criteo's cardinalities capped at `cap` rows (hashing folds the rest), `count` tables."""
    return [min(CRITEO_KAGGLE_CARDINALITIES[t % NUM_CATEGORICAL], cap) for t in range(count)]


@dataclass
class Batch:
    """One step's data on one rank: dense features [b, 13] and labels [b] of this rank's rows
    of the global batch, and the categorical ids [B, T] of the whole global batch."""

    dense: np.ndarray
    labels: np.ndarray
    ids: np.ndarray


def _fields(lines: Sequence[str], expected: int, first_line: int) -> List[List[str]]:
    rows = []
    for i, line in enumerate(lines):
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != expected:
            raise ValueError(
                f"line {first_line + i}: {len(fields)} tab-separated fields, "
                f"want {expected} (label, {NUM_DENSE} integers, "
                f"{expected - 1 - NUM_DENSE} categoricals)"
            )
        rows.append(fields)
    return rows


def parse_dense_and_labels(rows: Sequence[Sequence[str]], first_line: int = 1):
    """(dense float32 [n, 13], labels float32 [n]) from split lines."""
    try:
        labels = np.array([int(r[0]) for r in rows], dtype=np.float32)
        counts = np.array(
            [[int(v) if v else 0 for v in r[1 : 1 + NUM_DENSE]] for r in rows], dtype=np.int64
        ).reshape(len(rows), NUM_DENSE)
    except ValueError as e:
        raise ValueError(f"lines {first_line}-{first_line + len(rows) - 1}: {e}") from None
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"lines {first_line}-{first_line + len(rows) - 1}: a label is not 0/1")
    return np.log1p(np.maximum(counts, 0)).astype(np.float32), labels


def parse_ids(
    rows: Sequence[Sequence[str]], table_sizes: Sequence[int], first_line: int = 1
) -> np.ndarray:
    """ids int64 [n, T]: hash % table size, empty -> 0."""
    start = 1 + NUM_DENSE
    try:
        hashes = np.array(
            [[int(v, 16) if v else 0 for v in r[start:]] for r in rows], dtype=np.int64
        ).reshape(len(rows), len(table_sizes))
    except ValueError as e:
        raise ValueError(f"lines {first_line}-{first_line + len(rows) - 1}: {e}") from None
    return hashes % np.asarray(table_sizes, dtype=np.int64)


def _line_batches(path: PathLike, batch_size: int, drop_last: bool) -> Iterator[List[str]]:
    """Lists of `batch_size` lines, read as they are needed (a 10 GB file is never held)."""
    with open(path, "r", encoding="ascii", newline="") as f:
        while True:
            lines = list(itertools.islice(f, batch_size))
            if not lines or (drop_last and len(lines) < batch_size):
                return
            yield lines


def global_batches(
    path: PathLike, batch_size: int, table_sizes: Sequence[int], drop_last: bool = True
) -> Iterator[Batch]:
    """The whole global batch (what one process training on it reads)."""
    expected = 1 + NUM_DENSE + len(table_sizes)
    first = 1
    for lines in _line_batches(path, batch_size, drop_last):
        rows = _fields(lines, expected, first)
        dense, labels = parse_dense_and_labels(rows, first)
        yield Batch(dense, labels, parse_ids(rows, table_sizes, first))
        first += len(lines)


def local_batches(
    path: PathLike, global_batch_size: int, table_sizes: Sequence[int], rank: int, size: int
) -> Iterator[Batch]:
    """Rank `rank` of `size`: every rank reads the same file in global batches; this rank's
    dense features and labels are rows [rank b, (rank + 1) b) of each, b = B / size, and its ids
    are the whole global batch's (the model-parallel tables need every row). A last, short
    global batch is dropped."""
    if global_batch_size % size:
        raise ValueError(
            f"the global batch ({global_batch_size}) must split evenly over {size} ranks"
        )
    local = global_batch_size // size
    expected = 1 + NUM_DENSE + len(table_sizes)
    first = 1
    for lines in _line_batches(path, global_batch_size, drop_last=True):
        rows = _fields(lines, expected, first)
        mine = rows[rank * local : (rank + 1) * local]
        dense, labels = parse_dense_and_labels(mine, first + rank * local)
        yield Batch(dense, labels, parse_ids(rows, table_sizes, first))
        first += len(lines)


# Rows generated at a time (memory stays bounded for any file size). Not an argument: the
# random draws follow the chunks, and the same arguments must write the same file.
_SYNTHETIC_CHUNK_ROWS = 50000


def _zipf_sampler(rng: np.random.Generator, vocab: int, exponent: float):
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1) ** exponent)
    cdf /= cdf[-1]
    return lambda n: np.minimum(np.searchsorted(cdf, rng.random(n)), vocab - 1)


def write_synthetic(
    path: PathLike,
    rows: int,
    seed: int = 0,
    num_categorical: int = NUM_CATEGORICAL,
    vocab_sizes: Optional[Sequence[int]] = None,
    zipf_exponent: float = 1.1,
    missing_rate: float = 0.05,
) -> Path:
    """Writes `rows` lines in the Criteo format. Categorical values follow a power law (the
    k-th most frequent value of a feature with probability ~ 1 / k ** zipf_exponent) and the
    label is drawn from a logistic model of the features (a per-value effect for each
    categorical, a slope for each log-count), so there is something to learn. About
    `missing_rate` of the fields are empty; some integer features take negative values, as
    Criteo's do. The same arguments write the same file."""
    rng = np.random.default_rng(seed)
    vocab_sizes = list(vocab_sizes or default_table_sizes(count=num_categorical))
    if len(vocab_sizes) != num_categorical:
        raise ValueError(f"{len(vocab_sizes)} vocab sizes for {num_categorical} categoricals")
    hashes, effects, samplers = [], [], []
    for vocab in vocab_sizes:
        values = rng.choice(2**32, size=vocab, replace=False)
        hashes.append(np.array([f"{h:08x}" for h in values]))
        effects.append(rng.normal(0.0, 1.0, vocab))
        samplers.append(_zipf_sampler(rng, vocab, zipf_exponent))
    means = rng.uniform(0.5, 200.0, NUM_DENSE)  # count scales differ a lot, as Criteo's
    slopes = rng.normal(0.0, 0.5, NUM_DENSE)
    negative = np.arange(NUM_DENSE) == 1  # as Criteo's I2, which goes down to -3
    bias = -1.8 - float(slopes @ np.log1p(means))  # positives: a third to a half, by seed
    path = Path(path)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for start in range(0, rows, _SYNTHETIC_CHUNK_ROWS):
            n = min(_SYNTHETIC_CHUNK_ROWS, rows - start)
            logit = np.full(n, bias)
            columns = []
            counts = rng.geometric(1.0 / (1.0 + means), size=(n, NUM_DENSE)) - 1
            below_zero = rng.random((n, NUM_DENSE)) < 0.1 * negative
            counts = np.where(below_zero, -rng.integers(1, 4, (n, NUM_DENSE)), counts)
            dense_missing = rng.random((n, NUM_DENSE)) < missing_rate
            logit += np.where(dense_missing, 0.0, np.log1p(np.maximum(counts, 0))) @ slopes
            for j in range(NUM_DENSE):
                columns.append(np.where(dense_missing[:, j], "", counts[:, j].astype(str)))
            for f_hashes, f_effects, sample in zip(hashes, effects, samplers):
                k = sample(n)
                missing = rng.random(n) < missing_rate
                logit += np.where(missing, 0.0, f_effects[k])
                columns.append(np.where(missing, "", f_hashes[k]))
            labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
            columns.insert(0, labels.astype(str))
            f.write("".join("\t".join(fields) + "\n" for fields in zip(*columns)))
    return path


def _main() -> None:
    parser = argparse.ArgumentParser(description="Write a synthetic Criteo-format file.")
    parser.add_argument("--write", required=True, metavar="PATH", help="the file to write")
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-categorical", type=int, default=NUM_CATEGORICAL)
    args = parser.parse_args()
    write_synthetic(args.write, args.rows, args.seed, args.num_categorical)
    print(f"wrote {args.rows} rows to {args.write}")


if __name__ == "__main__":
    _main()
