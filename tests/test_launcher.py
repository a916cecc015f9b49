"""scaleoutrun's pure pieces: arguments, hosts, the launcher command lines, reports, output."""

from __future__ import annotations

import os
import signal
import stat
import sys

import pytest
from conftest import run_job

from scaleout import _rank_report
from scaleout.launcher.command import RANK_EXEC
from scaleout.launcher.config import LaunchConfig, parse_config, split_command
from scaleout.launcher.errors import UsageError
from scaleout.launcher.exit_report import RankExit, parse_report, record_line
from scaleout.launcher.hosts import (
    HostSlots,
    is_local_host,
    parse_host_list,
    parse_hostfile,
    ranks_per_host,
    read_hostfile,
)
from scaleout.launcher.mpi_launcher import (
    LaunchError,
    LaunchRequest,
    MPIExec,
    MPIFamily,
    build_command,
    detect_family,
    exported_names,
    find_mpiexec,
    launcher_variables,
    yield_environment,
)
from scaleout.launcher.output import LinePrefixer
from scaleout.launcher.plan import (
    horovod_slots_environment,
    plan_job,
    resolve_hosts,
    torch_store_environment,
    tuning_environment,
)
from scaleout.launcher.rank_env import (
    horovod_rank_environment,
    local_rank_and_size,
    rank_from_environment,
    torch_rank_environment,
)
from scaleout.launcher.relay import BannerFilter, StderrRelay
from scaleout.launcher.report import summarize


def parse(*argv: str, **environ: str) -> LaunchConfig:
    return parse_config(list(argv), environ)


# --- arguments ----------------------------------------------------------------------------


def test_command_is_everything_after_our_flags():
    config = parse("-np", "4", "python", "train.py", "-np", "5", "--lr=0.1")
    assert config.np == 4
    assert config.command == ("python", "train.py", "-np", "5", "--lr=0.1")


def test_double_dash_separates_the_command():
    config = parse("-np", "2", "--", "-weird-program", "x")
    assert config.command == ("-weird-program", "x")
    assert split_command(["--timeline", "--", "python"]) == (["--timeline", "--"], ["python"])


def test_flag_spellings_and_values():
    config = parse("-n", "3", "-H", "a:2,b", "--mpi-yield", "OFF", "--verbose", "python", "x.py")
    assert (config.np, config.hosts, config.mpi_yield, config.verbose) == (3, "a:2,b", "off", True)
    assert parse("--num-proc=2", "python").np == 2


def test_tuning_flags_become_core_variables():
    config = parse(
        "-np",
        "2",
        "--fusion-threshold-mb",
        "32",
        "--cycle-time-ms",
        "2.5",
        "--cache-capacity",
        "0",
        "--stall-check-seconds",
        "30",
        "--timeline",
        "/tmp/t.json",
        "python",
        "x.py",
    )
    assert tuning_environment(config) == {
        "SCALEOUT_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "SCALEOUT_CYCLE_TIME": "2.5",
        "SCALEOUT_CACHE_CAPACITY": "0",
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30",
        "SCALEOUT_TIMELINE": "/tmp/t.json",
    }
    assert tuning_environment(parse("-np", "2", "python")) == {}


def test_every_flag_has_an_environment_variable():
    config = parse(
        "python",
        "x.py",
        SCALEOUTRUN_NP="3",
        SCALEOUTRUN_HOSTS="a:3",
        SCALEOUT_FUSION_THRESHOLD="1048576",
        SCALEOUT_CYCLE_TIME="5",
        SCALEOUTRUN_VERBOSE="1",
        SCALEOUTRUN_BIND_TO="core",
        SCALEOUTRUN_EP_SERVERS="2",
        SCALEOUT_MPIEXEC="/opt/mpi/bin/mpiexec",
    )
    assert config.np == 3 and config.hosts == "a:3" and config.verbose
    assert config.fusion_threshold_bytes == 1048576  # the variable holds bytes, the flag MiB
    assert config.cycle_time_ms == 5.0
    assert (config.bind_to, config.ep_servers) == ("core", 2)
    assert config.mpiexec == "/opt/mpi/bin/mpiexec"


def test_the_command_line_wins_over_the_environment():
    config = parse(
        "-np",
        "2",
        "--fusion-threshold-mb",
        "1",
        "python",
        SCALEOUTRUN_NP="8",
        SCALEOUT_FUSION_THRESHOLD="5",
    )
    assert (config.np, config.fusion_threshold_bytes) == (2, 1024 * 1024)


