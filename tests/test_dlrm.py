"""examples/dlrm: hybrid-parallel DLRM equals one process on the global batch; the example runs
under scaleoutrun; the Criteo loader and the synthetic generator keep the format."""

import math
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import run_mpi, scaleoutrun  # noqa: E402

DLRM = Path(__file__).resolve().parent.parent / "examples" / "dlrm"
sys.path.insert(0, str(DLRM))
import data  # noqa: E402


@pytest.mark.parametrize("np_", [3], ids=lambda n: f"np{n}")  # (conftest.one_size)
def test_hybrid_parallel_dlrm_trains_like_one_process_on_the_global_batch(np_):
    # Table-wise tables (uneven counts per rank, and a rank holding none), row-wise tables,
    # random batches and a synthetic Criteo file through the loader: losses, MLPs and every
    # table equal the single-process reference after each of 5 steps.
    proc = run_mpi("dlrm_equivalence.py", np_, timeout=240)
    assert proc.stdout.count("all checks passed") == np_


def test_example_trains_under_scaleoutrun_on_a_synthetic_file():
    proc = scaleoutrun(
        "-np",
        "2",
        sys.executable,
        str(DLRM / "train.py"),
        "--synthetic-rows",
        "2000",
        "--batch-size",
        "64",
        "--steps",
        "12",
        "--log-every",
        "4",
        "--row-wise-threshold",
        "10000",
        timeout=240,
        installed=True,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    losses = re.findall(r"step \d+/12 epoch \d+ loss (\S+)", proc.stdout)
    assert len(losses) == 3, proc.stdout
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in losses), losses
    assert re.search(r"rank 1: tables .*\[10000:20000\]", proc.stdout), proc.stdout  # row-wise
    assert re.search(r"samples/s: [0-9.]+ on 2 rank", proc.stdout), proc.stdout


# ---- the loader and the generator, in this process ----

HAND_WRITTEN = [
    # label, 13 integers (empty, negative, large), 26 hashes (empty, upper and lower case)
    ["1", "", "-3", "0", "7"] + [""] * 8 + ["1000000"] + ["0000000a"] * 25 + [""],
    ["0"] + ["2"] * 13 + ["", "FFFFFFFF"] + ["05f80dd7"] * 24,
    ["0"] + [""] * 13 + [""] * 26,
]


def write_lines(path: Path, rows, newline="\n"):
    path.write_text("".join("\t".join(r) + newline for r in rows))
    return path


def test_loader_parses_empty_fields_negative_counts_and_hashes(tmp_path):
    path = write_lines(tmp_path / "tiny.tsv", HAND_WRITTEN, newline="\r\n")
    sizes = [7] * 26
    (batch,) = list(data.global_batches(path, 3, sizes))
    assert batch.labels.tolist() == [1.0, 0.0, 0.0]
    want = np.zeros((3, 13))
    want[0, 3], want[0, 12] = math.log(8), math.log(1_000_001)  # -3 and empty count as 0
    want[1] = math.log(3)
    np.testing.assert_allclose(batch.dense, want, rtol=1e-6)
    assert batch.dense.dtype == np.float32
    assert batch.ids[0].tolist() == [10 % 7] * 25 + [0]
    assert batch.ids[1].tolist() == [0, 0xFFFFFFFF % 7] + [0x05F80DD7 % 7] * 24
    assert batch.ids[2].tolist() == [0] * 26
    assert batch.ids.dtype == np.int64


def test_loader_gives_each_rank_its_rows_and_the_whole_batch_of_ids(tmp_path):
    path = data.write_synthetic(tmp_path / "s.tsv", 13, seed=2)
    sizes = data.default_table_sizes()
    whole = list(data.global_batches(path, 6, sizes))
    assert len(whole) == 2  # the 13th row would start a short batch: dropped
    for rank in range(3):
        mine = list(data.local_batches(path, 6, sizes, rank, 3))
        assert len(mine) == 2
        for local, full in zip(mine, whole):
            np.testing.assert_array_equal(local.dense, full.dense[2 * rank : 2 * rank + 2])
            np.testing.assert_array_equal(local.labels, full.labels[2 * rank : 2 * rank + 2])
            np.testing.assert_array_equal(local.ids, full.ids)
    with pytest.raises(ValueError, match="split evenly"):
        next(data.local_batches(path, 6, sizes, 0, 4))


