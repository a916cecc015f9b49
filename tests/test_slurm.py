"""Jobs under a real Slurm: slurmctld, three slurmd and munge from Debian's packages, on three
hosts made of namespaces (tests/_slurm.py over tests/_hosts.py), started here and taken down at
the end. Each job trains tests/mp/slurm_train.py's small model at 4 ranks on 2 nodes (5 on 3),
started in each of the ways a Slurm user starts one:

    salloc -N 2 -n 4 scaleoutrun python train.py   scaleoutrun reads the allocation (nodes and
                                                   tasks per node) and starts the ranks through
                                                   Slurm (Hydra's slurm launcher: srun)
    srun -N 2 -n 4 --mpi=pmi2 python train.py      Slurm starts the ranks; no mpiexec
    sbatch --wait job.sh                           a batch script running the first form
    (srun -n 2 scaleoutrun ... is refused: Note [Inside an srun step])

and each must train what the same job trains under scaleoutrun over ssh (the weights bit for
bit). Under srun, a rank that dies (or is killed from outside) is named by the survivors
(Note [Liveness]), and a step the MPI cannot read (no PMI plugin, or one it does not speak)
fails instead of running singletons (Note [No silent singletons]). srun starts Open MPI 5's and
4's ranks (--mpi=pmix) and Intel MPI's (--mpi=pmi2) too, from the environments
tools/make_mpi_envs.sh makes (tests/test_other_mpis.py runs a part of the suite there; without
them those cases skip).

Needs root, the hosts' tools (tests/_hosts.py) and `apt-get install -y slurm-wlm munge`; where
any is missing the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _hosts import SSH_PORT
from _slurm import Cluster, SlurmUnavailable, made_cluster
from conftest import MP, SCALEOUTRUN
from test_mpi_flavours import any_python

TRAIN = str(MP / "slurm_train.py")
PEER_DEATH = str(MP / "peer_death.py")
KILLED_RANK = str(MP / "slurm_killed_rank.py")
JOB_LIMIT = 60  # seconds any one job may take: the hang guard
JOB_ENV = {"SCALEOUT_STALL_CHECK_TIME_SECONDS": "30"}
# Four tasks on the first two nodes (a node that is still completing the last job would
# otherwise be passed over for the third).
ON_TWO = ("-N", "2", "-n", "4", "--nodelist=hostA,hostB")
# The MPIs srun starts here, each from its environment (test_mpi_flavours.any_python), and the
# plugin each reads.
PLUGINS = {"mpich": "pmi2", "openmpi": "pmix", "intelmpi": "pmi2", "openmpi4": "pmix"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with made_cluster(tmp_path_factory.mktemp("slurm"), 3) as made:
            yield made
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm test: {exc}")


def run(
    cluster: Cluster, *argv: str, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    try:
        return cluster.run(list(argv), timeout=JOB_LIMIT, env={**JOB_ENV, **(env or {})}, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        what = f"`{' '.join(argv)}` did not finish in {JOB_LIMIT} s (a hang)"
        pytest.fail(f"{what}\n{exc.output}\n{exc.stderr}")


def results(output: str) -> dict[int, dict]:
    """Every rank's RESULT line (scaleoutrun prefixes a rank's lines with [rank], srun not)."""
    found = {}
    for line in output.splitlines():
        match = re.search(r"RESULT (\{.*\})$", line)
        if match:
            got = json.loads(match.group(1))
            found[got["rank"]] = got
    return found


def check_training(found: dict[int, dict], slots: dict[str, int], weights: str | None) -> None:
    """Every rank ran where the allocation put it and ended with the same weights, `weights`
    when given (the reference job's)."""
    n = sum(slots.values())
    assert sorted(found) == list(range(n)), found
    rank_hosts = [host for host, count in slots.items() for _ in range(count)]
    for r, got in found.items():
        local_rank = rank_hosts[:r].count(rank_hosts[r])
        assert got["size"] == n and got["host"] == rank_hosts[r], got
        assert (got["local_rank"], got["local_size"]) == (local_rank, slots[rank_hosts[r]]), got
    assert len({got["weights"] for got in found.values()}) == 1, found
    if weights is not None:
        assert found[0]["weights"] == weights, (found[0], weights)


@pytest.fixture(scope="module")
def reference(cluster):
    """reference(hosts): the weights the job trains under scaleoutrun over ssh, outside Slurm,
    on `hosts` (-H's syntax); each run once."""
    known: dict[str, str] = {}

    def weights(hosts: str) -> str:
        if hosts not in known:
            argv = [*SCALEOUTRUN, "--slurm", "off", "-H", hosts, "--ssh-port", str(SSH_PORT)]
            done = run(cluster, *argv, sys.executable, TRAIN)
            assert done.returncode == 0, done.stdout + done.stderr
            found = results(done.stdout)
            slots = {host: int(n) for host, n in (entry.split(":") for entry in hosts.split(","))}
            check_training(found, slots, None)
            known[hosts] = found[0]["weights"]
        return known[hosts]

    return weights


@pytest.fixture(scope="module")
def reference_weights(reference) -> str:
    return reference("hostA:2,hostB:2")


def test_salloc_scaleoutrun_reads_the_allocation(cluster, reference_weights):
    done = run(cluster, "salloc", *ON_TWO, *SCALEOUTRUN, sys.executable, TRAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    check_training(results(done.stdout), {"hostA": 2, "hostB": 2}, reference_weights)


UNEVEN = {"hostA": 2, "hostB": 2, "hostC": 1}


def test_salloc_scaleoutrun_reads_uneven_tasks_per_node(cluster, reference):
    # SLURM_TASKS_PER_NODE=2(x2),1: five ranks on three nodes, two on each of the first two.
    done = run(cluster, "salloc", "-N", "3", "-n", "5", *SCALEOUTRUN, sys.executable, TRAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    check_training(results(done.stdout), UNEVEN, reference("hostA:2,hostB:2,hostC:1"))


@pytest.mark.parametrize("mpi", list(PLUGINS))
def test_srun_starts_the_ranks(cluster, reference_weights, mpi):
    python, plugin = any_python(mpi), PLUGINS[mpi]
    done = run(cluster, "srun", *ON_TWO, f"--mpi={plugin}", python, TRAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    check_training(results(done.stdout), {"hostA": 2, "hostB": 2}, reference_weights)


def test_srun_starts_uneven_tasks_on_three_nodes(cluster, reference):
    done = run(cluster, "srun", "-N", "3", "-n", "5", "--mpi=pmi2", sys.executable, TRAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    check_training(results(done.stdout), UNEVEN, reference("hostA:2,hostB:2,hostC:1"))


def test_sbatch_script(cluster, reference_weights, tmp_path):
    output = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "#SBATCH -N 2\n"
        "#SBATCH -n 4\n"
        "#SBATCH --nodelist=hostA,hostB\n"
        f"#SBATCH --output={output}\n"
        f"exec {' '.join(SCALEOUTRUN)} {sys.executable} {TRAIN}\n"
    )
    # --wait: sbatch returns when the job has ended, with the job's exit status.
    done = run(cluster, "sbatch", "--wait", str(script), cwd=tmp_path)
    log = output.read_text() if output.exists() else "(no output file)"
    assert done.returncode == 0, done.stdout + done.stderr + log
    check_training(results(log), {"hostA": 2, "hostB": 2}, reference_weights)


def test_salloc_scaleoutrun_names_a_dead_rank(cluster):
    # scaleoutrun's report of the rank that failed in cause (Note [Rank reports]) with its
    # daemons started through Slurm: rank 3, on the second node, dies after init.
    argv = ["salloc", *ON_TWO, *SCALEOUTRUN, sys.executable, PEER_DEATH]
    done = run(cluster, *argv, "last", "idle")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    # Named by its own exit code, or, when the survivors' exits reach scaleoutrun before its
    # (its node's report travels through Slurm), by their errors naming it: rank 3 either way.
    assert re.search(
        r"scaleoutrun: job failed: rank 3 (exited with code 9|failed first \(the errors of the "
        r"others name it\))",
        done.stderr,
    ), out


def test_scaleoutrun_under_srun_is_refused(cluster):
    # Note [Inside an srun step]: two scaleoutruns, each of which would start the whole job
    # (and whose own srun would wait forever for the CPUs their step holds), refuse at once.
    argv = ["salloc", *ON_TWO, "srun", "-N", "2", "-n", "2", *SCALEOUTRUN]
    done = run(cluster, *argv, sys.executable, TRAIN)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and not results(done.stdout), out
    assert out.count("scaleoutrun is running inside srun's job step") == 2, out
    assert "each of its tasks would start the whole job" in out, out


MEETING_LIMIT = 40  # seconds the survivors wait for each other: they report within seconds


@contextlib.contextmanager
def survivors_meeting(path: Path, survivors: int):
    """A Unix socket at `path` that holds each of tests/mp/peer_death.py's survivors (given it
    as PEER_DEATH_MEETING) until all have reported, or MEETING_LIMIT has passed: Slurm's pmix
    plugin ends the step when the first leaves without finalising PMIx, which would cut the
    others' reports short. Yields the list of those that arrived."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(survivors)
    arrived: list[socket.socket] = []

    def gather() -> None:
        deadline = time.monotonic() + MEETING_LIMIT
        with contextlib.suppress(OSError):
            while len(arrived) < survivors and time.monotonic() < deadline:
                server.settimeout(max(0.01, deadline - time.monotonic()))
                arrived.append(server.accept()[0])
        for held in arrived:  # lets them go
            held.close()

    gathering = threading.Thread(target=gather, daemon=True)
    gathering.start()
    try:
        yield arrived
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # ends a pending accept
        gathering.join(MEETING_LIMIT)
        server.close()
        for held in arrived:
            held.close()


@pytest.mark.parametrize(
    "mpi, victim, mode",
    [
        ("mpich", "last", "idle"),
        ("mpich", "zero", "idle"),
        ("mpich", "last", "busy"),
        ("openmpi", "last", "idle"),
        ("intelmpi", "last", "idle"),
        ("openmpi4", "last", "idle"),
    ],
    ids=["last-idle", "zero-idle", "last-busy", "openmpi", "intelmpi", "openmpi4"],
)
def test_srun_a_killed_rank_is_named(cluster, tmp_path, mpi, victim, mode):
    # srun leaves the other tasks running when one dies (KillOnBadExit=0, Slurm's default; its
    # pmix plugin ends the step once a survivor leaves): the survivors' liveness (Note
    # [Liveness]) must end their collectives with an error naming the dead rank, its pid and
    # host; tests/mp/peer_death.py checks the error on every rank. On Open MPI that takes its
    # fault tolerance, which scaleout turns on under srun (Note [Open MPI under srun]); there
    # Slurm may kill the step before every survivor has reported (below).
    python, plugin = any_python(mpi), PLUGINS[mpi]
    meeting = tmp_path / "meeting"
    with survivors_meeting(meeting, 3) as arrived:
        argv = ["srun", *ON_TWO, f"--mpi={plugin}", python, PEER_DEATH, victim, mode]
        done = run(cluster, *argv, env={"PEER_DEATH_MEETING": str(meeting)})
    dead, host = (3, "hostB") if victim == "last" else (0, "hostA")
    out = f"{len(arrived)} of 3 survivors reached the meeting\n{done.stdout}{done.stderr}"
    survivors = sorted(set(range(4)) - {dead})
    reported = [r for r in survivors if f"rank {r}: all checks passed" in done.stdout]
    if re.search(r"_errhandler: .*Error handler invoked", done.stderr):
        # Open MPI's fault tolerance tells PMIx of a failure it finds itself (a closed TCP
        # connection: PMIX_ERR_PROC_TERM_WO_SYNC from the survivor), and Slurm's pmix plugin
        # answers any error event by killing the step: a survivor may go before it reports
        # (Note [Open MPI under srun]). Those that reported were right, and one at least did.
        assert reported, out
    else:
        assert reported == survivors, out
    for r in reported:
        blame = rf"scaleout ERROR \(rank {r}\): rank {dead} \(pid \d+ on {host}\) died"
        assert re.search(blame, done.stderr), out
    # srun's own account: the dead task, by its exit status.
    assert f"{host}: task {dead}: Exited with exit code 9" in done.stderr, out
    assert done.returncode != 0, out


def test_srun_a_rank_killed_from_outside_is_named(cluster):
    # The last rank, on hostB, is sent SIGKILL by this test once it says it is up; the others
    # wait in an allreduce meanwhile and must each be told which rank died (Note [Liveness]).
    argv = ["srun", *ON_TWO, "--mpi=pmi2", sys.executable, KILLED_RANK]
    job = cluster.start_command(argv, env=JOB_ENV)
    lines: list[str] = []
    victim_up = threading.Event()

    def read_output() -> None:
        for line in job.stdout:
            lines.append(line)
            if line.startswith("VICTIM "):
                victim_up.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert victim_up.wait(JOB_LIMIT), "".join(lines)
        _, pid, host = next(line for line in lines if line.startswith("VICTIM ")).split()
        assert host == "hostB"
        os.kill(int(pid), signal.SIGKILL)
        job.wait(JOB_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end within {JOB_LIMIT} s of the kill (a hang)\n{lines}")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    reader.join(JOB_LIMIT)  # the rest of the output, up to the end of the pipe
    out = "".join(lines)
    for r in range(3):
        named = [line for line in lines if line.startswith(f"rank {r}: ")]
        assert named and named[0].startswith(f"rank {r}: named: rank 3 (pid {pid} on hostB)"), out
    assert "hostB: task 3: Killed" in out, out


def test_srun_without_a_pmi_plugin_is_refused(cluster):
    # --mpi=none: the tasks get no PMI, so MPI_Init makes each a job of one. Each must fail at
    # init naming srun's task count and the --mpi= value to use (Note [No silent singletons]),
    # not train four models alone.
    done = run(cluster, "srun", "-l", *ON_TWO, "--mpi=none", sys.executable, TRAIN)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert not results(done.stdout), out
    for task in range(4):
        lines = [line for line in out.splitlines() if line.startswith(f"{task}: ")]
        named = [line for line in lines if "SLURM_STEP_NUM_TASKS=4" in line]
        assert named and "--mpi=pmi2" in named[0], out


def test_srun_with_a_plugin_open_mpi_does_not_read_is_refused(cluster):
    # Open MPI reads PMIx only: under --mpi=pmi2 each task is a job of one, which must fail at
    # init naming the plugin srun used and the one to use.
    python = any_python("openmpi")
    done = run(cluster, "srun", "-l", *ON_TWO, "--mpi=pmi2", python, TRAIN)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and not results(done.stdout), out
    for task in range(4):
        lines = [line for line in out.splitlines() if line.startswith(f"{task}: ")]
        named = [line for line in lines if "PMI_SIZE=4" in line]
        assert named and "its --mpi=pmi2 plugin speaks" in named[0], out
        assert "run srun with --mpi=pmix" in named[0], out


def test_srun_with_pmix_is_refused_by_mpich(cluster):
    # Slurm's pmix plugin speaks PMIx, which the mpich wheel's MPICH does not: MPI_Init aborts
    # with MPICH's own message, on every task. (pmi2 is the plugin for MPICH.)
    done = run(cluster, "srun", *ON_TWO, "--mpi=pmix", sys.executable, TRAIN)
    out = done.stdout + done.stderr
    if "can not load PMIx library" in out:
        pytest.skip("Slurm's pmix plugin needs libpmix (apt-get install -y libpmix-dev)")
    assert done.returncode != 0, out
    assert not results(done.stdout), out
    assert out.count("unsupported PMI version PMIx") >= 4, out


def test_nothing_outlives_the_cluster(tmp_path):
    # A cluster taken down with a job still running: afterwards no process of it (daemons,
    # slurmstepd, the job's tasks on both nodes) is left on this machine, nor what the tasks
    # left in /dev/shm (each node has its own).
    marker = f"scaleout_slurm_test_{os.getpid()}"
    task = f"touch /dev/shm/{marker}_$SLURM_PROCID; exec sleep 300"
    try:
        with made_cluster(tmp_path, 2) as made:
            batch = ["sbatch", "-N", "2", "--wrap", f"srun sh -c '{task}'"]
            job = made.run(batch, timeout=JOB_LIMIT)
            assert job.returncode == 0, job.stdout + job.stderr
            sleeping = made.wait_for(
                lambda: [pid for pid, argv in made.processes().items() if _runs(argv, "sleep")],
                lambda found: len(found) == 2,
                "the job's task on both nodes",
            )
            started = set(made.processes()) | {daemon.pid for _, daemon in made.daemons}
            assert set(sleeping) <= started
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm test: {exc}")
    left = {pid: argv for pid, argv in _processes().items() if pid in started}
    assert not left, left
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(marker)]


def _runs(argv: list[str], program: str) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == program


def _processes() -> dict[int, list[str]]:
    """Every live process of this machine: its command line."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit():
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
                    found[int(entry)] = [arg.decode(errors="replace") for arg in argv]
        except OSError:
            pass
    return found
