"""A real multi-host job: two "hosts" made on this machine, reached over ssh by scaleoutrun.

Each host is a set of namespaces of its own: network (its end of a veth pair, 10.250.0.1/24 or
10.250.0.2/24, the only addresses this test talks to), UTS (its host name, hostA or hostB) and
mount (a private /etc/hosts naming both, ssh client settings, and its own sysfs). Each runs an
sshd started by the test from a config and keys in a temporary directory. scaleoutrun runs on
hostA and starts ranks on both through the MPI's own launcher, as on a cluster; the processes
share this filesystem, so the same Python works on both hosts. Nothing outside the namespaces
is changed, and the namespaces, with everything running in them, are removed at the end.

Needs root and: unshare, nsenter, ip (iproute2), ssh, ssh-keygen, sshd (openssh-server). Where
any is missing or namespaces cannot be made, the tests skip and say why.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import pytest

from scaleout.launcher.mpi_launcher import LaunchError, find_mpiexec

HOSTS = {"hostA": "10.250.0.1", "hostB": "10.250.0.2"}
SSH_PORT = 2222
HANGING_SSH_PORT = 2223   # an sshd on hostB whose logins never start anything
INTERFACE = "scaleout0"   # each host's end of the veth pair, renamed alike
LIMIT = 120               # seconds any one job may take here
INSTALL_HINT = "on Debian: apt-get install -y openssh-server iproute2"

# The rank program: checks its own view and prints one RESULT line for the test to check.
PROGRAM = """
import json, os, socket
import numpy as np
import scaleout as so

