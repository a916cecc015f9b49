"""Ranks configured with different endpoint-server counts get an error on every rank."""
import os

from mpi4py import MPI

os.environ["SCALEOUT_EP_SERVERS"] = str(1 + MPI.COMM_WORLD.rank)
import scaleout as so  # noqa: E402

try:
    so.init()
except so.InvalidArgumentError as e:
    print(e, flush=True)
