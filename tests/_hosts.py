"""Hosts made on this machine out of namespaces, reached over ssh: what the multi-host tests
(tests/test_multihost*.py) and benchmarks/multihost.py run scaleoutrun across.

Each host is a set of namespaces of its own: network (its end of a veth link named INTERFACE,
10.250.0.1/24, 10.250.0.2/24, ..., the only addresses used here), UTS (its host name: hostA,
hostB, ...) and mount (a private /etc/hosts naming every host, ssh client settings, its own
sysfs, so /sys/class/net shows its own interfaces, and a private /run). Each runs an sshd
started from a config and keys in a work directory. The processes share this filesystem, so the
same Python works on every host.

Two hosts are joined by one veth pair. Three or more each get a veth pair to a bridge in a
namespace of its own (a switch), so that every host still has one interface and one link.
A link can be rate-limited with tc's token bucket filter on both of its ends (LinkLimit), so
each direction of each link has that rate, as a full-duplex network port has.

Nothing outside the namespaces is changed, and the namespaces, with everything running in them,
are removed by close(). Needs root and: unshare, nsenter, ip (iproute2), ssh, ssh-keygen, sshd
(openssh-server), and tc for a rate limit; missing_prerequisite() names what is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

__all__ = [
    "HostsUnavailable",
    "Hosts",
    "LinkLimit",
    "INTERFACE",
    "SSH_PORT",
    "LIMIT",
    "INSTALL_HINT",
    "NETWORK_ENV",
    "host_names",
    "missing_prerequisite",
    "made_hosts",
]

SSH_PORT = 2222
INTERFACE = "scaleout0"  # each host's end of its link, renamed alike on every host
LIMIT = 120  # seconds any one command on a host may take by default
INSTALL_HINT = "on Debian: apt-get install -y openssh-server iproute2"

# For every job run across these hosts. They share one kernel, and UCX (MPICH's transport here)
# takes a machine to be its kernel's boot id: left alone, it would carry the bytes between
# hosts through shared memory, and the links would see only ssh and the launcher's own traffic.
# TCP only makes the ranks' data cross the network as it would between real hosts. (Between
# ranks of one host MPICH still uses its own shared memory: it groups ranks by host name.)
NETWORK_ENV = {"UCX_TLS": "self,tcp"}
_SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"


class HostsUnavailable(RuntimeError):
    """The hosts cannot be made on this machine; the message says why, in one line."""


def host_names(count: int) -> list[str]:
    if not 2 <= count <= 26:
        raise ValueError(f"between 2 and 26 hosts, not {count}")
    return [f"host{chr(ord('A') + i)}" for i in range(count)]


def job_options(slots: dict) -> list[str]:
    """scaleoutrun's options for a job on these hosts: `-H` with each host's slots ({name: n}),
    ssh on the hosts' port, the links' interface, and MPI's waits yielding (the ranks of every
    host share this machine's cores)."""
    spec = ",".join(f"{host}:{n}" for host, n in slots.items())
    return [
        "-H",
        spec,
        "--ssh-port",
        str(SSH_PORT),
        "--network-interface",
        INTERFACE,
        "--mpi-yield",
        "on",
    ]


def job_command(slots: dict, script, *args: str) -> list[str]:
    """The command that runs `script` with `args` on every rank of a scaleoutrun job on these
    hosts (job_options), to be run on the first host."""
    return [
        sys.executable,
        "-m",
        "scaleout.launcher.main",
        *job_options(slots),
        sys.executable,
        str(script),
        *args,
    ]


def missing_prerequisite(rate_limited: bool = False) -> Optional[str]:
    """Why hosts cannot be made here (one line), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces and veth links needs root"
    tools = ["unshare", "nsenter", "ip", "ssh", "ssh-keygen", "sshd"] + (
        ["tc"] if rate_limited else []
    )
    for tool in tools:
        if shutil.which(tool, path=_SBIN_PATH) is None:
            return f"{tool} is not installed ({INSTALL_HINT})"
    if not os.path.isdir("/etc/ssh"):
        return f"/etc/ssh is missing ({INSTALL_HINT})"
    from scaleout.launcher.mpi_launcher import LaunchError, find_mpiexec

    try:
        find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    except LaunchError as exc:
        return str(exc)
    return None


_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


@dataclass(frozen=True)
class LinkLimit:
    """A rate limit for every link end: `tc qdisc replace dev <end> root tbf rate <rate>
    burst <burst> latency <latency>`.

    rate: tc's notation in bits per second (500mbit, 1gbit, 10gbit; tc's "bps" would mean
    bytes, so it is refused). burst: the bucket in bytes; by default burst_for(rate).
    latency: the longest a packet may wait in the bucket's queue (which sets its length); long
    enough that TCP's bursts are queued rather than dropped."""

    rate: str
    burst: Optional[int] = None
    latency: str = "100ms"

    def __post_init__(self):
        _ = self.bits_per_second  # refuses what is not a rate in bits

    @property
    def bits_per_second(self) -> int:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?bit)", self.rate.strip().lower())
        if not match:
            raise ValueError(f"{self.rate!r} is not a rate like 500mbit, 1gbit or 10gbit")
        return int(float(match.group(1)) * _RATE_UNITS[match.group(2)])

    @property
    def burst_bytes(self) -> int:
        return self.burst if self.burst is not None else burst_for(self.bits_per_second)

    def tc_args(self) -> list[str]:
        return ["tbf", "rate", self.rate, "burst", str(self.burst_bytes), "latency", self.latency]


