"""A PMI-1 server for ranks that no MPI launcher started (Note [PMI bootstrap]).

Run by path (it imports nothing of scaleout, so the package's imports do not slow its start):

    python _pmi_server.py --size N [--host ADDRESS] [--watch-fd FD]

It listens on a free TCP port of ADDRESS (default: every address), prints `host:port` on a line
of its own to stdout once it listens, and then serves N MPI processes that connect to it (MPICH
and Intel MPI, given PMI_PORT=host:port, PMI_RANK and PMI_SIZE): the PMI-1 wire protocol's
commands that MPI_Init, MPI_Finalize and MPI_Abort use (init, get_maxes, get_appnum,
get_my_kvsname, get_universe_size, put, get, barrier_in, finalize, abort), over one key-value
space. It exits when every rank has finalized or closed its connection, when a rank aborts, or
when the process that started it goes away (the read end of a pipe, --watch-fd, reaches its
end), so that no server outlives its job.
"""

from __future__ import annotations

import os
import sys

# Run by path, this file's directory (the scaleout package) would come first on sys.path, and
# its modules would shadow the standard library's (scaleout/_compression.py).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]

import argparse  # noqa: E402
import selectors  # noqa: E402
import socket  # noqa: E402
from typing import Dict, List, Optional  # noqa: E402

# What MPI_Init reads to size its buffers: a key-value space's name, a key and a value at most.
KVSNAME_MAX = 256
KEYLEN_MAX = 256
VALLEN_MAX = 4096


def parse(line: str) -> Dict[str, str]:
    """'cmd=put kvsname=a key=b value=c' -> {'cmd': 'put', ...}. A value runs to the next space
    (PMI-1 values have none), except abort's message, which runs to the end of the line."""
    fields: Dict[str, str] = {}
    rest = line.strip()
    while rest:
        key, _, rest = rest.partition("=")
        key = key.strip()
        if key == "msg" or key == "mesg":
            fields[key] = rest
            break
        value, _, rest = rest.partition(" ")
        fields[key] = value
        rest = rest.lstrip()
    return fields


class Server:
    def __init__(self, size: int, mapping: Optional[str]):
        # Unique per job: MPICH names its shared-memory segments after it, and a segment a
        # crashed job left behind under the same name would be opened again.
        self.kvsname = f"scaleout_{os.getpid()}_{os.urandom(4).hex()}"
        self.size = size
        self.mapping = mapping
        self.kvs: Dict[str, str] = {}
        self.barrier: List[socket.socket] = []
        self.buffers: Dict[socket.socket, bytes] = {}
        self.finalized = 0
        self.closed = 0
        self.done = False
        self.exit_code = 0

    def reply(self, conn: socket.socket, text: str) -> None:
        try:
            conn.sendall(text.encode() + b"\n")
        except OSError:
            pass  # the rank is gone; its closing connection ends the job below

    def handle(self, conn: socket.socket, line: str) -> None:
        msg = parse(line)
        cmd = msg.get("cmd", "")
        if cmd == "init":
            self.reply(conn, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0")
        elif cmd == "get_maxes":
            self.reply(
                conn,
                f"cmd=maxes rc=0 kvsname_max={KVSNAME_MAX} keylen_max={KEYLEN_MAX} "
                f"vallen_max={VALLEN_MAX}",
            )
        elif cmd == "get_appnum":
            self.reply(conn, "cmd=appnum rc=0 appnum=0")
        elif cmd == "get_my_kvsname":
            self.reply(conn, f"cmd=my_kvsname rc=0 kvsname={self.kvsname}")
        elif cmd == "get_universe_size":
            self.reply(conn, f"cmd=universe_size rc=0 size={self.size}")
        elif cmd == "put":
            self.kvs[msg.get("key", "")] = msg.get("value", "")
            self.reply(conn, "cmd=put_result rc=0")
        elif cmd == "get":
            key = msg.get("key", "")
            value = self.kvs.get(key)
            if value is None and key == "PMI_process_mapping" and self.mapping:
                value = self.mapping
            if value is None:
                self.reply(conn, "cmd=get_result rc=-1 msg=key_" + key + "_not_found")
            else:
                self.reply(conn, f"cmd=get_result rc=0 value={value}")
        elif cmd == "barrier_in":
            self.barrier.append(conn)
            if len(self.barrier) == self.size:
                for waiting in self.barrier:
                    self.reply(waiting, "cmd=barrier_out rc=0")
                self.barrier = []
        elif cmd == "finalize":
            self.reply(conn, "cmd=finalize_ack rc=0")
            self.finalized += 1
        elif cmd == "abort":
            sys.stderr.write(f"scaleout PMI server: a rank aborted the job: {line.strip()}\n")
            self.exit_code = 1
            self.done = True
        else:
            self.reply(conn, f"cmd={cmd or 'unknown'} rc=-1 msg=unsupported_command")

    def serve(self, listener: socket.socket, watch_fd: Optional[int]) -> int:
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        if watch_fd is not None:
            sel.register(watch_fd, selectors.EVENT_READ, "watch")
        while not self.done:
            for key, _ in sel.select():
                if key.data == "listen":
                    conn, _ = listener.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.buffers[conn] = b""
                    sel.register(conn, selectors.EVENT_READ, "rank")
                elif key.data == "watch":
                    if not os.read(watch_fd, 4096):
                        return self.exit_code  # the starting process is gone
                else:
                    conn = key.fileobj
                    data = conn.recv(65536)
                    if not data:
                        sel.unregister(conn)
                        conn.close()
                        del self.buffers[conn]
                        self.closed += 1
                        if self.closed == self.size:
                            return self.exit_code
                        continue
                    pending = self.buffers[conn] + data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        self.handle(conn, line.decode(errors="replace"))
                    self.buffers[conn] = pending
        return self.exit_code


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, required=True, help="ranks that will connect")
    p.add_argument("--host", default="", help="address to listen on (default: every address)")
    p.add_argument("--advertise", default="", help="address to print (default: --host)")
    p.add_argument("--mapping", default="", help="PMI_process_mapping to give the ranks")
    p.add_argument("--watch-fd", type=int, default=None, help="exit when this fd reaches its end")
    args = p.parse_args(argv)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, 0))
    listener.listen(max(16, args.size))
    port = listener.getsockname()[1]
    print(f"{args.advertise or args.host or '127.0.0.1'}:{port}", flush=True)
    return Server(args.size, args.mapping or None).serve(listener, args.watch_fd)


if __name__ == "__main__":
    sys.exit(main())
