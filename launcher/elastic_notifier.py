"""The driver's end of the host-update channel to each generation's rank 0 (the protocol,
both ends' part of it, is scaleout/_elastic_protocol.py; the rank's end is in
scaleout/_elastic_run.py), and the addresses the ranks are given to reach it."""

from __future__ import annotations

import fcntl
import socket
import struct
import threading
import time
from typing import Optional, Sequence

from scaleout import _elastic_protocol as protocol

__all__ = ["Notifier", "driver_addresses"]


class Notifier:
    """The driver's end of the host-update channel: each generation's rank 0 connects and says
    hello; the driver keeps the connection of the running generation's rank 0 only, and writes
    it the host updates of that generation (one kept for it until it connects)."""

    def __init__(self, addresses: Sequence[str]):
        self.token = protocol.new_token()
        self._server = socket.create_server(("0.0.0.0", 0), backlog=16)
        self.port = self._server.getsockname()[1]
        self.addresses = list(addresses)
        self._lock = threading.Lock()
        self._generation = -1
        self._connection: Optional[socket.socket] = None
        self._pending: Optional[bytes] = None
        self._last_timestamp = 0
        threading.Thread(target=self._accept, name="scaleout-notifier", daemon=True).start()

    def rank_environment(self, generation: int) -> dict[str, str]:
        return protocol.driver_environment(self.addresses, self.port, self.token, generation)

    def start_generation(self, generation: int) -> None:
        with self._lock:
            self._drop()
            self._generation, self._pending = generation, None

    def notify(self, flags: int, generation: int) -> None:
        """Tells generation `generation`'s rank 0 (now, or once it connects) that hosts
        changed; nothing once another generation has started."""
        with self._lock:
            if generation != self._generation:
                return  # a discovery that ran as the last generation ended
            self._last_timestamp = max(int(time.time()), self._last_timestamp + 1)
            line = protocol.update_line(self._last_timestamp, flags)
            if self._connection is None or not self._send(line):
                self._pending = line

    def close(self) -> None:
        with self._lock:
            self._drop()
        self._server.close()

    def _send(self, line: bytes) -> bool:
        try:
            self._connection.sendall(line)
            return True
        except OSError:
            self._drop()
            return False

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                connection.settimeout(10)
                hello = b""
                while not hello.endswith(b"\n") and len(hello) < protocol.HELLO_LIMIT:
                    part = connection.recv(protocol.HELLO_LIMIT)
                    if not part:
                        break
                    hello += part
                token, generation = protocol.parse_hello(hello)
            except OSError:
                connection.close()
                continue
            with self._lock:
                if token != self.token or generation != str(self._generation):
                    connection.close()  # a stranger, or a generation that has ended
                    continue
                self._drop()
                self._connection = connection
                if self._pending is not None and self._send(self._pending):
                    self._pending = None


def _interface_address(name: str) -> Optional[str]:
    """The IPv4 address of network interface `name` (SIOCGIFADDR), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def driver_addresses(interfaces: Sequence[str]) -> list[str]:
    """Where the ranks can reach this machine: the addresses of --network-interfaces, else
    those its host name resolves to, then its interfaces'; 127.0.0.1 last, for ranks on this
    machine."""
    if interfaces:
        found = [address for address in map(_interface_address, interfaces) if address]
    else:
        try:
            found = socket.gethostbyname_ex(socket.gethostname())[2]
        except OSError:
            found = []
        # A name may resolve to a loopback address only (127.0.1.1 on Debian): every
        # interface's address then, rank 0 tries them in turn.
        found += [
            address for _, name in socket.if_nameindex() if (address := _interface_address(name))
        ]
    outside = [address for address in found if not address.startswith("127.")]
    return list(dict.fromkeys(outside)) + ["127.0.0.1"]
