"""A PMI-1 server for ranks that no MPI launcher started (Note [PMI bootstrap]).

Run by path (it imports nothing of scaleout, so the package's imports do not slow its start):

    python _pmi_server.py --size N [--host ADDRESS] [--advertise ADDRESS] [--mapping M]
                          [--watch-fd FD]

It listens on a free TCP port of ADDRESS (default: every address), prints `host:port` on a line
of its own to stdout once it listens, and then serves the N MPI processes that connect to it
(scaleout/_pmi_bootstrap.py hands each its connection as PMI_FD): the PMI-1 wire protocol's
commands that MPI_Init, MPI_Finalize and MPI_Abort use (init, get_maxes, get_appnum,
get_my_kvsname, get_universe_size, put, get, barrier_in, finalize, abort), over one key-value
space, with Hydra's limits (keys of 64 bytes, values of 1024: MPICH's client reads a reply
line of at most 1024). It exits when every rank has finalized and closed its connection; when a
rank aborts, or closes its connection without finalizing (it died): then it closes every other
connection first, so that the ranks still in MPI_Init or a PMI barrier fail instead of waiting
forever, as Hydra ends a job; or, at the latest, --grace seconds (30) after the process that
started it went away (the read end of a pipe, --watch-fd, reaches its end), so that no server
outlives its job.
"""

from __future__ import annotations

import os
import sys

# Run by path, this file's directory (the scaleout package) would come first on sys.path, and
# its modules would shadow the standard library's (scaleout/_compression.py).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]

import argparse  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Optional  # noqa: E402

# What MPI_Init reads to size its buffers: a key-value space's name, a key and a value at most.
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024


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
        self.started: set = set()  # connections that sent init
        self.finalized: set = set()
        self.ended = 0  # ranks that finalized and closed
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
            self.started.add(conn)
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
            self.finalized.add(conn)
            self.reply(conn, "cmd=finalize_ack rc=0")
        elif cmd == "abort":
            self.end_job(f"a rank aborted the job: {line.strip()}")
        else:
            self.reply(conn, f"cmd={cmd or 'unknown'} rc=-1 msg=unsupported_command")

    def end_job(self, why: str) -> None:
        """Closes every connection (the ranks' PMI calls then fail instead of waiting)."""
        sys.stderr.write(f"scaleout PMI server: {why}; ending the job's PMI connections\n")
        for conn in list(self.buffers):
            conn.close()
        self.buffers.clear()
        self.exit_code = 1
        self.done = True

    def closed(self, conn: socket.socket) -> None:
        self.buffers.pop(conn, None)
        conn.close()
        if conn in self.started and conn not in self.finalized:
            self.end_job("a rank closed its connection without finalizing (it died)")
        elif conn in self.started:
            self.ended += 1
            self.done = self.ended == self.size

    def serve(self, listener: socket.socket, watch_fd: Optional[int], grace: float) -> int:
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        if watch_fd is not None:
            sel.register(watch_fd, selectors.EVENT_READ, "watch")
        deadline = None
        while not self.done:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = sel.select(timeout)
            if deadline is not None and time.monotonic() >= deadline:
                return self.exit_code
            for key, _ in events:
                if self.done:
                    break
                if key.data == "listen":
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.buffers[conn] = b""
                    sel.register(conn, selectors.EVENT_READ, "rank")
                elif key.data == "watch":
                    if not os.read(watch_fd, 4096):  # the starting process is gone
                        sel.unregister(watch_fd)
                        deadline = time.monotonic() + grace
                else:
                    conn = key.fileobj
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(conn)
                        self.closed(conn)
                        continue
                    pending = self.buffers[conn] + data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        self.handle(conn, line.decode(errors="replace"))
                    if conn in self.buffers:
                        self.buffers[conn] = pending
        return self.exit_code


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, required=True, help="ranks that will connect")
    p.add_argument("--host", default="", help="address to listen on (default: every address)")
    p.add_argument("--advertise", default="", help="address to print (default: --host)")
    p.add_argument("--mapping", default="", help="PMI_process_mapping to give the ranks")
    p.add_argument("--watch-fd", type=int, default=None, help="exit when this fd reaches its end")
    p.add_argument("--grace", type=float, default=30.0, help="seconds to serve after that")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the ranks' to handle
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, 0))
    listener.listen(max(16, args.size))
    port = listener.getsockname()[1]
    print(f"{args.advertise or args.host or '127.0.0.1'}:{port}", flush=True)
    return Server(args.size, args.mapping or None).serve(listener, args.watch_fd, args.grace)


if __name__ == "__main__":
    sys.exit(main())
