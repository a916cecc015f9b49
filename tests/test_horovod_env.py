"""HOROVOD_* variables as aliases of their SCALEOUT_* twins (README: Horovod's environment
variables): config() shows each value and the variable it came from, SCALEOUT_* wins, the
coordinator thread is pinned as HOROVOD_THREAD_AFFINITY says, and a HOROVOD_* variable without
effect is named once, on rank 0."""

import json
import os

import pytest
from conftest import run_mpi

TWINS = [
    "FUSION_THRESHOLD",
    "CYCLE_TIME",
    "CACHE_CAPACITY",
    "TIMELINE",
    "TIMELINE_MARK_CYCLES",
    "STALL_CHECK_TIME_SECONDS",
    "STALL_CHECK_DISABLE",
    "STALL_SHUTDOWN_TIME_SECONDS",
    "LOG_LEVEL",
    "THREAD_AFFINITY",
    "DYNAMIC_PROCESS_SETS",
    "HIERARCHICAL_ALLREDUCE",
    "HIERARCHICAL_ALLGATHER",
]


def _run(tmp_path, nranks: int, env: dict, check: bool = True):
    """Runs tests/mp/horovod_env.py; returns the process and each rank's report."""
    out = tmp_path / "reports"
    out.mkdir()
    proc = run_mpi("horovod_env.py", nranks, str(out), env=env, check=check)
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return proc, reports


def _no_scaleout_twins() -> dict:
    # conftest sets SCALEOUT_STALL_CHECK_TIME_SECONDS; an empty value counts as unset.
    return {f"SCALEOUT_{t}": "" for t in TWINS}


def test_horovod_variables_are_read_and_named_as_sources(tmp_path, nranks):
    cpus = sorted(os.sched_getaffinity(0))
    affinity = ",".join(str(cpus[-1 - (i % len(cpus))]) for i in range(nranks))
    env = {
        **_no_scaleout_twins(),
        "HOROVOD_FUSION_THRESHOLD": "2097152",
        "HOROVOD_CYCLE_TIME": "3.5",
        "HOROVOD_CACHE_CAPACITY": "17",
        "HOROVOD_TIMELINE": str(tmp_path / "t.json"),
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "33",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "44",
        "HOROVOD_LOG_LEVEL": "Warning",
        "HOROVOD_THREAD_AFFINITY": affinity,
        "HOROVOD_DYNAMIC_PROCESS_SETS": "1",
    }
    proc, reports = _run(tmp_path, nranks, env)
    assert proc.stdout.count("all checks passed") == nranks
    cfg = reports[0]["config"]
    want = {
        "FUSION_THRESHOLD": "2097152",
        "CYCLE_TIME": "3.5",
        "CACHE_CAPACITY": "17",
        "TIMELINE": str(tmp_path / "t.json"),
        "TIMELINE_MARK_CYCLES": "1",
        "STALL_CHECK_TIME_SECONDS": "33",
        "STALL_CHECK_DISABLE": "1",
        "STALL_SHUTDOWN_TIME_SECONDS": "44",
        "LOG_LEVEL": "1",
        "THREAD_AFFINITY": affinity,
        "DYNAMIC_PROCESS_SETS": "1",
    }
    for twin, value in want.items():
        assert cfg[f"SCALEOUT_{twin}"] == value, twin
        assert cfg[f"SCALEOUT_{twin}.source"] == f"HOROVOD_{twin}", twin
    assert cfg["SCALEOUT_SHM.source"] == "default"
    json.loads((tmp_path / "t.json").read_text())  # HOROVOD_TIMELINE wrote a trace
    # Every local rank has a thread (its coordinator) pinned to its own entry of the list.
    for report in reports:
        local, threads = report["local_rank"], list(report["threads"].values())
        assert [int(affinity.split(",")[local])] in threads, (local, threads)


def test_scaleout_variable_wins_and_the_loser_is_named(tmp_path):
    env = {
        **_no_scaleout_twins(),
        "SCALEOUT_CYCLE_TIME": "2",
        "HOROVOD_CYCLE_TIME": "9",
        "SCALEOUT_LOG_LEVEL": "info",
        "HOROVOD_CACHE_CAPACITY": "5",
    }
    proc, reports = _run(tmp_path, 2, env)
    cfg = reports[0]["config"]
    assert cfg["SCALEOUT_CYCLE_TIME"] == "2"
    assert cfg["SCALEOUT_CYCLE_TIME.source"] == "SCALEOUT_CYCLE_TIME"
    assert (
        cfg["SCALEOUT_LOG_LEVEL"] == "2"
        and cfg["SCALEOUT_LOG_LEVEL.source"] == "SCALEOUT_LOG_LEVEL"
    )
    assert cfg["SCALEOUT_CACHE_CAPACITY"] == "5"
    assert cfg["SCALEOUT_CACHE_CAPACITY.source"] == "HOROVOD_CACHE_CAPACITY"
    assert cfg["SCALEOUT_FUSION_THRESHOLD.source"] == "default"
    assert proc.stderr.count("HOROVOD_CYCLE_TIME=9 has no effect: SCALEOUT_CYCLE_TIME=2") == 1


def test_horovod_variables_without_effect_are_named_once_on_rank_0(tmp_path, nranks):
    env = {
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_MPI_THREADS_DISABLE": "1",
        "HOROVOD_GPU_OPERATIONS": "NCCL",
        "HOROVOD_NO_SUCH_KNOB": "1",
    }
    proc, _ = _run(tmp_path, nranks, env)
    assert proc.stdout.count("all checks passed") == nranks
    for name in env:
        lines = [
            line for line in proc.stderr.splitlines() if f"{name} is set but has no effect" in line
        ]
        assert len(lines) == 1, (name, proc.stderr)
        assert "(rank 0)" in lines[0]
    assert "not a Horovod 0.28.1 variable" in proc.stderr


def test_hierarchical_allreduce_asked_for_on_one_machine_says_why(tmp_path):
    # Across machines it is the default (tests/test_multihost_hierarchical.py); here there is
    # one machine, so shared memory serves every rank and rank 0 says why once.
    proc, reports = _run(
        tmp_path, 2, {**_no_scaleout_twins(), "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    )
    assert (
        proc.stderr.count(
            "SCALEOUT_HIERARCHICAL_ALLREDUCE=1, but every rank is on one "
            "machine: allreduces are not hierarchical"
        )
        == 1
    ), proc.stderr
    for report in reports:
        assert report["config"]["SCALEOUT_HIERARCHICAL_ALLREDUCE"] == "1"
        assert (
            report["config"]["SCALEOUT_HIERARCHICAL_ALLREDUCE.source"]
            == "HOROVOD_HIERARCHICAL_ALLREDUCE"
        )
        assert report["config"]["allreduce_algorithm"] == "shared memory"
        assert report["plan"]["allreduce"] == "shared_memory"  # Note [Algorithm plan]


@pytest.mark.parametrize("var", ["HOROVOD_LOG_LEVEL", "SCALEOUT_LOG_LEVEL"])
def test_a_bad_log_level_fails_init_naming_the_variable(tmp_path, var):
    proc, _ = _run(tmp_path, 2, {var: "loud"}, check=False)
    assert proc.returncode != 0
    assert f"{var}='loud' is not a log level" in proc.stdout + proc.stderr
