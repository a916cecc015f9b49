"""Run by tests/test_multihost_hierarchical.py::test_every_op_and_dtype_across_machines,
tests/test_multihost_hierarchical.py::test_hierarchical_moves_no_more_bytes_across_the_link_than_flat_mpi.

Allreduces across machines (run by tests/test_multihost_hierarchical.py on two network
namespace "hosts"): every op and dtype, small and large (many staging rounds, slices of uneven
sizes), and fused groups, against numpy, with the same bits on every rank. Prints one RESULT
line per rank: the algorithm config() names, what failed, and a digest of every result."""

import hashlib
import json
import sys

import numpy as np

import scaleout as so
from scaleout import _binding

so.init(process_sets="dynamic")
r, n = so.rank(), so.size()
failures = []
digest = hashlib.sha256()

OPS = {"sum": so.Sum, "average": so.Average, "min": so.Min, "max": so.Max, "product": so.Product}
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8]


def contribution(q, count, dtype, op):
    rng = np.random.default_rng(1000 * q + count)
    if op == "product":  # small factors, exact in every dtype
        values = rng.integers(1, 3, count)
    elif np.issubdtype(dtype, np.integer):
        values = rng.integers(0, 250 // n, count)  # a sum still fits uint8
    else:
        values = rng.standard_normal(count) * 8
    return values.astype(dtype)


def expected(count, dtype, op):
    parts = np.stack([contribution(q, count, dtype, op).astype(np.float64) for q in range(n)])
    return {
        "sum": parts.sum(0),
        "average": parts.mean(0),
        "min": parts.min(0),
        "max": parts.max(0),
        "product": parts.prod(0),
    }[op]


def every_op_and_dtype():
    for count in (7, 1000, 300_001):
        for dtype in DTYPES:
            for op in OPS:
                if op == "average" and np.issubdtype(dtype, np.integer):
                    continue
                if dtype in (np.float16, np.uint8) and op in ("sum", "product") and count > 1000:
                    continue  # out of the dtype's exact range: checked at the smaller counts
                got = so.allreduce(
                    contribution(r, count, dtype, op),
                    op=OPS[op],
                    name=f"{count}.{dtype.__name__}.{op}",
                )
                want = expected(count, dtype, op)
                tol = 1e-2 if dtype == np.float16 else 1e-5
                if got.dtype != dtype or not np.allclose(
                    got.astype(np.float64), want, rtol=tol, atol=tol
                ):
                    failures.append(f"{op} of {count} {dtype.__name__}")
                digest.update(got.tobytes())
    # A fused group of many tensors of different sizes, submitted together.
    handles = [
        so.allreduce_async(
            np.full(k * 37 + 1, float(r + k), np.float32), op=so.Sum, name=f"group.{k}"
        )
        for k in range(40)
    ]
    for k, h in enumerate(handles):
        got = so.synchronize(h)
        if not np.array_equal(got, np.full(k * 37 + 1, float(n * k + n * (n - 1) // 2))):
            failures.append(f"fused tensor {k}")
        digest.update(got.tobytes())


def broadcasts():
    """From every root, one element and many staging rounds' worth (Note [Staged broadcast])."""
    for root in range(n):
        for count in (1, 300_001):
            got = so.broadcast(
                contribution(r, count, np.float64, "sum"), root, name=f"bcast.{root}.{count}"
            )
            if not np.array_equal(got, contribution(root, count, np.float64, "sum")):
                failures.append(f"broadcast of {count} from rank {root}")
            digest.update(got.tobytes())


def allgathers():
    """Rows of different counts per rank (some none), alone and fused (Note [Hierarchical
    allgather])."""
    for rows in (lambda q: q + 1, lambda q: (q % 3) * 5000):
        mine = np.full((rows(r), 3), r, np.int64)
        got = so.allgather(mine, name=f"gather.{rows(1)}")
        want = np.concatenate([np.full((rows(q), 3), q, np.int64) for q in range(n)])
        if not np.array_equal(got, want):
            failures.append(f"allgather of {rows(1)}-style rows")
        digest.update(got.tobytes())
    handles = [
        so.allgather_async(np.full((r + k, 2), float(k), np.float32), name=f"fg.{k}")
        for k in range(6)
    ]
    for k, h in enumerate(handles):
        got = so.synchronize(h)
        if got.shape != (sum(q + k for q in range(n)), 2) or not np.all(got == k):
            failures.append(f"fused allgather {k}")
    if so.allgather_object({"rank": r}) != [{"rank": q} for q in range(n)]:
        failures.append("allgather_object")


def alltoalls():
    """Rows of different counts for every pair (some none), one and many staging rounds, the
    equal split, and a reducescatter: ranks of one machine exchange through shared memory, the
    others over MPI (Note [Staged alltoall])."""
    for scale in (1, 3000):
        splits = [(r * 7 + k * 3) % 4 * scale for k in range(n)]
        rows = np.concatenate([np.full((splits[k], 2), r * 100 + k, np.int64) for k in range(n)])
        got, received = so.alltoall(rows, splits=splits, name=f"a2a.{scale}")
        want_received = [(q * 7 + r * 3) % 4 * scale for q in range(n)]
        want = np.concatenate(
            [np.full((want_received[q], 2), q * 100 + r, np.int64) for q in range(n)]
        )
        if list(received) != want_received or not np.array_equal(got, want):
            failures.append(f"alltoall of {scale}-row blocks")
    got = so.alltoall(np.arange(n * 5, dtype=np.float32) + 1000 * r, name="a2a.even")
    want = np.concatenate([np.arange(5, dtype=np.float32) + 5 * r + 1000 * q for q in range(n)])
    if not np.array_equal(got, want):
        failures.append("alltoall split evenly")
    got = so.reducescatter(np.arange(n * 3, dtype=np.float64) * (r + 1), op=so.Sum, name="rs")
    want = np.arange(n * 3, dtype=np.float64)[3 * r : 3 * r + 3] * (n * (n + 1) // 2)
    if not np.array_equal(got, want):
        failures.append("reducescatter")


def adasum_pair(a, b):
    dot, na, nb = a @ b, a @ a, b @ b
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    return (1 - dot / (2 * na) if na >= tiny else 1.0) * a + (
        1 - dot / (2 * nb) if nb >= tiny else 1.0
    ) * b


def adasums():
    """Note [Hierarchical Adasum] (asked for): each machine's sum, then the Adasum tree over the
    machines (in the order of their first ranks); else the tree over the ranks. Per tensor,
    fused or not; float64 and float32."""
    places = so.allgather_object(so.cross_rank())
    if not so.config()["adasum_algorithm"].startswith("hierarchical"):
        places = list(range(n))  # flat: every rank is a worker of its own
    machines = sorted(set(places), key=places.index)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        counts = (1000, 300_001, 3)
        handles = [
            so.allreduce_async(
                contribution(r, c, dtype, "sum"), op=so.Adasum, name=f"adasum.{c}.{dtype.__name__}"
            )
            for c in counts
        ]
        for c, h in zip(counts, handles):
            got = so.synchronize(h)
            vectors = [
                sum(
                    contribution(q, c, dtype, "sum").astype(np.float64)
                    for q in range(n)
                    if places[q] == m
                )
                for m in machines
            ]
            while len(vectors) > 1:
                vectors = [
                    adasum_pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)
                ]
            if not np.allclose(got.astype(np.float64), vectors[0], rtol=tol, atol=tol * 10):
                failures.append(f"adasum of {c} {dtype.__name__}")
            digest.update(got.tobytes())


def big():
    """Only 4 allreduces of 16 MiB: the test counts the bytes crossing the link for the job."""
    for _ in range(4):
        got = so.allreduce(np.full(1 << 22, float(r), np.float32), op=so.Sum, name="big")
        if not np.array_equal(got[:5], np.full(5, float(n * (n - 1) // 2))):
            failures.append("big")
        digest.update(got.tobytes())


def on_a_process_set():
    """A set of two ranks on each host (at 3 per host) chooses its own plane: hierarchical too."""
    members = [0, 1, n // 2, n // 2 + 1]
    ps = so.add_process_set(members)
    if ps.included():
        for count, op in ((300_001, "sum"), (1000, "max"), (7, "product")):
            got = so.allreduce(
                contribution(r, count, np.float64, op),
                op=OPS[op],
                name=f"set.{count}",
                process_set=ps,
            )
            parts = np.stack([contribution(q, count, np.float64, op) for q in members])
            want = {"sum": parts.sum(0), "max": parts.max(0), "product": parts.prod(0)}[op]
            if not np.allclose(got, want, rtol=1e-9, atol=1e-9):
                failures.append(f"{op} of {count} on the set {members}")
            digest_set.update(got.tobytes())
    so.remove_process_set(ps)


digest_set = hashlib.sha256()
if "--big" in sys.argv:
    big()
else:
    every_op_and_dtype()
    broadcasts()
    allgathers()
    alltoalls()
    if n & (n - 1) == 0:  # Adasum needs a power-of-two number of ranks
        adasums()
if n == 6 and "--big" not in sys.argv:
    on_a_process_set()
set_digests = so.allgather_object(digest_set.hexdigest())
if len(set(d for q, d in enumerate(set_digests) if q in (0, 1, n // 2, n // 2 + 1))) > 1:
    failures.append("the set's ranks got different bits")
digests = so.allgather_object(digest.hexdigest())
print(
    "RESULT "
    + json.dumps(
        {
            "rank": r,
            "algorithm": so.config()["allreduce_algorithm"],
            "broadcast": so.config()["broadcast_algorithm"],
            "allgather": so.config()["allgather_algorithm"],
            "alltoall": so.config()["alltoall_algorithm"],
            "adasum": so.config()["adasum_algorithm"],
            "plan": _binding.algorithms(),
            "failures": failures,
            "same_bits": len(set(digests)) == 1,
        }
    ),
    flush=True,
)
so.shutdown()
