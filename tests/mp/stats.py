"""Run by tests/test_stats.py::test_stats_count_what_each_rank_moved,
tests/test_stats.py::test_scaleoutrun_stats_prints_a_line_per_rank_at_shutdown.

scaleout.stats()["collectives"] counts what a rank's collectives moved (argument: "shm" or
"mpi", the allreduce path the job uses). Prints "all checks passed" when every count holds."""

import sys

import numpy as np
from _harness import check, finish

import scaleout as so

so.init()
r, n = so.rank(), so.size()
path = sys.argv[1]
before = so.stats()["collectives"]
check(
    all(c["calls"] == 0 and c["bytes"] == 0 for c in before.values()),
    f"counts start at zero after init: {before}",
)

x = np.ones(1 << 18, np.float32)  # 1 MiB
for _ in range(5):
    so.allreduce_(x, op=so.Sum, name="s.f32")
half = np.ones(1 << 18, np.float16)  # the same elements in half the bytes
for _ in range(5):
    so.allreduce_(half, op=so.Sum, name="s.f16")
so.allgather(np.ones((r + 1, 10), np.float64), name="s.gather")
so.broadcast(np.ones(1000, np.int32), 0, name="s.bcast")
so.alltoall(np.ones(n * 100, np.float32), name="s.a2a")

got = so.stats()["collectives"]
a = got["allreduce"]
check(a["calls"] == 10, f"allreduce calls: {a}")
check(a["bytes"] == 5 * (1 << 20) + 5 * (1 << 19), f"allreduce bytes submitted: {a}")
if path == "shm":
    # Each rank writes every byte of each round into its own staging area once.
    check(a["shm_bytes"] == a["bytes"] and a["mpi_bytes"] == 0, f"allreduce over shm: {a}")
else:
    # float32: the whole buffer to MPI's allreduce; float16 as halves (not widened), in a
    # reduce-scatter (the whole buffer) then an allgather (this rank's block).
    block = (1 << 18) // n + (1 if r < (1 << 18) % n else 0)
    want = 5 * (1 << 20) + 5 * ((1 << 19) + 2 * block)
    check(a["mpi_bytes"] == want and a["shm_bytes"] == 0, f"allreduce over MPI: {a}, want {want}")
check(a["wait_seconds"] >= 0 and a["reduce_seconds"] >= 0, f"times: {a}")
g = got["allgather"]
moved = g["shm_bytes"] if path == "shm" else g["mpi_bytes"]
check(
    g["calls"] == 1 and g["bytes"] == (r + 1) * 80 and moved == (r + 1) * 80,
    f"allgather over {path}: {g}",
)
b = got["broadcast"]
check(b["calls"] == 1 and b["bytes"] == 4000, f"broadcast: {b}")
# Only the root sends a broadcast's bytes.
sent = b["shm_bytes"] + b["mpi_bytes"]
check(sent == (4000 if r == 0 else 0), f"broadcast bytes sent by rank {r}: {b}")
t = got["alltoall"]
check(t["calls"] == 1 and t["bytes"] == n * 400, f"alltoall: {t}")
# Every other rank's 400 bytes leave this rank (its own stay); over MPI, the counts first.
want = (n - 1) * 400 if path == "shm" else (n - 1) * (400 + 8)
check(t["shm_bytes"] + t["mpi_bytes"] == want, f"alltoall bytes sent: {t}, want {want}")
check(got["reducescatter"]["calls"] == 0, f"reducescatter: {got['reducescatter']}")
finish()
