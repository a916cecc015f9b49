"""A real multi-host job: two "hosts" made on this machine, reached over ssh by scaleoutrun.

The hosts are tests/_hosts.py's (shared with benchmarks/multihost.py): each is a set of
namespaces of its own (network, with its end of a veth pair, 10.250.0.1/24 or 10.250.0.2/24;
UTS, its host name hostA or hostB; mount, a private /etc/hosts, ssh settings and sysfs) with its
own sshd. scaleoutrun runs on hostA and starts ranks on both through the MPI's own launcher, as
on a cluster; the processes share this filesystem, so the same Python works on both hosts.
Nothing outside the namespaces is changed, and they are removed at the end.

Needs root and: unshare, nsenter, ip (iproute2), ssh, ssh-keygen, sshd (openssh-server). Where
any is missing or namespaces cannot be made, the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from _hosts import (
    INTERFACE,
    NETWORK_ENV,
    SSH_PORT,
    Hosts,
    HostsUnavailable,
    job_options,
    made_hosts,
)
from conftest import SCALEOUTRUN

from scaleout.launcher.mpi_launcher import find_mpiexec

HANGING_SSH_PORT = 2223  # an sshd on hostB whose logins never start anything

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


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    try:
        with made_hosts(tmp_path_factory.mktemp("two_hosts"), 2) as two:
            yield two
    except HostsUnavailable as exc:
        pytest.skip(f"two-host test: {exc}")


def scaleoutrun_on_a(
    hosts: Hosts, *args: str, program: Optional[Path] = None, env: Optional[dict] = None
) -> subprocess.CompletedProcess:
    command = [sys.executable, str(program)] if program else [sys.executable, "-c", "pass"]
    return hosts.run_on("hostA", [*SCALEOUTRUN, *args, *command], env=env)


JOB_ENV = {
    **NETWORK_ENV,
    "SCALEOUT_TEST_MARK": "reached-every-rank",
    "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30",
}


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


def received_bytes(hosts: Hosts, name: str) -> int:
    return hosts.interface_bytes(name)["rx"]


def test_two_by_two_ranks_over_ssh(hosts, program):
    before = received_bytes(hosts, "hostB")
    result = scaleoutrun_on_a(
        hosts, *job_options({"hostA": 2, "hostB": 2}), program=program, env=JOB_ENV
    )
    assert result.returncode == 0, result.stdout + result.stderr
    check_job(results(result.stdout), {"hostA": 2, "hostB": 2})
    # The 2 MiB allreduce crossed between the hosts over the veth pair.
    assert received_bytes(hosts, "hostB") - before > 1 << 20


def test_uneven_slots_from_a_hostfile(hosts, program, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=1\n")
    result = scaleoutrun_on_a(
        hosts,
        "--hostfile",
        str(hostfile),
        "--mpi-yield",
        "on",
        program=program,
        env={
            **JOB_ENV,
            "SCALEOUTRUN_SSH_PORT": str(SSH_PORT),
            "SCALEOUTRUN_NETWORK_INTERFACE": INTERFACE,
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    check_job(results(result.stdout), {"hostA": 2, "hostB": 1})


def test_an_unreachable_host_is_named(hosts):
    started = time.monotonic()
    result = scaleoutrun_on_a(hosts, "-H", "hostA:2,hostB:2", "--ssh-port", "2299")
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "host hostB could not be reached (ranks 2, 3 were to run there): ssh: connect to "
        "host hostb port 2299: Connection refused" in result.stderr
    )
    assert time.monotonic() - started < 30


def test_probing_a_host_over_ssh(hosts):
    # What scaleoutrun asks ssh when the launcher fails without naming a host.
    probe = (
        "import sys; from scaleout.launcher.unreachable import probe_hosts; "
        "print([u.line for u in probe_hosts(['hostB'], int(sys.argv[1]))])"
    )
    closed = hosts.run_on("hostA", [sys.executable, "-c", probe, "2299"], what="probing hostB")
    assert (
        closed.stdout.strip() == "['ssh: connect to host hostb port 2299: Connection refused']"
    ), closed.stdout
    open_ = hosts.run_on(
        "hostA", [sys.executable, "-c", probe, str(SSH_PORT)], what="probing hostB"
    )
    assert open_.stdout.strip() == "[]", open_.stdout


def test_a_host_that_never_starts_its_ranks_is_named(hosts):
    hosts.start_sshd("hostB", HANGING_SSH_PORT, force_command="sleep 300")
    result = scaleoutrun_on_a(
        hosts, "-H", "hostA:1,hostB:1", "--ssh-port", str(HANGING_SSH_PORT), "--start-timeout", "4"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank 1 (on hostB) did not start within 4 s (--start-timeout)" in result.stderr


# --- Note [Liveness] across machines: plain mpiexec, which leaves the survivors running ------

MP = Path(__file__).parent / "mp"
LEFT = "scaleout: a peer rank died, so MPI cannot be finalized"


def mpiexec_on_a(
    hosts: Hosts, slots: dict[str, int], argv: list[str], env: Optional[dict] = None
) -> subprocess.CompletedProcess:
    """The MPI's own launcher, without scaleoutrun, as a user of srun or an MPI operator has it:
    nothing stops the other ranks when one dies."""
    mpiexec = find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    variables = {
        **JOB_ENV,
        "UCX_NET_DEVICES": INTERFACE,
        "SCALEOUT_NETWORK_INTERFACE": INTERFACE,
        **(env or {}),
    }
    command = [
        mpiexec,
        "-disable-auto-cleanup",
        "-n",
        str(sum(slots.values())),
        "-launcher",
        "ssh",
        "-hosts",
        ",".join(f"{h}:{n}" for h, n in slots.items()),
    ]
    for name, value in variables.items():
        command += ["-genv", name, value]
    return hosts.run_on(
        "hostA",
        ["env", f"HYDRA_LAUNCHER_EXTRA_ARGS=-p {SSH_PORT}", *command, sys.executable, *argv],
    )


@pytest.mark.parametrize("mode", ["idle", "busy"])
@pytest.mark.parametrize(
    "slots",
    [{"hostA": 1, "hostB": 1}, {"hostA": 2, "hostB": 1}, {"hostA": 2, "hostB": 2}],
    ids=["np2", "np3", "np4-hierarchical"],
)
def test_a_rank_dying_on_another_host_is_named(hosts, slots, mode):
    # The last rank, on hostB, dies; the survivors on hostA cannot see its process.
    result = mpiexec_on_a(hosts, slots, [str(MP / "peer_death.py"), "last", mode])
    for _ in range(2):
        if mode != "busy" or "Segmentation fault" not in result.stdout + result.stderr:
            break
        # Known: MPICH over UCX can crash a survivor whose transfer to the peer is in flight
        # when the peer dies, before the death is seen (README, Note [Liveness]); a fresh CI
        # run of 2026-11-26 met it twice in a row. Two more tries; a hang or an unnamed death
        # still fails.
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
seen = sys.argv[1]   # a file rank 0 leaves once it has said what the test looks for
if r == n - 1:
    # Stops answering without dying (a machine that hangs, a cut link, a debugger); a child
    # ends it for good once rank 0 is done (the hosts share this file system).
    parent = os.getpid()
    if os.fork() == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(parent, signal.SIGKILL)
        os._exit(0)
    os.kill(parent, signal.SIGSTOP)
try:
    so.allreduce(np.ones(4), name="waits")
    print(f"rank {r}: no error", flush=True)
except so.HorovodInternalError as exc:
    print(f"rank {r}: ERROR {exc}", flush=True)
if r == 0:
    open(seen, "w").close()
"""


