"""Run by tests/test_liveness.py::test_survivors_name_the_dead_rank,
tests/test_liveness.py::test_a_death_inside_a_collective_ends_it,
tests/test_liveness.py::test_a_death_beside_the_fast_lane_is_named,
tests/test_multihost.py::test_a_rank_dying_on_another_host_is_named,
tests/test_slurm.py::test_srun_a_killed_rank_is_named,
tests/test_slurm.py::test_salloc_scaleoutrun_names_a_dead_rank.

A rank dies (kill -9 style) after init, under a launcher that leaves the survivors running
(mpiexec -disable-auto-cleanup). Every survivor's pending collective, and every later one,
fails within seconds with ShutDownError (a HorovodInternalError) naming the dead rank, its pid
and its host (Note [Liveness]); then the survivor leaves normally, without hanging in
MPI_Finalize.

argv[1]: which rank dies: "last" or "zero".
argv[2]: "idle": the victim dies between collectives, the survivors then wait in negotiation;
         "busy": it dies while every rank runs large allgathers back to back, so survivors are
         inside the data plane (MPI) when it goes;
         "lane": it dies while every rank runs small synchronous allreduces back to back, most
         of them on the fast lane (Note [Fast lane]), so survivors wait on the lane when it goes.
"""

import os
import socket
import sys
import threading
import time

import numpy as np
from _harness import check, expect_error, failures

import scaleout as so

so.init()
r, n = so.rank(), so.size()
victim = n - 1 if sys.argv[1] == "last" else 0
mode = sys.argv[2]
pids = so.allgather_object((os.getpid(), socket.gethostname()))
so.allreduce(np.ones(4), name="before")
pid, host = pids[victim]
fragment = f"rank {victim} (pid {pid} on {host}) died"
start = time.monotonic()
if mode == "idle":
    if r == victim:
        os._exit(9)
    try:
        so.allreduce(np.ones(4), name="pending")
        check(False, "the collective waiting for the dead rank: no error")
    except so.HorovodInternalError as exc:
        check(fragment in str(exc), f"the collective waiting for the dead rank: {exc}")
        # Note [Error details]: the culprit as data, for the launcher
        check(exc.culprit_ranks == (victim,), f"culprits of {exc!r}: {exc.culprit_ranks}")
elif mode == "lane":
    x = np.ones(16, np.float32)
    if r == victim:
        threading.Timer(0.5, lambda: os._exit(9)).start()
    try:
        calls = 0
        while time.monotonic() - start < 60:
            so.allreduce_(x, name="lane", op=so.Max)
            calls += 1
        check(False, f"no error within 60 s of small allreduces ({calls} calls)")
    except so.HorovodInternalError as exc:
        check(fragment in str(exc), f"the small allreduce's error names the dead rank: {exc}")
        check(exc.culprit_ranks == (victim,), f"culprits of {exc!r}: {exc.culprit_ranks}")
    lane = so.stats()["collectives"]["allreduce"]["lane_calls"]
    check(lane > 0, f"the loop ran on the lane before the death ({lane} calls there)")
else:
    big = np.ones(1 << 21)  # 16 MiB from every rank
    if r == victim:
        threading.Timer(0.5, lambda: os._exit(9)).start()
    try:
        rounds = 0
        while time.monotonic() - start < 60:
            so.allgather(big, name="busy")
            rounds += 1
        check(False, f"no error within 60 s of busy allgathers ({rounds} rounds)")
    except so.HorovodInternalError as exc:
        check(fragment in str(exc), f"the busy allgather's error names the dead rank: {exc}")
        check(exc.culprit_ranks == (victim,), f"culprits of {exc!r}: {exc.culprit_ranks}")
expect_error(
    so.ShutDownError,
    lambda: so.allreduce(np.ones(4), name="later"),
    fragment,
    what="a later collective",
)
print(
    f"rank {r}: survived the death of rank {victim} in {time.monotonic() - start:.1f} s", flush=True
)
print(f"rank {r}: {'checks failed' if failures else 'all checks passed'}", flush=True)
meeting = os.environ.get("PEER_DEATH_MEETING")
if meeting:
    # Slurm's pmix plugin ends the step when a task leaves without finalising PMIx: under
    # srun --mpi=pmix the first survivor to leave would end the others before they report.
    # tests/test_slurm.py holds the survivors here (a Unix socket: the hosts share /tmp)
    # until every one has reported.
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)  # the test lets everyone go after 40 s
        s.connect(meeting)
        try:
            s.recv(1)
        except TimeoutError:
            pass
# A normal exit: scaleout leaves without MPI_Finalize, which would wait for the dead rank.
sys.exit(1 if failures else 0)