@pytest.mark.parametrize(
    "argv",
    [
        ["-np", "0", "python"],
        ["-np", "-1", "python"],
        ["-np", "two", "python"],
        ["--no-such-flag", "python"],
        ["-np", "2"],
        [],
        ["-np", "2", "-H", "a:1", "--hostfile", "f", "python"],
        ["-np", "2", "--bind-to", "everything", "python"],
        ["-np", "2", "--cache-capacity", "-3", "python"],
        ["-np", "2", "--fusion-threshold-mb", "nan", "python"],
    ],
)
def test_usage_errors(argv):
    with pytest.raises(UsageError):
        parse(*argv)


def test_a_bad_variable_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match="SCALEOUTRUN_NP"):
        parse("python", SCALEOUTRUN_NP="0")
    with pytest.raises(UsageError, match="SCALEOUT_CACHE_CAPACITY"):
        parse("-np", "1", "python", SCALEOUT_CACHE_CAPACITY="lots")


def test_check_build_needs_no_command():
    assert parse("--check-build").check_build


# --- hosts --------------------------------------------------------------------------------


def test_host_list():
    assert parse_host_list("a:2,b:3,c") == [HostSlots("a", 2), HostSlots("b", 3), HostSlots("c", 1)]
    assert parse_host_list("a:1,b:1,a:2") == [HostSlots("a", 3), HostSlots("b", 1)]


@pytest.mark.parametrize("text", ["a:0", "a:x", "a,,b", "a:-1", "bad host:2", ""])
def test_bad_host_lists(text):
    with pytest.raises(UsageError):
        parse_host_list(text)


def test_hostfile():
    text = """
    # the cluster
    node1 slots=4
    node2 slots=2 max_slots=8   # Open MPI's spelling works too
    node3:3

    node4
    """
    assert parse_hostfile(text) == [
        HostSlots("node1", 4),
        HostSlots("node2", 2),
        HostSlots("node3", 3),
        HostSlots("node4", 1),
    ]


@pytest.mark.parametrize(
    "text, where",
    [("node1 slots=0", "line 1"), ("node1\nnode2 cores=4", "line 2"), ("# nothing\n", "no hosts")],
)
def test_bad_hostfiles_name_the_line(text, where):
    with pytest.raises(UsageError, match=where):
        parse_hostfile(text)


def test_read_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb slots=2\n")
    assert read_hostfile(str(path)) == [HostSlots("a", 2), HostSlots("b", 2)]
    with pytest.raises(UsageError, match="cannot read hostfile"):
        read_hostfile(str(tmp_path / "missing"))


def test_ranks_fill_hosts_in_order():
    hosts = [HostSlots("a", 2), HostSlots("b", 2)]
    assert ranks_per_host(hosts, 3) == [HostSlots("a", 2), HostSlots("b", 1)]
    assert ranks_per_host(hosts, 1) == [HostSlots("a", 1)]
    with pytest.raises(UsageError, match="more than the 4 slots"):
        ranks_per_host(hosts, 5)


def test_local_host_names():
    assert is_local_host("localhost") and is_local_host("127.0.0.1")
    assert is_local_host("node7.cluster", local_names={"node7"})
    assert not is_local_host("node8", local_names={"node7"})


def test_plan():
    local = plan_job(parse("-np", "4", "python"), local_cpus=2)
    assert (local.np, local.hosts, local.local_ranks, local.oversubscribed) == (4, None, 4, True)
    assert not plan_job(parse("-np", "2", "python"), local_cpus=2).oversubscribed
    config = parse("-H", "localhost:2,remote:2", "python")
    plan = plan_job(config, local_cpus=2, source=resolve_hosts(config, {}))
    assert plan.np == 4 and plan.local_ranks == 2 and not plan.oversubscribed
    assert plan.remote_launch == "ssh"
    # two names of this machine: one machine's CPUs
    config = parse("-H", "localhost:2,127.0.0.1:1", "python")
    both = plan_job(config, local_cpus=2, source=resolve_hosts(config, {}))
    assert both.local_ranks == 3 and both.oversubscribed
    with pytest.raises(UsageError, match="-np"):
        plan_job(parse("python"), local_cpus=2)


