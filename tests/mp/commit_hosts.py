"""Run by tests/test_multihost_hierarchical.py::test_a_commit_outlives_the_host_that_made_it.

Note [Commit store] across machines (run by tests/test_multihost_hierarchical.py): each
host's first rank keeps a copy of every commit in its own store; after hostA's copies are gone
(the host lost), the newest commit still comes back, from hostB. Prints one RESULT line.

argv[1]: a directory; each host keeps its store in <dir>/<its hostname>."""

import json
import socket
import sys
from pathlib import Path

import scaleout as so
from scaleout._commit_protocol import commit, newest_commit
from scaleout._commit_store import CommitStore

so.init()
r = so.rank()
failures = []
store = CommitStore(Path(sys.argv[1]) / socket.gethostname())
for i in range(3):
    commit(store if so.local_rank() == 0 else None, i, f"state {i}".encode() * 1000)
got = newest_commit(store)
if got is None or (got[0], bytes(got[1])) != (2, b"state 2" * 1000):
    failures.append(f"newest commit: {None if got is None else got[0]}")
held = so.allgather_object(store.complete() if so.local_rank() == 0 else None)
if [h for h in held if h is not None] != [[1, 2]] * so.cross_size():
    failures.append(f"each host keeps the newest two: {held}")
so.barrier()
if socket.gethostname() == "hostA" and so.local_rank() == 0:
    for entry in store.directory.iterdir():  # hostA is lost
        entry.unlink()
so.barrier()
got = newest_commit(store)
if got is None or (got[0], bytes(got[1])) != (2, b"state 2" * 1000):
    failures.append(f"after hostA's copies went: {None if got is None else got[0]}")
print("RESULT " + json.dumps({"failures": failures}), flush=True)
so.shutdown()
