"""Run by tests/test_elastic.py::test_a_worker_that_raises_is_a_failure_of_its_host.

Runs a script (argv[3:]) in which the worker whose HOROVOD_RANK is argv[1] raises an exception
at its commit number argv[2], as a Horovod script that picks a worker by its HOROVOD_RANK
would: that worker's identity survives restarts (Note [horovodrun's rank variables]), so once
its host is blacklisted no worker of a later generation raises."""

import os
import runpy
import sys

import scaleout.torch as hvd

worker, at = sys.argv[1], int(sys.argv[2])
script = sys.argv[3]
sys.argv = sys.argv[3:]
commit = hvd.elastic.TorchState.commit
commits = 0


def raising_commit(self):
    global commits
    commits += 1
    if os.environ.get("HOROVOD_RANK") == worker and commits == at:
        raise RuntimeError(f"worker {worker} (rank {hvd.rank()}) raises at its commit {at}")
    return commit(self)


hvd.elastic.TorchState.commit = raising_commit
runpy.run_path(script, run_name="__main__")