def test_torch_store_environment_names_where_rank_0_runs():
    # Note [torch.distributed backend]: rank 0's host, reachable from every other host.
    def store(*argv):
        config = parse(*argv, "python")
        plan = plan_job(config, local_cpus=2, source=resolve_hosts(config, {}))
        return torch_store_environment(plan, lambda: 4242, lambda: "10.0.0.7")

    assert store("-np", "2") == {
        "SCALEOUT_TORCH_WORLD_SIZE": "2",
        "SCALEOUT_TORCH_MASTER_ADDR": "127.0.0.1",
        "SCALEOUT_TORCH_MASTER_PORT": "4242",
    }
    assert store("-H", "localhost:2,127.0.0.1:1")["SCALEOUT_TORCH_MASTER_ADDR"] == "127.0.0.1"
    # rank 0 here, others elsewhere: this machine's outward address, not loopback
    assert store("-H", "localhost:2,node2:2")["SCALEOUT_TORCH_MASTER_ADDR"] == "10.0.0.7"
    assert store("-H", "node1:2,localhost:2")["SCALEOUT_TORCH_MASTER_ADDR"] == "node1"
    assert store("-H", "node1:2,node2:2")["SCALEOUT_TORCH_WORLD_SIZE"] == "4"


def test_torch_rank_environment_from_the_mpi_launchers_variables():
    hydra = {"PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert torch_rank_environment(hydra) == {
        "SCALEOUT_TORCH_RANK": "3",
        "SCALEOUT_TORCH_LOCAL_RANK": "1",
        "SCALEOUT_TORCH_LOCAL_WORLD_SIZE": "2",
    }
    assert torch_rank_environment({"OMPI_COMM_WORLD_RANK": "0"}) == {"SCALEOUT_TORCH_RANK": "0"}
    assert torch_rank_environment({}) == {}


