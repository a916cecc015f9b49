"""Run by tests/test_endpoint_servers.py::test_ranks_must_agree_on_how_they_communicate.

Ranks configured differently (argument: the variable; each rank sets its own value) get an
error naming the variable on every rank, not a hang."""

import os
import sys

from mpi4py import MPI

variable = sys.argv[1]
rank = MPI.COMM_WORLD.rank
os.environ[variable] = {
    "SCALEOUT_EP_SERVERS": str(1 + rank),
    "SCALEOUT_SHM": str(rank % 2),
    "SCALEOUT_SHM_AREA": str(4096 * (1 + rank)),
    "SCALEOUT_HIERARCHICAL_ALLREDUCE": ["auto", "0", "1"][rank % 3],
    "SCALEOUT_HIERARCHICAL_ALLGATHER": ["0", "auto", "0"][rank % 3],
}[variable]
import scaleout as so  # noqa: E402

try:
    so.init()
except so.InvalidArgumentError as e:
    print(e, flush=True)
