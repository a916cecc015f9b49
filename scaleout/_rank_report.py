"""What a rank tells scaleoutrun besides its output, as data (Note [Rank reports]).

Note [Rank reports]
scaleoutrun names the rank that failed first in cause, not the first rank to end (the others
end because of it). So that it never reads that from the English of a rank's error, the rank
sends it as a record:
  - the rank wrapper (launcher/rank_exec.py), the parent of the user's program, binds a Unix
    datagram socket and names it in the program's environment, in VARIABLE ("@name": Linux's
    abstract namespace, which leaves no file behind);
  - the program sends each record as one datagram: a JSON object, e.g. the culprits of an error
    of scaleout's core (scaleout._errors.from_core calls report_culprits):
        {"error": "ShutDownError", "culprit_ranks": [1, 2]}
  - the wrapper forwards each on its stderr as one line, "scaleoutrun: rank R reports <record>"
    (launcher/exit_report.py), beside its other reports, and scaleoutrun's relay
    (launcher/relay.py) reads them with decode(); a record naming culprits makes rank R's end a
    consequence of theirs.
Without VARIABLE (a program not started by scaleoutrun) nothing is sent. Sending never blocks
nor raises: a record that cannot be sent is dropped, and the job goes on as it would.

Pure: the standard library only; the rank wrapper, which must not import scaleout, is told
VARIABLE's name on its command line.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Mapping, Optional, Sequence

__all__ = ["VARIABLE", "MAX_RECORD", "report_culprits", "send", "encode", "decode", "culprit_ranks"]

VARIABLE = "SCALEOUT_RANK_REPORT"
MAX_RECORD = 4096  # bytes; a longer record is not sent

_last_sent: Optional[bytes] = None


def encode(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def decode(text: str) -> Optional[dict]:
    """The record a forwarded line carries, or None when it is not a JSON object."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def culprit_ranks(record: Mapping[str, Any]) -> tuple[int, ...]:
    """The ranks a record blames (none when it blames none, or says something else)."""
    ranks = record.get("culprit_ranks")
    if not isinstance(ranks, list):
        return ()
    return tuple(rank for rank in ranks if isinstance(rank, int) and rank >= 0)


def report_culprits(error: str, culprits: Sequence[int]) -> None:
    """Tells scaleoutrun that an error (`error`, its class's name) blames `culprits`."""
    if culprits:
        send({"error": error, "culprit_ranks": sorted(set(culprits))})


def send(record: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> None:
    """Sends `record` to the rank wrapper, when there is one; the same record twice in a row
    only once (every pending collective fails with the same error)."""
    global _last_sent
    where = environ.get(VARIABLE)
    data = encode(record)
    if not where or data == _last_sent or len(data) > MAX_RECORD:
        return
    address = "\0" + where[1:] if where.startswith("@") else where
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as channel:
            channel.setblocking(False)
            channel.sendto(data, address)
        _last_sent = data
    except OSError:
        pass  # no wrapper listening (any more), or its queue is full