so.init()
r, n = so.rank(), so.size()
# An allreduce large enough to be split across endpoint servers, of exact integer values.
big = so.allreduce(np.arange(1 << 18, dtype=np.float64) * (r + 1), op=so.Sum, name="big")
small = so.allreduce(np.full(7, float(r), np.float32), op=so.Sum, name="small")
# Rank r contributes r + 1 rows of its own rank number.
gathered = so.allgather(np.full((r + 1, 3), r, np.int64), name="rows")
# From the last rank, on the other host than rank 0.
from_last = so.broadcast(np.arange(5, dtype=np.int32) + 100 * r, root_rank=n - 1, name="b")
print("RESULT " + json.dumps({
    "rank": r, "size": n, "host": socket.gethostname(),
    "local_rank": so.local_rank(), "local_size": so.local_size(),
    "cross_rank": so.cross_rank(), "cross_size": so.cross_size(),
    "big_ok": bool(np.array_equal(big, np.arange(1 << 18) * (n * (n + 1) // 2))),
    "small": small.tolist(), "gathered_rows": gathered[:, 0].tolist(),
    "gathered_shape": list(gathered.shape), "broadcast": from_last.tolist(),
    "mark": os.environ.get("SCALEOUT_TEST_MARK"),
    "ucx_net_devices": os.environ.get("UCX_NET_DEVICES"),
    "liveness_interface": so.config().get("SCALEOUT_NETWORK_INTERFACE"),
}), flush=True)
so.shutdown()
"""


def _missing_prerequisite() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces and a veth pair needs root"
    sbin_path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
    for tool in ("unshare", "nsenter", "ip", "ssh", "ssh-keygen", "sshd"):
        if shutil.which(tool, path=sbin_path) is None:
            return f"{tool} is not installed ({INSTALL_HINT})"
    if not os.path.isdir("/etc/ssh"):
        return f"/etc/ssh is missing ({INSTALL_HINT})"
    try:
        find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    except LaunchError as exc:
        return str(exc)
    return None


def _run(argv: list[str], what: str, timeout: float = 30) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(argv)}` exited {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}")
    return result


def _die_with_this_process():
    """A preexec_fn: the child (and so what it execs) is killed should pytest itself be killed,
    so a namespace's holder and sshd never outlive the test run."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def prepare() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
    return prepare


def _net_namespace(pid: int) -> tuple[int, int]:
    info = os.stat(f"/proc/{pid}/ns/net")
    return info.st_dev, info.st_ino


class TwoHosts:
    """hostA and hostB, each a process holding its namespaces, with an sshd in each."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.holders: dict[str, subprocess.Popen] = {}
        # The network namespaces made, each recorded once seen to differ from this process's
        # own: close() kills what runs in these, and must never be handed this machine's.
        self.spaces: set[tuple[int, int]] = set()
        self.sshds: list[subprocess.Popen] = []
        # Unique per test run: the veth pair is made in this machine's namespace before each
        # end moves into its host (where both are renamed INTERFACE).
        tag = f"{os.getpid() % 100000:05d}"
        self.veth = {"hostA": f"so{tag}a", "hostB": f"so{tag}b"}
        self.veth_made = False
        self.sbin = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")

    # --- setting up -----------------------------------------------------------------------

    def write_files(self) -> None:
        d = self.dir
        d.chmod(0o700)
        for key in ("client_key", "host_key"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "scaleout-test",
                  "-f", str(d / key)], "making an ssh key")
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        (d / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{address} {name}\n" for name, address in HOSTS.items()))
        # Bound over /etc/ssh inside the hosts: the ssh client's settings for this test.
        etc_ssh = d / "etc_ssh"
        etc_ssh.mkdir()
        (etc_ssh / "ssh_config").write_text(textwrap.dedent(f"""\
            Host *
                IdentityFile {d / 'client_key'}
                IdentitiesOnly yes
                UserKnownHostsFile /dev/null
                StrictHostKeyChecking no
                BatchMode yes
                ConnectTimeout 10
                LogLevel ERROR
            """))

    def make_namespaces(self) -> None:
        """Raises OSError or RuntimeError where namespaces or the veth pair cannot be made."""
        ours = _net_namespace(os.getpid())
        for name in HOSTS:
            self.holders[name] = subprocess.Popen(
                ["unshare", "--net", "--uts", "--mount", "--propagation", "private",
                 "sleep", "86400"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=_die_with_this_process())
        deadline = time.monotonic() + 10
        for name, holder in self.holders.items():
            while True:   # unshare switches namespaces before it execs sleep: wait for it
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
        a, b = self.veth["hostA"], self.veth["hostB"]
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], "making a veth pair")
        self.veth_made = True
        for name in HOSTS:
            _run(["ip", "link", "set", self.veth[name], "netns", str(self.holders[name].pid)],
                 f"moving the veth end into {name}")
        self.veth_made = False   # it now lives, and dies, with the namespaces

    def configure_hosts(self) -> None:
        d = self.dir
        for name, address in HOSTS.items():
            script = f"""
                set -e
                ip link set {self.veth[name]} name {INTERFACE}
                ip link set lo up
                ip addr add {address}/24 dev {INTERFACE}
                ip link set {INTERFACE} up
                hostname {name}
                mount --bind {d / 'hosts'} /etc/hosts
                mount --bind {d / 'etc_ssh'} /etc/ssh
                # This namespace's sysfs: UCX finds network devices in /sys/class/net.
                mount -t sysfs sysfs /sys
                # sshd wants /run/sshd; a private /run keeps this machine's /run untouched.
                mount -t tmpfs tmpfs /run
                mkdir -m 755 /run/sshd
            """
            self.run_on(name, ["sh", "-c", textwrap.dedent(script)], what=f"configuring {name}")

    def start_sshd(self, name: str, port: int, force_command: Optional[str] = None) -> None:
        config = self.dir / f"sshd_{name}_{port}"
        config.write_text(textwrap.dedent(f"""\
            Port {port}
            ListenAddress {HOSTS[name]}
            HostKey {self.dir / 'host_key'}
            PidFile none
            AuthorizedKeysFile {self.dir / 'authorized_keys'}
            PermitRootLogin prohibit-password
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            """) + (f"ForceCommand {force_command}\n" if force_command else ""))
        log_path = self.dir / f"sshd_{name}_{port}.log"
        with open(log_path, "wb") as log:
            sshd = subprocess.Popen(self._enter(name) + [self.sbin, "-D", "-e", "-f", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    preexec_fn=_die_with_this_process())
        self.sshds.append(sshd)
        deadline = time.monotonic() + 15
        while b"Server listening" not in log_path.read_bytes():
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {name} did not start: {log_path.read_text()}")
            time.sleep(0.05)

    # --- using ----------------------------------------------------------------------------

    def _enter(self, name: str) -> list[str]:
        return ["nsenter", "-t", str(self.holders[name].pid), "-n", "-u", "-m", "--"]

    def run_on(self, name: str, argv: list[str], env: Optional[dict] = None,
               timeout: float = LIMIT, what: Optional[str] = None) -> subprocess.CompletedProcess:
        """Runs argv on a host; with `what`, a failure raises RuntimeError."""
        if what is not None:
            return _run(self._enter(name) + argv, what, timeout)
        return subprocess.run(self._enter(name) + argv, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    # --- taking down ----------------------------------------------------------------------

    def close(self) -> None:
        spaces = self.spaces - {_net_namespace(os.getpid())}
        # Everything still running inside the hosts (sshd, its sessions, a stuck rank), then
        # the holders: the last process of a namespace gone, the namespace and its veth end go.
        for _ in range(3):
            found = []
            for entry in os.listdir("/proc") if spaces else ():
                if entry.isdigit() and int(entry) != os.getpid():
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
        for process in self.sshds + list(self.holders.values()):
            if process.poll() is None:
                process.kill()
            process.wait()
        if self.veth_made:   # made but never moved: it is still in this machine's namespace
            subprocess.run(["ip", "link", "del", self.veth["hostA"]], capture_output=True)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    missing = _missing_prerequisite()
    if missing:
        pytest.skip(f"two-host test: {missing}")
    two = TwoHosts(tmp_path_factory.mktemp("two_hosts"))
    try:
        two.write_files()
        try:
            two.make_namespaces()
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"two-host test: network namespaces cannot be made here: {exc}")
        two.configure_hosts()
        for name in HOSTS:
            two.start_sshd(name, SSH_PORT)
        yield two
    finally:
        two.close()


def scaleoutrun_on_a(hosts: TwoHosts, *args: str, program: Optional[Path] = None,
                     env: Optional[dict] = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(program)] if program else [sys.executable, "-c", "pass"]
    return hosts.run_on("hostA", [sys.executable, "-m", "scaleout.launcher.main", *args,
                                  *command], env=env)


# Both hosts share one kernel, and UCX (MPICH's transport here) takes a machine to be its
# kernel's boot id: left alone, it would carry the bytes between hostA and hostB through shared
# memory, and the veth pair would see only ssh and the launcher's own traffic. TCP only makes
# the ranks' data cross the network as it would between real hosts.
JOB_ENV = {"UCX_TLS": "self,tcp", "SCALEOUT_TEST_MARK": "reached-every-rank",
           "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30"}


def results(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"^\[(\d+)\] RESULT (.*)$", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    return found


def check_job(found: dict[int, dict], slots: dict[str, int]) -> None:
    """What every rank saw, against the hosts and slots it was launched with."""
    n = sum(slots.values())
    assert sorted(found) == list(range(n))
    rank_hosts = [name for name, count in slots.items() for _ in range(count)]
    for r, got in found.items():
        host = rank_hosts[r]
        local_rank = rank_hosts[:r].count(host)
        peers = [q for q in range(n) if rank_hosts[:q].count(rank_hosts[q]) == local_rank]
        assert got["size"] == n and got["host"] == host, got
        assert (got["local_rank"], got["local_size"]) == (local_rank, slots[host]), got
        assert (got["cross_rank"], got["cross_size"]) == (peers.index(r), len(peers)), got
        assert got["big_ok"], got
        assert got["small"] == [float(sum(range(n)))] * 7, got
        assert got["gathered_rows"] == [q for q in range(n) for _ in range(q + 1)], got
        assert got["gathered_shape"] == [n * (n + 1) // 2, 3], got
        assert got["broadcast"] == [100 * (n - 1) + i for i in range(5)], got
        assert got["mark"] == "reached-every-rank", got
        assert got["ucx_net_devices"] == INTERFACE, got
        assert got["liveness_interface"] == INTERFACE, got


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("multihost_program") / "rank_program.py"
    path.write_text(PROGRAM)
    return path


def received_bytes(hosts: TwoHosts, name: str) -> int:
    path = f"/sys/class/net/{INTERFACE}/statistics/rx_bytes"
    return int(hosts.run_on(name, ["cat", path], what="reading the veth's counters").stdout)


def test_two_by_two_ranks_over_ssh(hosts, program):
    before = received_bytes(hosts, "hostB")
    result = scaleoutrun_on_a(hosts, "-H", "hostA:2,hostB:2", "--ssh-port", str(SSH_PORT),
                              "--network-interface", INTERFACE, "--mpi-yield", "on",
                              program=program, env=JOB_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    check_job(results(result.stdout), {"hostA": 2, "hostB": 2})
    # The 2 MiB allreduce crossed between the hosts over the veth pair.
    assert received_bytes(hosts, "hostB") - before > 1 << 20


def test_uneven_slots_from_a_hostfile(hosts, program, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=1\n")
    result = scaleoutrun_on_a(hosts, "--hostfile", str(hostfile), "--mpi-yield", "on",
                              program=program,
                              env={**JOB_ENV, "SCALEOUTRUN_SSH_PORT": str(SSH_PORT),
                                   "SCALEOUTRUN_NETWORK_INTERFACE": INTERFACE})
    assert result.returncode == 0, result.stdout + result.stderr
    check_job(results(result.stdout), {"hostA": 2, "hostB": 1})


def test_an_unreachable_host_is_named(hosts):
    started = time.monotonic()
    result = scaleoutrun_on_a(hosts, "-H", "hostA:2,hostB:2", "--ssh-port", "2299")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "host hostB could not be reached (ranks 2, 3 were to run there): ssh: connect to " \
           "host hostb port 2299: Connection refused" in result.stderr
    assert time.monotonic() - started < 30


def test_probing_a_host_over_ssh(hosts):
    # What scaleoutrun asks ssh when the launcher fails without naming a host.
    probe = ("import sys; from scaleout.launcher.unreachable import probe_hosts; "
             "print([u.line for u in probe_hosts(['hostB'], int(sys.argv[1]))])")
    closed = hosts.run_on("hostA", [sys.executable, "-c", probe, "2299"], what="probing hostB")
    assert closed.stdout.strip() == \
        "['ssh: connect to host hostb port 2299: Connection refused']", closed.stdout
    open_ = hosts.run_on("hostA", [sys.executable, "-c", probe, str(SSH_PORT)],
                         what="probing hostB")
    assert open_.stdout.strip() == "[]", open_.stdout


def test_a_host_that_never_starts_its_ranks_is_named(hosts):
    hosts.start_sshd("hostB", HANGING_SSH_PORT, force_command="sleep 300")
    result = scaleoutrun_on_a(hosts, "-H", "hostA:1,hostB:1", "--ssh-port",
                              str(HANGING_SSH_PORT), "--start-timeout", "4")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank 1 (on hostB) did not start within 4 s (--start-timeout)" in result.stderr


# --- Note [Liveness] across machines: plain mpiexec, which leaves the survivors running ------

MP = Path(__file__).parent / "mp"
LEFT = "scaleout: a peer rank died, so MPI cannot be finalized"


def mpiexec_on_a(hosts: TwoHosts, slots: dict[str, int], argv: list[str],
                 env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """The MPI's own launcher, without scaleoutrun, as a user of srun or an MPI operator has it:
    nothing stops the other ranks when one dies."""
    mpiexec = find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    variables = {**JOB_ENV, "UCX_NET_DEVICES": INTERFACE, "SCALEOUT_NETWORK_INTERFACE": INTERFACE,
                 **(env or {})}
    command = [mpiexec, "-disable-auto-cleanup", "-n", str(sum(slots.values())),
               "-launcher", "ssh", "-hosts", ",".join(f"{h}:{n}" for h, n in slots.items())]
    for name, value in variables.items():
        command += ["-genv", name, value]
    return hosts.run_on("hostA", ["env", f"HYDRA_LAUNCHER_EXTRA_ARGS=-p {SSH_PORT}", *command,
                                  sys.executable, *argv])


@pytest.mark.parametrize("mode", ["idle", "busy"])
@pytest.mark.parametrize("slots", [{"hostA": 1, "hostB": 1}, {"hostA": 2, "hostB": 1},
                                   {"hostA": 2, "hostB": 2}],
                         ids=["np2", "np3", "np4-hierarchical"])
def test_a_rank_dying_on_another_host_is_named(hosts, slots, mode):
    # The last rank, on hostB, dies; the survivors on hostA cannot see its process.
    result = mpiexec_on_a(hosts, slots, [str(MP / "peer_death.py"), "last", mode])
    if mode == "busy" and "Segmentation fault" in result.stdout + result.stderr:
        # Known: MPICH over UCX can crash a survivor whose transfer to the peer is in flight
        # when the peer dies, before the death is seen (README, Note [Liveness]). One more try;
        # a hang or an unnamed death still fails.
        result = mpiexec_on_a(hosts, slots, [str(MP / "peer_death.py"), "last", mode])
    survivors = sum(slots.values()) - 1
    assert result.stdout.count("all checks passed") == survivors, result.stdout + result.stderr
    assert result.stderr.count(LEFT) == survivors, result.stdout + result.stderr


SILENT_PROGRAM = """
import os, signal, sys, time
import numpy as np
import scaleout as so
so.init()
r, n = so.rank(), so.size()
so.allreduce(np.ones(4), name="before")
if r == n - 1:
    # Stops answering without dying (a machine that hangs, a cut link, a debugger); a child
    # ends it for good once the test has seen what it needs.
    parent = os.getpid()
    if os.fork() == 0:
        time.sleep(20)
        os.kill(parent, signal.SIGKILL)
        os._exit(0)
    os.kill(parent, signal.SIGSTOP)
try:
    so.allreduce(np.ones(4), name="waits")
    print(f"rank {r}: no error", flush=True)
except so.HorovodInternalError as exc:
    print(f"rank {r}: ERROR {exc}", flush=True)
"""


def test_a_rank_that_stops_answering_is_named(hosts, tmp_path):
    program = tmp_path / "silent.py"
    program.write_text(SILENT_PROGRAM)
    result = mpiexec_on_a(hosts, {"hostA": 1, "hostB": 1}, [str(program)],
                          env={"SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS": "3"})
    assert re.search(r"^\[?0?\]?\s*rank 0: ERROR rank 1 \(pid \d+ on hostB\) stopped answering: "
                     r"nothing was heard from it for 3 s", result.stdout, re.M), \
        result.stdout + result.stderr
