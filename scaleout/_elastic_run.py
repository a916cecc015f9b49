"""The worker's side of elastic training: `run(func)` (groundwork for issue 14; not yet exported:
the driver that restarts jobs is not written yet).

Note [Elastic restarts]
MPICH cannot start MPI again in a process, and a job that lost a rank cannot go on, so
scaleout's elastic training restarts the job: the elastic driver (scaleoutrun, to come) runs
generation after generation of the job on the hosts there are, and tells the ranks through the
environment (SCALEOUT_ELASTIC_JOB: the job's id; SCALEOUT_ELASTIC_DIR: where each host keeps
its commits, default /dev/shm/scaleout-commits-<job>). Under it, `run(func)(state)`:
  - attaches the host's commit store to `state` (Note [Commit store]), so every commit is
    durable on every host;
  - resumes from the newest commit any host holds, if there is one (a restarted generation,
    perhaps with another number of ranks), and then runs the reset callbacks (the user rescales
    the learning rate there, as with Horovod);
  - syncs the state from rank 0 and calls func(state);
  - when a peer fails (HorovodInternalError) or hosts change (HostsUpdatedInterrupt, raised by a
    commit after its save), the rank exits at once with code RESTART_EXIT_CODE, for the driver
    to start the next generation, which resumes from the last commit: what Horovod's restore +
    reset + sync does in place.
Without SCALEOUT_ELASTIC_JOB, run(func)(state) syncs and calls func once; errors propagate.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional

from scaleout import _basics
from scaleout._commit_store import CommitStore, default_directory
from scaleout._elastic_state import HostsUpdatedInterrupt, State
from scaleout._errors import PeerFailedError

__all__ = ["run", "RESTART_EXIT_CODE"]

RESTART_EXIT_CODE = 75  # EX_TEMPFAIL: run this job again


def _store() -> Optional[CommitStore]:
    """This host's store (on its first rank; None elsewhere), under the elastic driver."""
    job = os.environ.get("SCALEOUT_ELASTIC_JOB")
    if job is None or _basics.local_rank() != 0:
        return None
    directory = os.environ.get("SCALEOUT_ELASTIC_DIR") or default_directory(job)
    return CommitStore(directory)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a training function whose first argument is a State (Note [Elastic
    restarts])."""
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if os.environ.get("SCALEOUT_ELASTIC_JOB") is None:
            state.sync()
            return func(state, *args, **kwargs)
        state.attach_store(_store())
        if state.resume():
            state.on_reset()
        state.sync()
        try:
            return func(state, *args, **kwargs)
        except (PeerFailedError, HostsUpdatedInterrupt) as cause:
            _restart(cause)
    return wrapper


def _restart(cause: BaseException) -> None:
    what = type(cause).__name__ + (f": {cause}" if str(cause) else "")
    sys.stdout.flush()
    sys.stderr.flush()
    # One write of the whole line: the ranks share the launcher's stderr.
    os.write(2, f"scaleout elastic: rank {_basics.rank()} stops for a restart ({what})\n"
             .encode())
    # MPI cannot finish cleanly with a peer gone; the next generation starts afresh.
    os._exit(RESTART_EXIT_CODE)