def test_horovod_rank_variables_as_horovodrun_gives_them():
    # Note [horovodrun's rank variables]: hosts a:2, b:1, c:3 in rank order.
    def horovod(rank, numbers=None):
        environ = {"PMI_RANK": str(rank), "SCALEOUT_HOROVOD_SLOTS": "a:2,b:1,c:3"}
        if numbers is not None:
            environ["SCALEOUT_HOROVOD_NUMBERS"] = numbers
        got = horovod_rank_environment(environ)
        return tuple(
            got[f"HOROVOD_{name}"]
            for name in ("HOSTNAME", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")
            + ("CROSS_RANK", "CROSS_SIZE")
        )

    assert horovod(0) == ("a", "0", "6", "0", "2", "0", "3")
    assert horovod(1) == ("a", "1", "6", "1", "2", "0", "2")  # local rank 1: on a and c
    assert horovod(2) == ("b", "2", "6", "0", "1", "1", "3")
    assert horovod(4) == ("c", "4", "6", "1", "3", "1", "2")
    assert horovod(5) == ("c", "5", "6", "2", "3", "0", "1")  # local rank 2: only on c
    # An elastic generation: each rank's worker number is its HOROVOD_RANK.
    assert horovod(2, "0,1,7,3,8,9")[:3] == ("b", "7", "6")
    assert horovod(2, "0,1")[1] == "2"  # not one per rank: the rank
    # Nothing said: nothing set.
    assert horovod_rank_environment({"PMI_RANK": "0"}) == {}
    assert horovod_rank_environment({"SCALEOUT_HOROVOD_SLOTS": "a:2"}) == {}
    assert horovod_rank_environment({"PMI_RANK": "2", "SCALEOUT_HOROVOD_SLOTS": "a:2"}) == {}
    # The slots scaleoutrun passes: -H's hosts, or localhost alone.
    config = parse("-H", "localhost:2,127.0.0.1:1", "python")
    plan = plan_job(config, local_cpus=2, source=resolve_hosts(config, {}))
    assert horovod_slots_environment(plan) == {"SCALEOUT_HOROVOD_SLOTS": "localhost:2,127.0.0.1:1"}
    alone = plan_job(parse("-np", "3", "python"), local_cpus=2)
    assert horovod_slots_environment(alone) == {"SCALEOUT_HOROVOD_SLOTS": "localhost:3"}


# --- the launcher command line ------------------------------------------------------------

HYDRA = MPIExec("/venv/bin/mpiexec", MPIFamily.HYDRA)
OPEN_MPI = MPIExec("/opt/ompi/bin/mpirun", MPIFamily.OPEN_MPI)
RANK = ("/venv/bin/python", "/x/rank_exec.py", "--", "python", "train.py")


def test_detect_family():
    hydra = "HYDRA build details:\n    Version:                                 5.0.2\n"
    assert detect_family(hydra) is MPIFamily.HYDRA
    assert detect_family("Intel(R) MPI Library for Linux* OS, Version 2021.10") is MPIFamily.HYDRA
    assert detect_family("mpirun (Open MPI) 4.1.5\n\nReport bugs to ...") is MPIFamily.OPEN_MPI
    assert detect_family("prterun (PMIx Reference RunTime Environment) 3.0.2") is MPIFamily.OPEN_MPI
    assert detect_family("something else 1.0") is None


def test_hydra_command_lines():
    assert build_command(HYDRA, LaunchRequest(np=2, rank_command=RANK)) == [
        "/venv/bin/mpiexec",
        "-n",
        "2",
        "-genvall",
        *RANK,
    ]
    hosts = (HostSlots("h1", 2), HostSlots("h2", 2))
    assert build_command(
        HYDRA, LaunchRequest(np=4, rank_command=RANK, hosts=hosts, exported=("IGNORED",))
    ) == [
        "/venv/bin/mpiexec",
        "-n",
        "4",
        "-launcher",
        "ssh",
        "-hosts",
        "h1:2,h2:2",
        "-genvall",
        *RANK,
    ]


def test_open_mpi_command_lines():
    request = LaunchRequest(
        np=4,
        rank_command=RANK,
        hosts=(HostSlots("h1", 2), HostSlots("h2", 2)),
        exported=("PATH", "SCALEOUT_CYCLE_TIME"),
        running_as_root=True,
    )
    assert build_command(OPEN_MPI, request) == [
        "/opt/ompi/bin/mpirun",
        "-np",
        "4",
        "--allow-run-as-root",
        "--host",
        "h1:2,h2:2",
        "--mca",
        "plm",
        "rsh",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "-x",
        "PATH",
        "-x",
        "SCALEOUT_CYCLE_TIME",
        *RANK,
    ]
    local = build_command(OPEN_MPI, LaunchRequest(np=4, rank_command=RANK, oversubscribed=True))
    assert local[:3] == ["/opt/ompi/bin/mpirun", "-np", "4"]
    assert "--allow-run-as-root" not in local
    assert local[local.index("--map-by") + 1] == "slot:OVERSUBSCRIBE"


def test_ssh_port_and_network_interface():
    request = LaunchRequest(
        np=2,
        rank_command=RANK,
        hosts=(HostSlots("h1", 1), HostSlots("h2", 1)),
        ssh_port=2222,
        network_interfaces=("eth1",),
    )
    hydra = build_command(HYDRA, request)
    assert hydra[hydra.index("-iface") + 1] == "eth1"
    assert launcher_variables(HYDRA, request, {})["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-p 2222"
    ompi = " ".join(build_command(OPEN_MPI, request))
    assert "--mca plm_rsh_args -p 2222" in ompi
    assert "--mca btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1" in ompi
    assert launcher_variables(OPEN_MPI, request, {}) == {}
    config = parse("--ssh-port", "2222", "python", SCALEOUTRUN_NETWORK_INTERFACE="ib0")
    assert (config.ssh_port, config.network_interfaces) == (2222, ("ib0",))


def test_exported_names_leave_out_the_launchers_own():
    names = exported_names(
        {
            "PATH": "/bin",
            "OMPI_COMM_WORLD_RANK": "0",
            "PMIX_RANK": "0",
            "BASH_FUNC_x%%": "() {}",
            "MY_VAR": "1",
            "bad name": "x",
        }
    )
    assert names == ("MY_VAR", "PATH")


def test_yield_only_when_oversubscribed_or_asked():
    assert yield_environment(MPIFamily.HYDRA, "auto", True, {}) == {
        "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"
    }
    assert yield_environment(MPIFamily.HYDRA, "auto", False, {}) == {}
    assert yield_environment(MPIFamily.HYDRA, "on", False, {}) != {}
    assert yield_environment(MPIFamily.HYDRA, "off", True, {}) == {}
    assert yield_environment(MPIFamily.OPEN_MPI, "auto", True, {}) == {
        "OMPI_MCA_mpi_yield_when_idle": "1"
    }
    # The user's own setting stays.
    assert (
        yield_environment(MPIFamily.HYDRA, "on", True, {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}) == {}
    )


def test_find_mpiexec(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    python = bindir / "python"
    with pytest.raises(LaunchError, match="no MPI launcher found"):
        find_mpiexec(None, str(python), {"PATH": str(tmp_path / "empty")})
    on_path = tmp_path / "path"
    on_path.mkdir()
    for directory in (on_path, bindir):
        exe = directory / "mpiexec"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        # The launcher beside the Python is preferred to PATH's.
        assert find_mpiexec(None, str(python), {"PATH": str(on_path)}) == str(exe)
    assert find_mpiexec(str(on_path / "mpiexec"), str(python), {}) == str(on_path / "mpiexec")
    with pytest.raises(LaunchError, match="SCALEOUT_MPIEXEC"):
        find_mpiexec(str(tmp_path / "nope"), str(python), {})


# --- ranks, reports and output ------------------------------------------------------------


def test_rank_from_each_launchers_variables():
    assert rank_from_environment({"PMI_RANK": "3"}) == "3"
    assert rank_from_environment({"OMPI_COMM_WORLD_RANK": "5"}) == "5"
    assert rank_from_environment({}) == "?"
    assert local_rank_and_size({"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}) == (1, 4)
    assert local_rank_and_size(
        {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    ) == (0, 2)
    assert local_rank_and_size(
        {"SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    ) == (1, 3)
    assert local_rank_and_size({}) == (None, None)


def test_reports_round_trip():
    for report in (
        RankExit("1", code=3),
        RankExit("0", signal=int(signal.SIGKILL)),
        RankExit("2", signal=40),
    ):
        assert parse_report(report.report_line().rstrip("\n")) == report
    assert RankExit("1", code=3).describe() == "rank 1 exited with code 3"
    assert RankExit("1", signal=9).describe() == "rank 1 was killed by SIGKILL"
    assert RankExit.from_returncode("4", -15).exit_status == 128 + 15
    assert parse_report("[1] scaleoutrun: rank 1 exited with code 3") is None  # program output


def test_stderr_relay_finds_reports_and_keeps_started_lines():
    relay = StderrRelay()
    assert (
        relay.feed(b"[0] noise\nscaleoutrun: rank 0 started on n1\nscaleoutrun: rank 2 exi")
        == b"[0] noise\n"
    )
    assert relay.reports == [] and relay.started == {0: "n1"}
    assert relay.feed(b"ted with code 7\n") == b"scaleoutrun: rank 2 exited with code 7\n"
    assert relay.reports == [RankExit("2", code=7)]
    assert relay.feed(b"no newline") == b"" and relay.finish() == b"no newline"


def _blames(rank: str, *culprits: int, error: str = "ShutDownError") -> bytes:
    """The line a rank's wrapper forwards for an error of the core that blames `culprits`."""
    return record_line(
        rank, _rank_report.encode({"error": error, "culprit_ranks": list(culprits)})
    ).encode()


def test_stderr_relay_notes_which_rank_an_error_blames():
    relay = StderrRelay()
    # As the core's errors say it: "rank 2 (pid 4242 on node7) died: ...", "rank 2 has shut
    # down", "rank 2 (pid 17) died"; and rank 2 about itself.
    assert (
        relay.feed(
            _blames("0", 2)
            + b"[0] scaleout.ShutDownError: rank 2 (pid 4242) died\n"
            + _blames("1", 2)
            + _blames("3", 2, error="TransportError")
            + _blames("2", 2)
        )
        == b"[0] scaleout.ShutDownError: rank 2 (pid 4242) died\n"
    )
    assert relay.blamed == {"0": (2,), "1": (2,), "3": (2,)}


def test_stderr_relay_notes_every_rank_an_error_blames():
    relay = StderrRelay()
    # "ranks 1, 2 have shut down": both are named; the first error a rank reports counts.
    relay.feed(_blames("0", 1, 2) + _blames("0", 3) + _blames("3", 0, 3))
    assert relay.blamed == {"0": (1, 2), "3": (0,)}
    # A rank's own output that looks like a record is its output, and blames nobody.
    assert relay.feed(b"[1] " + _blames("1", 2)) == b"[1] " + _blames("1", 2)
    assert "1" not in relay.blamed
    relay.feed(record_line("4", b"not json").encode() + record_line("4", b'{"x": 1}').encode())
    assert "4" not in relay.blamed
    failed = summarize(
        relay, ["n1"] * 4, 1, stopped=True, start_timed_out=False, start_timeout=0, interrupted=None
    )
    assert failed.message is not None  # no rank reported its end: the launcher's failure
    relay.feed(
        RankExit("0", code=1).report_line().encode() + RankExit("3", code=1).report_line().encode()
    )
    failed = summarize(
        relay, ["n1"] * 4, 1, stopped=True, start_timed_out=False, start_timeout=0, interrupted=None
    )
    assert failed.message.startswith(
        "scaleoutrun: job failed: ranks 1, 2 failed first (the errors of the others name them); "
        "then rank 0 exited with code 1; the other ranks were stopped"
    )
    assert failed.exit_status == 1


def test_the_rank_wrapper_forwards_its_programs_records(tmp_path):
    program = (
        "import scaleout._rank_report as report\n"
        "report.report_culprits('ShutDownError', [2, 1])\n"
        "report.report_culprits('ShutDownError', [1, 2])\n"  # the same: sent once
        "report.send({'note': 'more'})\n"
    )
    done = run_job(
        [
            sys.executable,
            str(RANK_EXEC),
            "--report-variable",
            _rank_report.VARIABLE,
            "--",
            sys.executable,
            "-c",
            program,
        ],
        "the rank wrapper",
        120,
        env={"PMI_RANK": "3"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[1:] == [
        'scaleoutrun: rank 3 reports {"culprit_ranks":[1,2],"error":"ShutDownError"}',
        'scaleoutrun: rank 3 reports {"note":"more"}',
        "scaleoutrun: rank 3 finished",
    ], done.stderr
    # Without the wrapper's socket, a program sends nothing and goes on.
    _rank_report.send({"culprit_ranks": [1]}, environ={})
    _rank_report.send(
        {"culprit_ranks": [1]}, environ={_rank_report.VARIABLE: "@scaleout-rank-report-nobody"}
    )


def test_stderr_relay_keeps_the_segments_each_host_mapped():
    from scaleout.launcher.exit_report import segments_line

    relay = StderrRelay()
    lines = (
        segments_line("0", "n1", {"mpich_shm_b", "mpich_shm_a"})
        + segments_line("2", "n2", {"mpich_shm_c"})
        + segments_line("1", "n1", {"mpich_shm_d"})
    )
    assert (
        relay.feed(lines.encode() + b"[1] scaleoutrun: rank 1 on n1 maps MPI segments x\n")
        == b"[1] scaleoutrun: rank 1 on n1 maps MPI segments x\n"
    )  # a rank's own output
    assert relay.segments == {
        "n1": {"mpich_shm_a", "mpich_shm_b", "mpich_shm_d"},
        "n2": {"mpich_shm_c"},
    }


def test_line_prefixer_holds_partial_lines():
    prefixer = LinePrefixer(b"[1] ")
    assert prefixer.feed(b"hel") == b""
    assert prefixer.feed(b"lo\nwor") == b"[1] hello\n"
    assert prefixer.feed(b"ld\n\n") == b"[1] world\n[1] \n"
    assert prefixer.feed(b"tail") == b""
    assert prefixer.finish() == b"[1] tail\n"
    assert LinePrefixer(b"> ", max_pending=4).feed(b"abcdef") == b"> abcdef\n"


HYDRA_BANNER = (
    b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
    b"=   EXIT CODE: 9\n" + b"=" * 83 + b"\nYOUR APPLICATION TERMINATED WITH THE EXIT "
    b"STRING: Killed (signal 9)\nThis typically refers to a problem with your "
    b"application.\nPlease see the FAQ page for debugging suggestions\n"
)


def test_banner_filter():
    dropped = BannerFilter()
    assert dropped.feed(b"[0] out\n" + HYDRA_BANNER + b"after\n", drop=True) == b"[0] out\nafter\n"
    kept = BannerFilter()
    first, second = HYDRA_BANNER[:100], HYDRA_BANNER[100:]
    assert kept.feed(b"[0] out\n" + first, drop=False) == b"[0] out\n"
    assert kept.feed(second, drop=False) == HYDRA_BANNER
    assert kept.finish(drop=False) == b""
    unfinished = BannerFilter()
    unfinished.feed(b"=" * 50 + b"\nhalf a banner\n", drop=False)
    assert unfinished.finish(drop=False) == b"=" * 50 + b"\nhalf a banner\n"


def test_environment_untouched():
    # The pure functions read the environment they are given, never os.environ.
    before = dict(os.environ)
    parse("-np", "2", "python", SCALEOUTRUN_NP="3")
    assert dict(os.environ) == before
