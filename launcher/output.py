"""Rank-prefixed output: whole lines only, so ranks' lines never interleave mid-line."""
from __future__ import annotations

import os

__all__ = ["LinePrefixer", "write_all"]


class LinePrefixer:
    """Turns a byte stream into lines that start with a prefix such as b"[3] ".

    A partial line is held until its newline arrives (or it grows past max_pending, when it
    is let through so a program printing no newlines cannot fill memory); finish() emits the
    rest with a newline added.
    """

    def __init__(self, prefix: bytes, max_pending: int = 1 << 16):
        self.prefix = prefix
        self.max_pending = max_pending
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        data = self._pending + data
        end = data.rfind(b"\n") + 1
        complete, self._pending = data[:end], data[end:]
        out = b"".join(self.prefix + line + b"\n" for line in complete.split(b"\n")[:-1])
        if len(self._pending) > self.max_pending:
            out += self.prefix + self._pending + b"\n"
            self._pending = b""
        return out

    def finish(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self.prefix + rest + b"\n" if rest else b""


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
