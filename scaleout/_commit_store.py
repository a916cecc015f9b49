"""A host's copies of an elastic job's commits (Note [Elastic restarts] uses them). The
collective protocol that writes and finds them on every host is scaleout._commit_protocol's;
this module loads no native code (the launcher uses it).

Note [Commit store]
A commit must outlive the host that made it, so every host keeps a copy: one rank per host
writes the committed state's bytes into the host's store, and only once every host's copy is
written (an allreduce of the outcome, done by the caller) is the commit marked complete there.
A restarted job resumes from the newest commit that any surviving host holds complete. The
store is a directory (by default in /dev/shm: it survives the death of the processes, not of
the host):

    commit-<id>.bin     the state's bytes, written to a temporary name and renamed (a reader
                        never sees a partial file, also if the writer is killed mid-write)
    commit-<id>.done    the mark: every host had written <id>

Only the newest `keep` commits are kept. Ids increase; a commit that is written but never
marked (the job failed between writing and the mark) is ignored and pruned.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence, Union

from scaleout._errors import InvalidArgumentError

__all__ = ["CommitStore"]

_NAME = re.compile(r"^commit-(\d+)\.(bin|done)$")
Buffer = Union[bytes, bytearray, memoryview]


class CommitStore:
    """The commits under `directory` (made if missing)."""

    def __init__(self, directory: Union[str, Path], keep: int = 2) -> None:
        if keep < 1:
            raise InvalidArgumentError(f"CommitStore keeps at least one commit, not {keep}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def _path(self, commit_id: int, kind: str) -> Path:
        return self.directory / f"commit-{commit_id}.{kind}"

    def write(self, commit_id: int, payload: Union[Buffer, Sequence[Buffer]]) -> Path:
        """Writes commit `commit_id`'s bytes (one buffer, or pieces one after the other)
        atomically (not yet marked complete)."""
        if commit_id < 0:
            raise InvalidArgumentError(f"commit ids are >= 0, not {commit_id}")
        pieces = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        target = self._path(commit_id, "bin")
        fd, temporary = tempfile.mkstemp(prefix=".writing-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                for piece in pieces:
                    f.write(piece)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return target

    def mark_complete(self, commit_id: int) -> None:
        """Marks `commit_id` complete (its bytes must be here) and prunes older commits. One
        writer per store (a host's first rank)."""
        if not self._path(commit_id, "bin").exists():
            raise InvalidArgumentError(f"commit {commit_id} was not written here")
        self._path(commit_id, "done").touch()
        self.prune()

    def complete(self) -> List[int]:
        """The complete commits' ids, oldest first."""
        return sorted(i for i in self._ids("done") if self._path(i, "bin").exists())

    def newest_complete(self) -> Optional[int]:
        done = self.complete()
        return done[-1] if done else None

    def read(self, commit_id: int) -> bytearray:
        """A complete commit's bytes (writable: what is loaded from them may be a view)."""
        if commit_id not in self.complete():
            raise InvalidArgumentError(f"no complete commit {commit_id} in {self.directory}")
        path = self._path(commit_id, "bin")
        data = bytearray(path.stat().st_size)
        with open(path, "rb") as f:
            f.readinto(data)
        return data

    def prune(self) -> None:
        """Keeps the newest `keep` complete commits and any newer one (being written); an
        unmarked commit older than the newest complete one failed, and goes too."""
        done = self.complete()
        if not done:
            return
        kept, newest = set(done[-self.keep :]), done[-1]
        for commit_id in self._ids("bin") | self._ids("done"):
            if commit_id not in kept and commit_id < newest:
                for kind in ("bin", "done"):
                    self._path(commit_id, kind).unlink(missing_ok=True)
        # What a writer killed mid-write left (one writer per store: none is running now).
        for entry in self.directory.glob(".writing-*"):
            entry.unlink(missing_ok=True)

    def clear(self) -> None:
        """Removes every commit (and the directory, when nothing else is in it)."""
        for entry in self.directory.iterdir():
            if _NAME.match(entry.name) or entry.name.startswith(".writing-"):
                entry.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # something of someone else's is there too

    def _ids(self, kind: str) -> set:
        found = set()
        for entry in self.directory.iterdir():
            match = _NAME.match(entry.name)
            if match and match.group(2) == kind:
                found.add(int(match.group(1)))
        return found