def test_a_rank_that_stops_answering_is_named(hosts, tmp_path):
    tmp_path.chmod(0o777)  # for rank 0's file, whoever the ranks run as
    program = tmp_path / "silent.py"
    program.write_text(SILENT_PROGRAM)
    result = mpiexec_on_a(
        hosts,
        {"hostA": 1, "hostB": 1},
        [str(program), str(tmp_path / "seen")],
        env={"SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS": "3"},
    )
    assert re.search(
        r"^\[?0?\]?\s*rank 0: ERROR rank 1 \(pid \d+ on hostB\) stopped answering: "
        r"nothing was heard from it for 3 s",
        result.stdout,
        re.M,
    ), result.stdout + result.stderr


def test_torchrun_on_each_host_makes_one_job(hosts):
    # As on a cluster with no MPI launcher: torchrun on each machine (--nnodes 2), its workers
    # joined through torch's store at hostA's address (Note [PMI bootstrap]: rank 0's PMI server
    # is reached across the link). tests/mp/torch_torchrun.py checks torch's and scaleout's
    # ranks, each host's local ranks, the collectives, a group that spans the hosts and DDP
    # equal to one process.
    pytest.importorskip("torch")
    script = Path(__file__).resolve().parent / "mp" / "torch_torchrun.py"
    store = hosts.addresses["hostA"]
    started = []
    for node, name in enumerate(hosts.names):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        argv += ["--node-rank", str(node), "--nproc-per-node", "2"]
        argv += ["--master-addr", store, "--master-port", "29500", str(script), "ddp"]
        started.append((name, hosts.start_on(name, argv, env=dict(NETWORK_ENV))))
    outputs = {}
    try:
        for name, proc in started:
            out, err = proc.communicate(timeout=240)
            outputs[name] = (proc.returncode, out, err)
    finally:
        for _, proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()
    for name, (code, out, err) in outputs.items():
        assert code == 0, f"{name}: torchrun exited with {code}\n{out[-3000:]}\n{err[-4000:]}"
        assert out.count("all checks passed") == 2, f"{name}:\n{out}\n{err[-3000:]}"