def test_loader_names_a_malformed_line(tmp_path):
    rows = HAND_WRITTEN[:2] + [HAND_WRITTEN[2][:-1]]
    path = write_lines(tmp_path / "bad.tsv", rows)
    with pytest.raises(ValueError, match="line 3: 39 tab-separated fields, want 40"):
        list(data.global_batches(path, 3, [5] * 26))
    path = write_lines(tmp_path / "bad_hash.tsv", [HAND_WRITTEN[0][:-1] + ["xyz"]])
    with pytest.raises(ValueError, match="lines 1-1"):
        list(data.global_batches(path, 1, [5] * 26))


def test_synthetic_file_has_criteo_format_power_law_values_and_both_labels(tmp_path):
    path = data.write_synthetic(tmp_path / "a.tsv", 3000, seed=4)
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 3001
    rows = [line.split("\t") for line in lines[:-1]]
    assert all(len(r) == 40 for r in rows)
    assert {r[0] for r in rows} == {"0", "1"}
    integers = [v for r in rows for v in r[1:14]]
    assert all(re.fullmatch(r"-?[0-9]+|", v) for v in integers)
    assert "" in integers and any(v.startswith("-") for v in integers)
    hashes = [v for r in rows for v in r[14:]]
    assert all(re.fullmatch(r"[0-9a-f]{8}|", v) for v in hashes)
    assert "" in hashes
    # a power law: the most frequent value of a wide feature is far above the typical one
    counts = Counter(r[14 + 2] for r in rows if r[14 + 2]).most_common()
    assert counts[0][1] > 20 * counts[len(counts) // 2][1], counts[:3]
    # the same arguments write the same file, another seed another one
    assert data.write_synthetic(tmp_path / "b.tsv", 3000, seed=4).read_text() == path.read_text()
    assert data.write_synthetic(tmp_path / "c.tsv", 3000, seed=5).read_text() != path.read_text()


def test_synthetic_labels_depend_on_the_features(tmp_path):
    # Rows whose value of a frequent category has a high positive rate in the first half of
    # the file are positive more often in the second half too.
    path = data.write_synthetic(tmp_path / "s.tsv", 20000, seed=0)
    (batch,) = list(data.global_batches(path, 20000, [2**32] * 26))
    first, second = slice(0, 10000), slice(10000, 20000)
    lifts = []
    for f in range(26):
        ids = batch.ids[:, f]
        values, counts = np.unique(ids[first], return_counts=True)
        frequent = values[counts >= 200]
        rates = {v: batch.labels[first][ids[first] == v].mean() for v in frequent}
        high = [v for v in frequent if rates[v] > batch.labels[first].mean()]
        low = [v for v in frequent if rates[v] <= batch.labels[first].mean()]
        if high and low:
            later = batch.labels[second]
            lifts.append(
                later[np.isin(ids[second], high)].mean() - later[np.isin(ids[second], low)].mean()
            )
    assert len(lifts) > 10 and np.mean(lifts) > 0.05, lifts


def test_shard_plan_places_every_row_once():
    from sharding import plan_shards

    sizes = data.default_table_sizes()
    for size in (1, 2, 3, 5):
        plan = plan_shards(sizes, size, row_wise_threshold=15000)
        rows = [np.zeros(n, dtype=int) for n in sizes]
        for held in plan.shards:
            for s in held:
                rows[s.table][s.lo : s.hi] += 1
                assert s.row_wise == (sizes[s.table] > 15000)
        assert all((r == 1).all() for r in rows)
        loads = [sum(s.hi - s.lo for s in held) for held in plan.shards]
        assert max(loads) - min(loads) <= max(n for n in sizes if n <= 15000), loads
    # 5 whole tables over 3 ranks: uneven counts; 2 over 3: a rank with none
    assert sorted(len(h) for h in plan_shards([3, 4, 5, 6, 7], 3).shards) == [1, 2, 2]
    assert sorted(len(h) for h in plan_shards([3, 4], 3).shards) == [0, 1, 1]
    # a "row-wise" table with fewer rows than ranks stays whole
    assert not plan_shards([2], 3, row_wise_threshold=1).shards[0][0].row_wise
