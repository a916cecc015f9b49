"""Where an elastic job's hosts come from (the driver, elastic_driver.py, asks): the discovery
script, run by the shell (or the fixed hosts of -H/--hostfile), and HostWatch, which runs it
every second in a thread."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Callable, Optional, Sequence

from .config import LaunchConfig
from .elastic_plan import parse_discovery
from .errors import UsageError
from .exit_report import RankExit
from .hosts import HostSlots, parse_host_list, read_hostfile

__all__ = ["Discovery", "DiscoveryError", "HostWatch", "DISCOVERY_INTERVAL", "say"]

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script, as Horovod's
DISCOVERY_TIME_LIMIT = 60.0  # the longest one run of the script may take


def say(message: str) -> None:
    """A line from the elastic driver."""
    print(f"scaleoutrun: elastic: {message}", file=sys.stderr, flush=True)


class DiscoveryError(Exception):
    """The discovery script failed or printed what is not a host list."""


class Discovery:
    """Where the hosts come from: the discovery script (run by the shell), or fixed hosts."""

    def __init__(
        self,
        script: Optional[str],
        slots_per_host: int,
        fixed: Optional[Sequence[HostSlots]] = None,
    ):
        self.script = script
        self.slots_per_host = slots_per_host
        self.fixed = list(fixed) if fixed is not None else None

    @classmethod
    def from_config(cls, config: LaunchConfig) -> "Discovery":
        slots = config.slots_per_host or 1
        if config.host_discovery_script is not None:
            return cls(config.host_discovery_script, slots)
        if config.hosts is not None:
            fixed = parse_host_list(config.hosts)
        elif config.hostfile is not None:
            fixed = read_hostfile(config.hostfile)
        else:
            fixed = []
        if len(fixed) < 2:
            raise UsageError(
                "an elastic job needs --host-discovery-script, or at least two "
                "hosts in -H/--hostfile (with fewer it cannot lose one and go on)"
            )
        return cls(None, slots, fixed)

    def find(self) -> list[HostSlots]:
        if self.fixed is not None:
            return list(self.fixed)
        try:
            done = subprocess.run(
                self.script,
                shell=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=DISCOVERY_TIME_LIMIT,
            )
        except subprocess.TimeoutExpired:
            raise DiscoveryError(
                f"the host discovery script {self.script!r} did not finish "
                f"within {DISCOVERY_TIME_LIMIT:g} s"
            ) from None
        if done.returncode != 0:
            how = RankExit.from_returncode("", done.returncode).how()
            said = done.stderr.strip().splitlines()[-1:] or ["nothing on stderr"]
            raise DiscoveryError(f"the host discovery script {self.script!r} {how}: {said[0]}")
        try:
            return parse_discovery(done.stdout, self.slots_per_host, self.script or "")
        except UsageError as exc:
            raise DiscoveryError(str(exc)) from None


class HostWatch:
    """Runs discovery every DISCOVERY_INTERVAL seconds in a thread: the newest hosts found,
    and a callback on each run (with the hosts) while a generation runs."""

    def __init__(self, discovery: Discovery, first: Sequence[HostSlots]):
        self.discovery = discovery
        self._hosts = list(first)
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._failing: Optional[str] = None
        self.on_run: Optional[Callable[[list[HostSlots]], None]] = None
        self._thread = threading.Thread(target=self._loop, name="scaleout-discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def hosts(self) -> list[HostSlots]:
        with self._lock:
            return list(self._hosts)

    def wait(self, seconds: float) -> None:
        """Until the next run of discovery, or `seconds`."""
        with self._lock:
            self._lock.wait(seconds)

    def _loop(self) -> None:
        while not self._stop.wait(DISCOVERY_INTERVAL):
            try:
                found = self.discovery.find()
            except (DiscoveryError, OSError) as exc:
                # As Horovod: after a first success, a failing script is retried, its last
                # hosts kept; said once until it works again.
                if str(exc) != self._failing:
                    say(f"{exc}; using the hosts it printed last")
                self._failing = str(exc)
                continue
            self._failing = None
            with self._lock:
                self._hosts = found
                self._lock.notify_all()
            callback = self.on_run
            if callback is not None:
                callback(found)
