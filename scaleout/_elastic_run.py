"""The worker's side of elastic training: `run(func)`, Horovod's `hvd.elastic.run`.

Note [Elastic restarts]
MPICH cannot start MPI again in a process, and a job that lost a rank cannot go on, so
scaleout's elastic training restarts the job: the elastic driver (scaleoutrun, Note [Elastic
driver] in launcher/elastic_driver.py) runs generation after generation of the job on the hosts
there are, and tells the ranks through the environment (written once for both ends in
scaleout/_elastic_protocol.py): SCALEOUT_ELASTIC_JOB (the job's id), SCALEOUT_ELASTIC_GENERATION
(0, 1, ...), SCALEOUT_ELASTIC_HOSTS (the generation's hosts and slots, in rank order),
SCALEOUT_ELASTIC_DRIVER and SCALEOUT_ELASTIC_TOKEN (where rank 0 hears of host changes) and, if
the user set it, SCALEOUT_ELASTIC_DIR (where each host keeps its commits, in a directory named
after it; default /dev/shm/scaleout-commits-<job>).
Under it,
`run(func)(state)`:
  - attaches the host's commit store to `state` (Note [Commit store]), so every commit is
    durable on every host, and on rank 0 listens for the driver's host updates
    (state.on_hosts_updated, which the next commit() or check_host_updates() turns into
    HostsUpdatedInterrupt on every rank);
  - resumes from the newest commit any host holds, if there is one (a restarted generation,
    perhaps with another number of ranks); in a restarted generation it then runs the reset
    callbacks (the user rescales the learning rate there, as with Horovod);
  - syncs the state from rank 0 and calls func(state);
  - when a peer fails (HorovodInternalError) or hosts change (HostsUpdatedInterrupt), the rank
    exits at once with code RESTART_EXIT_CODE, for the driver to start the next generation,
    which resumes from the last commit: what Horovod's restore + reset + sync does in place.
    (So what was done since the last commit is done again, also after an interrupt raised by
    a check_host_updates() of the user's own, where Horovod would go on from the live model.)
  - when func returns on every rank, the job's commits are removed: they were only there to
    survive a failure.
Without SCALEOUT_ELASTIC_JOB, run(func)(state) syncs and calls func once; errors propagate.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from typing import Any, Callable, Optional

from scaleout import _elastic_protocol as protocol
from scaleout import _runtime
from scaleout._commit_store import CommitStore
from scaleout._elastic_protocol import RESTART_EXIT_CODE
from scaleout._elastic_state import HostsUpdatedInterrupt, State
from scaleout._errors import PeerFailedError
from scaleout._ops import barrier

__all__ = ["run"]


def _store() -> Optional[CommitStore]:
    """This host's store (on its first rank; None elsewhere), under the elastic driver: a
    directory of its own under the job's, named after the host (so that hosts sharing a file
    system, or one machine's /dev/shm as the test hosts localhost and 127.0.0.1 do, keep
    apart copies, each written by one rank)."""
    job = protocol.job_id(os.environ)
    if job is None or _runtime.local_rank() != 0:
        return None
    return CommitStore(protocol.job_directory(job, os.environ) / _host_name())


def _host_name() -> str:
    """The name the driver knows this rank's host by, else the machine's name."""
    return protocol.host_of_rank(os.environ, _runtime.rank()) or socket.gethostname()


def _listen_for_host_updates(state: State) -> None:
    """On rank 0 under the driver: a thread that connects to the driver and passes its host
    updates to `state` (connecting in the thread: an address that does not answer must not
    hold up the training)."""
    where = protocol.driver_addresses(os.environ)
    if not where or _runtime.rank() != 0:
        return
    hello = protocol.hello(os.environ.get(protocol.TOKEN, ""), protocol.generation(os.environ))

    def listen() -> None:
        failures = []
        for address in where:
            host, _, port = address.rpartition(":")
            try:
                connection = socket.create_connection((host, int(port)), timeout=5)
                connection.sendall(hello)
                connection.settimeout(None)
                break
            except (OSError, ValueError) as exc:
                failures.append(f"{address}: {exc}")
        else:
            os.write(
                2,
                (
                    "scaleout elastic: rank 0 cannot reach scaleoutrun's driver ("
                    + "; ".join(failures)
                    + "): added hosts will not grow this job\n"
                ).encode(),
            )
            return
        with connection, connection.makefile("r") as lines:
            for line in lines:
                update = protocol.parse_update(line)
                if update is not None:
                    state.on_hosts_updated(*update)

    threading.Thread(target=listen, name="scaleout-host-updates", daemon=True).start()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a training function whose first argument is a State (Note [Elastic
    restarts]): `@hvd.elastic.run def train(state): ...`, then `train(state)`."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if protocol.job_id(os.environ) is None:
            state.sync()
            return func(state, *args, **kwargs)
        try:
            store = _store()
            state.attach_store(store)
            if state.resume() or protocol.generation(os.environ) > 0:
                state.on_reset()
            # After on_reset(), which empties the queue of host updates this thread fills.
            _listen_for_host_updates(state)
            state.sync()
            result = func(state, *args, **kwargs)
            _remove_commits(store)
            return result
        except (PeerFailedError, HostsUpdatedInterrupt) as cause:
            _restart(cause)

    return wrapper


def _remove_commits(store: Optional[CommitStore]) -> None:
    """Once func has returned on every rank (a barrier), each host's commits go."""
    barrier(name="scaleout.elastic.done")
    if store is not None:
        store.clear()
        if not os.environ.get(protocol.DIR):  # the job's directory is ours too
            try:
                store.directory.parent.rmdir()
            except OSError:
                pass  # another host's store in it is still being removed (one machine)


def _restart(cause: BaseException) -> None:
    if isinstance(cause, HostsUpdatedInterrupt):
        what = "HostsUpdatedInterrupt: the job's hosts changed"
    else:
        what = type(cause).__name__ + (f": {cause}" if str(cause) else "")
    sys.stdout.flush()
    sys.stderr.flush()
    # One write of the whole line: the ranks share the launcher's stderr.
    os.write(2, f"scaleout elastic: rank {_runtime.rank()} stops for a restart ({what})\n".encode())
    # MPI cannot finish cleanly with a peer gone; the next generation starts afresh.
    os._exit(RESTART_EXIT_CODE)
