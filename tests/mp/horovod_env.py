"""Run by tests/test_horovod_env.py::test_horovod_variables_are_read_and_named_as_sources,
tests/test_horovod_env.py::test_scaleout_variable_wins_and_the_loser_is_named,
tests/test_horovod_env.py::test_horovod_variables_without_effect_are_named_once_on_rank_0,
tests/test_horovod_env.py::test_hierarchical_allreduce_asked_for_on_one_machine_says_why,
tests/test_horovod_env.py::test_a_bad_log_level_fails_init_naming_the_variable.

Reports what the core read from the environment, for tests/test_horovod_env.py: each rank
writes <argv[1]>/rank<r>.json with config() and the CPUs each of its threads may run on."""

import json
import os
import sys
from pathlib import Path

import numpy as np
from _harness import check_close, main

import scaleout as so
from scaleout import _binding


def thread_cpus() -> dict:
    cpus = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            cpus[tid] = sorted(os.sched_getaffinity(int(tid)))
        except OSError:  # the thread ended meanwhile
            pass
    return cpus


def run():
    report = {
        "config": so.config(),
        "plan": _binding.algorithms(),
        "local_rank": so.local_rank(),
        "threads": thread_cpus(),
    }
    (Path(sys.argv[1]) / f"rank{so.rank()}.json").write_text(json.dumps(report))
    check_close(
        so.allreduce(np.ones(3), op=so.Sum, name="env.sum"),
        np.full(3, so.size()),
        "collectives work with the Horovod variables set",
    )


if __name__ == "__main__":
    main(run)