def burst_for(bits_per_second: int) -> int:
    """The bucket: what the link sends in 1 ms at its rate, at least 128 KiB.

    tc-tbf(8)'s rule of thumb (rate / HZ, 4 ms at HZ=250) dates from tick-driven timers; the
    qdisc now sleeps on a high-resolution timer, so a bucket needs to hold only the largest
    packet and a little slack. The largest packet over a veth is a 64 KiB GSO segment plus
    headers: a smaller bucket makes tbf cut every such packet into MTU-sized ones (costly on a
    2-core machine). And a bucket is bytes that go at the veth's own speed after any pause: a
    4 ms bucket (500 KB at 1 Gbit/s, 5 MB at 10 Gbit/s) would let a whole 1 MiB allreduce pass
    unthrottled after each barrier."""
    return max(128 * 1024, bits_per_second // 8 // 1000)


def _run(argv: list[str], what: str, timeout: float = 30) -> subprocess.CompletedProcess:
    result = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{what}: `{' '.join(argv)}` exited {result.returncode}: "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result


def _die_with_this_process():
    """A preexec_fn: the child (and so what it execs) is killed should this process be killed,
    so a namespace's holder and sshd never outlive the test or benchmark that made them."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def prepare() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return prepare


def _net_namespace(pid: int) -> tuple[int, int]:
    info = os.stat(f"/proc/{pid}/ns/net")
    return info.st_dev, info.st_ino


class Hosts:
    """`count` hosts (hostA, hostB, ...), each a process holding its namespaces, with an sshd in
    each once start_sshd is called; with three or more, a switch namespace holding a bridge.
    Use made_hosts() to have them made, started and taken down."""

    SWITCH = "switch"  # the key of the switch namespace's holder (not a host)

    def __init__(self, workdir: Path, count: int = 2):
        self.dir = workdir
        self.names = host_names(count)
        self.addresses = {name: f"10.250.0.{i + 1}" for i, name in enumerate(self.names)}
        self.holders: dict[str, subprocess.Popen] = {}
        # The network namespaces made, each recorded once seen to differ from this process's
        # own: close() kills what runs in these, and must never be handed this machine's.
        self.spaces: set[tuple[int, int]] = set()
        self.sshds: list[subprocess.Popen] = []
        # Veth names unique per process: each pair is made in this machine's namespace before
        # its ends move (the host's end is then renamed INTERFACE, the switch's to-<host>).
        tag = f"{os.getpid() % 100000:05d}"
        self.veth = {name: f"so{tag}{chr(ord('a') + i)}" for i, name in enumerate(self.names)}
        self.switch_port = {
            name: f"sw{tag}{chr(ord('a') + i)}" for i, name in enumerate(self.names)
        }
        self.veth_made: list[str] = []  # ends still in this machine's namespace: close() deletes
        self.sbin = shutil.which("sshd", path=_SBIN_PATH)

    @property
    def switched(self) -> bool:
        return len(self.names) > 2

    # --- setting up -----------------------------------------------------------------------

    def write_files(self) -> None:
        d = self.dir
        d.chmod(0o700)
        for key in ("client_key", "host_key"):
            _run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "scaleout-test",
                    "-f",
                    str(d / key),
                ],
                "making an ssh key",
            )
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        (d / "hosts").write_text(
            "127.0.0.1 localhost\n"
            + "".join(f"{address} {name}\n" for name, address in self.addresses.items())
        )
        # Bound over /etc/ssh inside the hosts: the ssh client's settings.
        etc_ssh = d / "etc_ssh"
        etc_ssh.mkdir()
        (etc_ssh / "ssh_config").write_text(
            textwrap.dedent(f"""\
            Host *
                IdentityFile {d / "client_key"}
                IdentitiesOnly yes
                UserKnownHostsFile /dev/null
                StrictHostKeyChecking no
                BatchMode yes
                ConnectTimeout 10
                LogLevel ERROR
            """)
        )

    def _hold(self, key: str, namespaces: list[str]) -> None:
        self.holders[key] = subprocess.Popen(
            ["unshare", *namespaces, "sleep", "86400"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_this_process(),
        )

    def make_namespaces(self) -> None:
        """Raises OSError or RuntimeError where namespaces or the veth links cannot be made."""
        ours = _net_namespace(os.getpid())
        for name in self.names:
            self._hold(name, ["--net", "--uts", "--mount", "--propagation", "private"])
        if self.switched:
            self._hold(self.SWITCH, ["--net"])
        deadline = time.monotonic() + 10
        for holder in self.holders.values():
            while True:  # unshare switches namespaces before it execs sleep: wait for it
                if holder.poll() is not None:
                    raise RuntimeError(f"unshare failed: {holder.stderr.read().decode().strip()}")
                try:
                    space = _net_namespace(holder.pid)
                except OSError:
                    space = ours
                if space != ours:
                    self.spaces.add(space)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("unshare did not make its namespaces within 10 s")
                time.sleep(0.02)
        if self.switched:
            pairs = [
                (self.veth[name], name, self.switch_port[name], self.SWITCH) for name in self.names
            ]
        else:
            first, second = self.names
            pairs = [(self.veth[first], first, self.veth[second], second)]
        for end, end_space, peer, peer_space in pairs:
            _run(
                ["ip", "link", "add", end, "type", "veth", "peer", "name", peer],
                "making a veth pair",
            )
            self.veth_made += [end, peer]
            for device, space in ((end, end_space), (peer, peer_space)):
                _run(
                    ["ip", "link", "set", device, "netns", str(self.holders[space].pid)],
                    f"moving a veth end into {space}",
                )
                self.veth_made.remove(device)  # it now lives, and dies, with its namespace
        if self.switched:
            commands = ["set -e", "ip link add switch0 type bridge", "ip link set switch0 up"]
            for name in self.names:
                port = self.switch_port[name]
                commands += [
                    f"ip link set {port} name to-{name}",
                    f"ip link set to-{name} master switch0",
                    f"ip link set to-{name} up",
                ]
            self._run_in(
                self.SWITCH,
                ["sh", "-c", "\n".join(commands)],
                check=True,
                what="making the switch (a bridge)",
            )

    def configure_hosts(self) -> None:
        d = self.dir
        for name, address in self.addresses.items():
            script = f"""
                set -e
                ip link set {self.veth[name]} name {INTERFACE}
                ip link set lo up
                ip addr add {address}/24 dev {INTERFACE}
                ip link set {INTERFACE} up
                hostname {name}
                mount --bind {d / "hosts"} /etc/hosts
                mount --bind {d / "etc_ssh"} /etc/ssh
                # This namespace's sysfs: UCX finds network devices in /sys/class/net.
                mount -t sysfs sysfs /sys
                # sshd wants /run/sshd; a private /run keeps this machine's /run untouched.
                mount -t tmpfs tmpfs /run
                mkdir -m 755 /run/sshd
            """
            self.run_on(name, ["sh", "-c", textwrap.dedent(script)], what=f"configuring {name}")

    def start_sshd(
        self, name: str, port: int = SSH_PORT, force_command: Optional[str] = None
    ) -> None:
        config = self.dir / f"sshd_{name}_{port}"
        config.write_text(
            textwrap.dedent(f"""\
            Port {port}
            ListenAddress {self.addresses[name]}
            HostKey {self.dir / "host_key"}
            PidFile none
            AuthorizedKeysFile {self.dir / "authorized_keys"}
            PermitRootLogin prohibit-password
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            """)
            + (f"ForceCommand {force_command}\n" if force_command else "")
        )
        log_path = self.dir / f"sshd_{name}_{port}.log"
        with open(log_path, "wb") as log:
            sshd = subprocess.Popen(
                self._enter(name) + [self.sbin, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_this_process(),
            )
        self.sshds.append(sshd)
        deadline = time.monotonic() + 15
        while b"Server listening" not in log_path.read_bytes():
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {name} did not start: {log_path.read_text()}")
            time.sleep(0.05)

    # --- the links' rate ------------------------------------------------------------------

    def link_ends(self) -> list[tuple[str, str]]:
        """(namespace key, device) of every end of every link: each host's INTERFACE and, with
        a switch, the switch's port to each host."""
        ends = [(name, INTERFACE) for name in self.names]
        if self.switched:
            ends += [(self.SWITCH, f"to-{name}") for name in self.names]
        return ends

    def limit_links(self, limit: Optional[LinkLimit]) -> None:
        """Puts `limit` on both ends of every link (each direction), or takes it off (None)."""
        for space, device in self.link_ends():
            if limit is None:
                argv = ["tc", "qdisc", "del", "dev", device, "root"]
                self._run_in(space, argv, check=False)
            else:
                argv = ["tc", "qdisc", "replace", "dev", device, "root", *limit.tc_args()]
                self._run_in(space, argv, check=True, what=f"limiting {device} in {space}")

    def qdisc_drops(self) -> int:
        """Packets the rate limiters dropped so far, over every link end."""
        total = 0
        for space, device in self.link_ends():
            out = self._run_in(
                space,
                ["tc", "-s", "qdisc", "show", "dev", device],
                check=True,
                what="reading tc's counters",
            ).stdout
            total += sum(int(m) for m in re.findall(r"dropped (\d+)", out))
        return total

    # --- using ----------------------------------------------------------------------------

    def _enter(self, name: str) -> list[str]:
        return ["nsenter", "-t", str(self.holders[name].pid), "-n", "-u", "-m", "--"]

    def _run_in(
        self, space: str, argv: list[str], check: bool, what: str = ""
    ) -> subprocess.CompletedProcess:
        if space == self.SWITCH:
            enter = ["nsenter", "-t", str(self.holders[self.SWITCH].pid), "-n", "--"]
        else:
            enter = self._enter(space)
        if check:
            return _run(enter + argv, what)
        return subprocess.run(
            enter + argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
        )

    def run_on(
        self,
        name: str,
        argv: list[str],
        env: Optional[dict] = None,
        timeout: float = LIMIT,
        what: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Runs argv on a host; with `what`, a failure raises RuntimeError."""
        if what is not None:
            return _run(self._enter(name) + argv, what, timeout)
        return subprocess.run(
            self._enter(name) + argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )

    def start_on(self, name: str, argv: list[str], env: Optional[dict] = None) -> subprocess.Popen:
        """Starts argv on a host and returns at once (text pipes for stdout and stderr; a session
        of its own, so that the caller can end it with everything it started)."""
        return subprocess.Popen(
            self._enter(name) + argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def interface_bytes(self, name: str) -> dict[str, int]:
        """{"rx": ..., "tx": ...}: the byte counters of `name`'s INTERFACE."""
        statistics = f"/sys/class/net/{INTERFACE}/statistics"
        out = self.run_on(
            name,
            ["cat", f"{statistics}/rx_bytes", f"{statistics}/tx_bytes"],
            what="reading the link's counters",
        ).stdout.split()
        return {"rx": int(out[0]), "tx": int(out[1])}

    # --- taking down ----------------------------------------------------------------------

    def _kill_in(self, spaces: set, spare: tuple[int, ...] = ()) -> None:
        """SIGKILLs every process in the network namespaces `spaces` but `spare`, until none
        is left (a process may fork while the first ones die)."""
        spaces = spaces - {_net_namespace(os.getpid())}  # never this machine's own
        for _ in range(3):
            found = []
            for entry in os.listdir("/proc") if spaces else ():
                if entry.isdigit() and int(entry) not in (os.getpid(), *spare):
                    try:
                        if _net_namespace(int(entry)) in spaces:
                            found.append(int(entry))
                    except OSError:
                        pass
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not found:
                break
            time.sleep(0.1)

    def kill_host(self, name: str) -> None:
        """The host is lost: everything running on it (its sshd, the launcher's daemon, the
        ranks and their wrappers) is killed at once; only its namespaces stay, empty."""
        holder = self.holders[name].pid
        self._kill_in({_net_namespace(holder)}, spare=(holder,))

    def close(self) -> None:
        # Everything still running inside the namespaces (sshd, its sessions, a stuck rank),
        # then the holders: the last process of a namespace gone, it goes with its veth ends.
        self._kill_in(self.spaces)
        for process in self.sshds + list(self.holders.values()):
            if process.poll() is None:
                process.kill()
            process.wait()
        for device in self.veth_made:  # made but never moved: still in this namespace
            subprocess.run(["ip", "link", "del", device], capture_output=True)


@contextlib.contextmanager
def made_hosts(workdir: Path, count: int = 2, limit: Optional[LinkLimit] = None) -> Iterator[Hosts]:
    """`count` hosts with an sshd on SSH_PORT each (and `limit` on their links), taken down on
    leaving. Raises HostsUnavailable (one line) where they cannot be made here."""
    missing = missing_prerequisite(rate_limited=limit is not None)
    if missing:
        raise HostsUnavailable(missing)
    hosts = Hosts(workdir, count)
    try:
        hosts.write_files()
        try:
            hosts.make_namespaces()
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            raise HostsUnavailable(
                f"network namespaces cannot be made here: {' '.join(str(exc).split())}"
            ) from exc
        hosts.configure_hosts()
        if limit is not None:
            try:
                hosts.limit_links(limit)
            except RuntimeError as exc:
                raise HostsUnavailable(
                    f"tc cannot rate-limit a veth here: {' '.join(str(exc).split())}"
                ) from exc
        for name in hosts.names:
            hosts.start_sshd(name, SSH_PORT)
        yield hosts
    finally:
        hosts.close()
