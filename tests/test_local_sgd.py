"""LocalSGDOptimizer (torch, at 3 ranks), LocalSGDCallback (Keras, at 2), and the schedule:
Note [Local SGD]."""

import pytest
from conftest import one_size, run_mpi

torch = pytest.importorskip("torch")


@one_size(3)  # conftest.one_size: a front end's training test at one size; Keras's at 2
def test_local_sgd_rounds_outer_step_resume_and_bad_arguments(nranks):
    # bulk steps round alike whatever the timing; a process set made in the script
    env = {"SCALEOUT_FUSION_THRESHOLD": "0", "SCALEOUT_DYNAMIC_PROCESS_SETS": "1"}
    proc = run_mpi("torch_local_sgd.py", nranks, env=env)
    assert proc.stdout.count("all checks passed") == nranks


# ---- the schedule alone (no ranks) ----


def test_schedule_bulk_then_local_rounds():
    from scaleout._local_sgd import ALL, Schedule

    s = Schedule(3, 2, has_outer=False, hierarchical=False, process_set_id=0)
    got = []
    for _ in range(11):
        got.append((s.bulk(), s.finish_step()))
    want = [(True, None)] * 2 + [(False, None), (False, None), (False, ALL)] * 3
    assert got == want
    one = Schedule(1, 0, has_outer=False, hierarchical=False, process_set_id=0)
    assert all(one.bulk() and one.finish_step() is None for _ in range(5))
    outer = Schedule(1, 0, has_outer=True, hierarchical=False, process_set_id=0)
    assert [(outer.bulk(), outer.finish_step()) for _ in range(3)] == [(False, ALL)] * 3


@one_size(2)
def test_keras_local_sgd_callback(nranks):
    pytest.importorskip("tensorflow")
    env = {"SCALEOUT_FUSION_THRESHOLD": "0"}
    proc = run_mpi("tf_local_sgd.py", nranks, env=env, timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
