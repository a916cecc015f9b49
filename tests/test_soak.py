"""10,000 training steps of the torch DistributedOptimizer at 2 ranks: memory stays flat after
warm-up (RSS growth under 1 MiB) and no handle or name leaks (tests/mp/soak.py)."""

import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402


def test_ten_thousand_steps_leave_memory_flat_and_nothing_behind():
    proc = run_mpi("soak.py", 2, "10000", timeout=240)
    assert proc.stdout.count("all checks passed") == 2
