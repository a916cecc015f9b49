"""Run by tests/test_elastic.py::test_a_rank_killed_while_it_writes_a_commit.

Runs a script (argv[2:]) with one host's copy of commit argv[1] torn: in the elastic job's
first generation, rank 0 (which writes its host's copy) writes half of it to the temporary file
and then kills itself (SIGKILL), as a host lost in the middle of a commit would. Used by
tests/test_elastic.py."""

import os
import runpy
import signal
import sys

from scaleout import _commit_store

torn = int(sys.argv[1])
script = sys.argv[2]
sys.argv = sys.argv[2:]
write = _commit_store.CommitStore.write


def tearing_write(self, commit_id, payload):
    if (
        commit_id == torn
        and os.environ.get("SCALEOUT_ELASTIC_GENERATION") == "0"
        and os.environ.get("PMI_RANK") == "0"
    ):
        data = b"".join(bytes(piece) for piece in payload)  # the commit's pieces
        with open(self.directory / ".writing-torn", "wb") as f:
            f.write(data[: len(data) // 2])
        print(
            f"rank {os.environ.get('PMI_RANK')}: killing itself while writing commit {torn}",
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)
    return write(self, commit_id, payload)


_commit_store.CommitStore.write = tearing_write
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script` does
runpy.run_path(script, run_name="__main__")
