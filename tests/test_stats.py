"""scaleout.stats()'s traffic counters (Note [Traffic]) and scaleoutrun --stats."""

import re
import sys

import pytest
from conftest import MP, run_mpi, scaleoutrun


@pytest.mark.parametrize("path", ["shm", "mpi"])
def test_stats_count_what_each_rank_moved(path, nranks):
    env = {} if path == "shm" else {"SCALEOUT_SHM": "0"}
    proc = run_mpi("stats.py", nranks, path, env=env)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr


def test_scaleoutrun_stats_prints_a_line_per_rank_at_shutdown():
    proc = scaleoutrun(
        "--stats",
        "-np",
        "2",
        sys.executable,
        str(MP / "stats.py"),
        "shm",
        timeout=120,
        installed=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(
        r"scaleout stats, rank (\d): allreduce 10 calls, 7\.5 MiB submitted, "
        r"7\.5 MiB to shared memory, 0 B to MPI, reduce \S+ s, wait \S+ s; "
        r"allgather 1 calls",
        proc.stdout + proc.stderr,
    )
    assert sorted(lines) == ["0", "1"], proc.stdout + proc.stderr
