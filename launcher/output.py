"""Rank-prefixed output: whole lines only, so ranks' lines never interleave mid-line; the
timestamp horovodrun's --prefix-output-with-timestamp puts before them; and where
--output-filename puts each rank's copy."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

__all__ = ["LinePrefixer", "write_all", "horovod_timestamp", "rank_output_dir"]


def horovod_timestamp(now: Optional[float] = None) -> bytes:
    """The local time as horovodrun (and Open MPI's --timestamp-output) writes it before a
    line: C's asctime, e.g. b"Tue Jun 13 10:00:00 2023", followed directly by the tag."""
    return time.asctime(time.localtime(now)).encode()


class LinePrefixer:
    """Turns a byte stream into lines that start with a prefix such as b"[3] ".

    With a clock, each line starts with clock() before the prefix (one reading for the lines
    of one feed). A partial line is held until its newline arrives (or it grows past
    max_pending, when it is let through so a program printing no newlines cannot fill memory);
    finish() emits the rest with a newline added.
    """

    def __init__(
        self, prefix: bytes, max_pending: int = 1 << 16, clock: Optional[Callable[[], bytes]] = None
    ):
        self.prefix = prefix
        self.max_pending = max_pending
        self.clock = clock
        self._pending = b""

    def _prefix(self) -> bytes:
        return self.clock() + self.prefix if self.clock is not None else self.prefix

    def feed(self, data: bytes) -> bytes:
        data = self._pending + data
        end = data.rfind(b"\n") + 1
        complete, self._pending = data[:end], data[end:]
        if not complete and len(self._pending) <= self.max_pending:
            return b""
        prefix = self._prefix()
        out = b"".join(prefix + line + b"\n" for line in complete.split(b"\n")[:-1])
        if len(self._pending) > self.max_pending:
            out += prefix + self._pending + b"\n"
            self._pending = b""
        return out

    def finish(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._prefix() + rest + b"\n" if rest else b""


def rank_output_dir(directory: str, rank: int, size: int) -> str:
    """Where --output-filename puts a rank's stdout and stderr files: DIR/1/rank.N, the layout
    of Open MPI's mpirun --output-filename that horovodrun hands it to (1: the first job of the
    launch), N padded with zeros to the width of the last rank so listings sort by rank."""
    width = len(str(max(size - 1, 0)))
    return os.path.join(directory, "1", f"rank.{rank:0{width}d}")


def write_all(fd: int, data: bytes) -> bool:
    """Writes all of data to fd; False when the reader is gone (the output is dropped)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            return False
        view = view[written:]
    return True
