"""A real Slurm cluster made on this machine for tests/test_slurm.py and
benchmarks/slurm_startup.py: slurmctld, one slurmd per namespace host (tests/_hosts.py: hostA,
hostB, ...), and munge, all from Debian's packages, all started here and taken down on leaving.

    hostA (10.250.0.1): slurmctld, slurmd, munged; the client commands (salloc, srun, sbatch,
                        scontrol, sinfo) run here too
    hostB (10.250.0.2): slurmd

Every daemon runs in the foreground inside hostA's or its own host's namespaces, so the hosts'
close() ends whatever is left of them (slurmstepd, a job's tasks) with the namespaces. State,
logs, pid files, the munge key and munge's socket are in the work directory, the nodes' spool
in a directory of its own under /tmp (slurmstepd makes its sockets there, and a Unix socket's
path has at most 108 bytes, which a test's work directory under pytest-xdist can exceed):
nothing under /etc, /var or /run is read or written. One munged serves every node: a Unix
socket is a file, reached from every host's network namespace alike (each host has a private
/run, so the socket's path is given to munged with --socket and to Slurm with
AuthInfo=socket=...).

The configuration: root as SlurmUser; no cgroups (proctrack/linuxproc, task/none; slurmd still
needs a cgroup hierarchy to load its cgroup plugin, see _NODE_MOUNTS, which also gives each node
its own /dev/shm); every node with CPUs=2, this machine's cores, so that four tasks fill two
nodes, and config_overrides, so that a node whose reported hardware differs is not drained for
it; TmpFS per node (Slurm's pmix plugin makes its directories there, and the hosts share /tmp);
MinJobAge=5, so that `sbatch --wait` polls every 2 s (it polls ever more slowly, up to every
10 s, while that stays under half of it).
Needs root, the hosts' tools, and `apt-get install -y slurm-wlm munge` (and libpmix-dev for
srun --mpi=pmix); missing_prerequisite() names what is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator, Optional

from _hosts import (
    NETWORK_ENV,
    Hosts,
    HostsUnavailable,
    _die_with_this_process,
    _net_namespace,
    made_hosts,
)
from _hosts import missing_prerequisite as hosts_missing

__all__ = [
    "INSTALL_HINT",
    "CPUS",
    "SlurmUnavailable",
    "Cluster",
    "missing_prerequisite",
    "made_cluster",
]

INSTALL_HINT = "on Debian: apt-get install -y slurm-wlm munge"
CPUS = 2  # declared per node
_SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
_TOOLS = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "salloc", "sbatch", "scontrol")
_START_LIMIT = 30  # seconds for the daemons to come up and every node to be idle

# Run in each host before its slurmd starts, in the host's private mount namespace (the mounts go
# with it):
# - slurmd 22.05 loads its cgroup plugin whatever the configuration says (here nothing uses it)
#   and refuses to start unless /sys/fs/cgroup holds a cgroup hierarchy at systemd/; the hosts'
#   own sysfs (tests/_hosts.py) has none. A tmpfs there with the named v1 hierarchy "systemd"
#   mounted on it is enough for the plugin to load; Slurm creates no cgroup in it (proctrack
#   and task plugins without cgroups).
# - A /dev/shm of the node's own, as a real node has: what a job leaves there (MPICH's segments,
#   when a rank died and the survivors left without MPI_Finalize under srun, where no
#   scaleoutrun cleans up) goes with the node instead of piling up in this machine's.
_NODE_MOUNTS = (
    "set -e; mount -t tmpfs -o mode=755 slurm-cgroup /sys/fs/cgroup; "
    "mkdir /sys/fs/cgroup/systemd; "
    "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; "
    "mount -t tmpfs -o mode=1777 slurm-shm /dev/shm"
)


class SlurmUnavailable(RuntimeError):
    """A Slurm cluster cannot be made on this machine; the message says why, in one line."""


def missing_prerequisite() -> Optional[str]:
    """Why a cluster cannot be made here (one line), or None."""
    missing = hosts_missing()
    if missing:
        return missing
    for tool in _TOOLS:
        if shutil.which(tool, path=_SBIN_PATH) is None:
            return f"{tool} is not installed ({INSTALL_HINT})"
    return None


def _tool(name: str) -> str:
    return shutil.which(name, path=_SBIN_PATH) or name


class Cluster:
    """Slurm on `hosts`: the first host runs slurmctld and munged, every host a slurmd. Use
    made_cluster() to have it made, started and taken down."""

    def __init__(self, hosts: Hosts, spool: Path):
        self.hosts = hosts
        self.dir = hosts.dir / "slurm"
        self.spool = spool
        self.controller = hosts.names[0]
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.daemons: list[tuple[str, subprocess.Popen]] = []
        # For every client command: the configuration, and the variables every job here needs
        # (NETWORK_ENV: the ranks' data crosses the links, see tests/_hosts.py).
        self.env = {"SLURM_CONF": str(self.conf), **NETWORK_ENV}

    # --- setting up -----------------------------------------------------------------------

    def write_files(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "log", "run"):
            (d / sub).mkdir(parents=True, mode=0o700)
        (d / "munge").chmod(0o711)
        for name in self.hosts.names:
            (self.spool / name).mkdir(parents=True, mode=0o700)
            (d / "tmp" / name).mkdir(parents=True, mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))  # per test session: nothing else can sign for it
        key.chmod(0o400)
        nodes = "".join(
            f"NodeName={name} NodeAddr={address} CPUs={CPUS} State=UNKNOWN\n"
            for name, address in self.hosts.addresses.items()
        )
        self.conf.write_text(
            textwrap.dedent(f"""\
            ClusterName=scaleout-test
            SlurmctldHost={self.controller}({self.hosts.addresses[self.controller]})
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={self.munge_socket}
            StateSaveLocation={d / "state"}
            SlurmdSpoolDir={self.spool}/%n
            TmpFS={d / "tmp"}/%n
            SlurmctldPidFile={d / "run" / "slurmctld.pid"}
            SlurmdPidFile={d / "run"}/slurmd.%n.pid
            SlurmctldLogFile={d / "log" / "slurmctld.log"}
            SlurmdLogFile={d / "log"}/slurmd.%n.log
            SlurmctldDebug=info
            SlurmdDebug=info
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_CPU
            SlurmdParameters=config_overrides
            MpiDefault=none
            ReturnToService=2
            MinJobAge=5
            MailProg=/bin/true
            SchedulerType=sched/builtin
            """)
            + nodes
            + "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )

    def _start(self, host: str, what: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{what}.out", "wb")
        with log:
            daemon = subprocess.Popen(
                self.hosts._enter(host) + argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**_outside_slurm(), "SLURM_CONF": str(self.conf)},
                preexec_fn=_die_with_this_process(),
            )
        self.daemons.append((what, daemon))

    def start(self) -> None:
        d = self.dir
        self._start(
            self.controller,
            "munged",
            [
                _tool("munged"),
                "--foreground",
                # The work directory is private (0700): munged refuses a socket that other users
                # cannot reach unless forced. Every client here is root.
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={d / 'munge' / 'munge.key'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--pid-file={d / 'run' / 'munged.pid'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait_for(lambda: self.munge_socket.exists(), "munged's socket")
        self._start(self.controller, "slurmctld", [_tool("slurmctld"), "-D", "-f", str(self.conf)])
        for name in self.hosts.names:
            try:
                self.hosts.run_on(name, ["sh", "-c", _NODE_MOUNTS], what="mounting")
            except RuntimeError as exc:
                raise SlurmUnavailable(
                    "slurmd needs a cgroup hierarchy and a node its own /dev/shm, which cannot "
                    f"be mounted in a host here: {' '.join(str(exc).split())}"
                ) from exc
            self._start(name, f"slurmd.{name}", [_tool("slurmd"), "-D", "-f", str(self.conf)])
        self._wait_for(self._all_idle, "every node idle in sinfo")

    def _all_idle(self) -> bool:
        result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return result.returncode == 0 and all(
            states.get(name) == "idle" for name in self.hosts.names
        )

    def _wait_for(self, ready, what: str) -> None:
        self.wait_for(ready, bool, what)

    def wait_for(self, look, done, what: str, limit: float = _START_LIMIT):
        """Polls `look()` (each call bounded by its own timeout) until done(its result) holds,
        and returns that result; RuntimeError with the daemons' logs after `limit` seconds, or
        at once when a daemon exits meanwhile."""
        deadline = time.monotonic() + limit
        while True:
            for name, daemon in self.daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} exited {daemon.returncode}: {self.logs()}")
            try:
                found = look()
                if done(found):
                    return found
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {limit} s: {self.logs()}")
            time.sleep(0.1)

    def processes(self) -> dict[int, list[str]]:
        """Every process running on the hosts (in their network namespaces): its command line.
        The namespaces' holders are left out."""
        holders = {holder.pid for holder in self.hosts.holders.values()}
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in holders:
                continue
            try:
                if _net_namespace(int(entry)) in self.hosts.spaces:
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
                    found[int(entry)] = [arg.decode(errors="replace") for arg in argv]
            except OSError:
                pass
        return found

    def logs(self) -> str:
        """The daemons' logs, for a failure's message."""
        parts = []
        for path in sorted((self.dir / "log").iterdir()):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)

    # --- using ----------------------------------------------------------------------------

    def start_command(self, argv: list[str], env: Optional[dict] = None) -> subprocess.Popen:
        """Starts argv as run() does, without waiting: its stdout, with stderr, is a pipe
        (text)."""
        return subprocess.Popen(
            self.hosts._enter(self.controller) + argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**_outside_slurm(), **self.env, **(env or {})},
        )

    def run(
        self,
        argv: list[str],
        timeout: float,
        env: Optional[dict] = None,
        cwd: Optional[Path] = None,
        host: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Runs argv (a Slurm client command, or anything that calls one) on a host (the
        controller's by default), with the cluster's variables and `env` added."""
        enter = self.hosts._enter(host or self.controller)
        if cwd is not None:
            enter += ["env", "-C", str(cwd)]
        return subprocess.run(
            enter + argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**_outside_slurm(), **self.env, **(env or {})},
        )

    # --- taking down ----------------------------------------------------------------------

    def stop(self) -> None:
        # The hosts' close() kills whatever still runs in their namespaces (slurmstepd, tasks);
        # here the daemons, first of all, so that none restarts a task meanwhile.
        for _, daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()


def _outside_slurm() -> dict:
    """This process's environment without Slurm's variables: were the tests themselves run in a
    Slurm job, its variables would make every command here act inside that job."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}


@contextlib.contextmanager
def made_cluster(workdir: Path, count: int = 2) -> Iterator[Cluster]:
    """A Slurm cluster of `count` nodes, every node idle, taken down on leaving. Raises
    SlurmUnavailable (one line) where it cannot be made here."""
    missing = missing_prerequisite()
    if missing:
        raise SlurmUnavailable(missing)
    with contextlib.ExitStack() as stack:
        spool = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="so-slurm-")))
        try:
            hosts = stack.enter_context(made_hosts(workdir, count))
        except HostsUnavailable as exc:
            raise SlurmUnavailable(str(exc)) from exc
        cluster = Cluster(hosts, spool)
        stack.callback(cluster.stop)  # before the hosts' close()
        cluster.write_files()
        cluster.start()
        yield cluster
