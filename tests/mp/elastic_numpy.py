"""Run by tests/test_mpi_flavours.py::test_an_elastic_job_survives_a_killed_rank and
tests/test_elastic.py::test_a_worker_that_raises_is_a_failure_of_its_host.

An elastic job with no framework (scaleout's ObjectState, numpy), so that it runs on any MPI's
venv: 24 steps, each an allreduce of every rank's (rank + 1) and a commit. KILL=rank:step makes
that rank kill itself (SIGKILL) before that step's commit, in the first generation.
RAISE=worker:step makes the worker whose HOROVOD_RANK is `worker` raise an exception there,
in whichever generation it runs, as a Horovod script that picks a worker by its HOROVOD_RANK
would (that identity survives restarts: Note [horovodrun's rank variables]). At the end rank 0
prints the steps done and the world size each step ran at."""

import json
import os
import signal

import numpy as np

import scaleout as so
from scaleout._elastic_run import run
from scaleout._elastic_state import ObjectState

so.init()
STEPS = 24
kill_rank, kill_step = (int(x) for x in os.environ.get("KILL", "-1:-1").split(":"))
raise_worker, raise_step = os.environ.get("RAISE", "-:-1").split(":")
if os.environ.get("SCALEOUT_ELASTIC_GENERATION", "0") != "0":
    kill_rank = -1

state = ObjectState(step=0, sizes=[])


@run
def train(state):
    while state.step < STEPS:
        total = so.allreduce(np.array([so.rank() + 1.0]), op=so.Sum, name=f"step.{state.step}")
        n = so.size()
        assert total[0] == n * (n + 1) / 2, (total, n)
        if so.rank() == kill_rank and state.step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("HOROVOD_RANK") == raise_worker and state.step == int(raise_step):
            raise RuntimeError(
                f"worker {raise_worker} (rank {so.rank()}) raises at step {state.step}"
            )
        state.sizes = state.sizes + [n]
        state.step += 1
        state.commit()
    return state


train(state)
if so.rank() == 0:
    print("RESULT " + json.dumps({"step": state.step, "sizes": state.sizes}), flush=True)
