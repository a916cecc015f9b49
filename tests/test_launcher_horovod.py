"""scaleoutrun and horovodrun 0.28.1's command line: every horovodrun flag is taken with its
meaning or refused by name; the config file; where the new settings go. Nothing is started."""

from __future__ import annotations

import dataclasses
import re

import pytest

from scaleout.launcher.config import parse_config
from scaleout.launcher.errors import UsageError
from scaleout.launcher.hosts import HostSlots
from scaleout.launcher.mpi_launcher import (
    LaunchRequest,
    MPIExec,
    MPIFamily,
    build_command,
    launcher_variables,
)
from scaleout.launcher.options import HOROVOD_ONLY, OPTIONS
from scaleout.launcher.output import LinePrefixer, horovod_timestamp, rank_output_dir
from scaleout.launcher.plan import tuning_environment
from scaleout.launcher.unreachable import _ssh_command

HYDRA = MPIExec("/venv/bin/mpiexec", MPIFamily.HYDRA)
OPEN_MPI = MPIExec("/opt/ompi/bin/mpirun", MPIFamily.OPEN_MPI)
RANK = ("/venv/bin/python", "/x/rank_exec.py", "--", "python", "train.py")
TWO_HOSTS = (HostSlots("h1", 2), HostSlots("h2", 2))

# Every option string of horovodrun 0.28.1's parser (horovod/runner/launch.py, parse_args),
# written out by hand, each with a value when it takes one.
HOROVODRUN_FLAGS = {
    "-h": None,
    "--help": None,
    "-v": None,
    "--version": None,
    "-np": "2",
    "--num-proc": "2",
    "-cb": None,
    "--check-build": None,
    "--disable-cache": None,
    "--start-timeout": "30",
    "--network-interfaces": "eth0,eth1",
    "--network-interface": "eth0",
    "--output-filename": "logs",
    "--verbose": None,
    "--config-file": "config.yaml",
    # SSH arguments
    "-p": "2222",
    "--ssh-port": "2222",
    "-i": "/home/me/.ssh/id",
    "--ssh-identity-file": "/k",
    # tuneable parameter arguments
    "--fusion-threshold-mb": "32",
    "--cycle-time-ms": "5",
    "--cache-capacity": "512",
    "--hierarchical-allreduce": None,
    "--no-hierarchical-allreduce": None,
    "--hierarchical-allgather": None,
    "--no-hierarchical-allgather": None,
    # autotune arguments
    "--autotune": None,
    "--no-autotune": None,
    "--autotune-log-file": "at.csv",
    "--autotune-warmup-samples": "3",
    "--autotune-steps-per-sample": "10",
    "--autotune-bayes-opt-max-samples": "20",
    "--autotune-gaussian-process-noise": "0.8",
    # elastic arguments
    "--min-np": "2",
    "--min-num-proc": "2",
    "--max-np": "4",
    "--max-num-proc": "4",
    "--slots-per-host": "2",
    "--elastic-timeout": "600",
    "--reset-limit": "3",
    "--blacklist-cooldown-range": "60 300",
    # timeline arguments
    "--timeline-filename": "t.json",
    "--timeline-mark-cycles": None,
    "--no-timeline-mark-cycles": None,
    # stall check arguments
    "--no-stall-check": None,
    "--stall-check": None,
    "--stall-check-warning-time-seconds": "60",
    "--stall-check-shutdown-time-seconds": "120",
    # library arguments
    "--mpi-threads-disable": None,
    "--no-mpi-threads-disable": None,
    "--mpi-args": "-genv A 1",
    "--tcp": None,
    "--binding-args": "-bind-to none",
    "--num-nccl-streams": "2",
    "--thread-affinity": "1",
    "--gloo-timeout-seconds": "30",
    # logging arguments
    "--log-level": "INFO",
    "--log-with-timestamp": None,
    "--log-without-timestamp": None,
    "-prefix-timestamp": None,
    "--prefix-output-with-timestamp": None,
    "--log-hide-timestamp": None,
    "--no-log-hide-timestamp": None,
    # host arguments
    "-H": "localhost:2",
    "--hosts": "localhost:2",
    "-hostfile": "hosts.txt",
    "--hostfile": "hosts.txt",
    "--host-discovery-script": "./discover.sh",
    # controller arguments
    "--gloo": None,
    "--mpi": None,
    "--jsrun": None,
}

ACCEPTED = {flag for option in OPTIONS for flag in option.spellings} | {"-h", "--help"}
REFUSED = {flag for refusal in HOROVOD_ONLY for flag in refusal.flags}


def parse(*argv: str, **environ: str):
    return parse_config(list(argv), environ)


def test_every_horovodrun_flag_is_either_taken_or_refused():
    for flag in HOROVODRUN_FLAGS:
        assert (flag in ACCEPTED) != (flag in REFUSED), flag
    assert not ACCEPTED & REFUSED


@pytest.mark.parametrize(
    "flag", sorted(f for f in HOROVODRUN_FLAGS if f in ACCEPTED and f not in ("-h", "--help"))
)
def test_accepted_horovodrun_flags_parse(flag, tmp_path):
    value = HOROVODRUN_FLAGS[flag]
    if flag == "--config-file":
        value = str(tmp_path / "empty.yaml")
        (tmp_path / "empty.yaml").write_text("")
    # one word per value: --blacklist-cooldown-range takes two
    words = value.split() if flag == "--blacklist-cooldown-range" else [value]
    args = [flag] + (words if value is not None else [])
    if flag in ELASTIC_FLAGS and flag != "--host-discovery-script":
        args += ["--host-discovery-script", "./discover.sh"]
    config = parse(*args, "python", "train.py")
    assert config.command == ("python", "train.py")


ELASTIC_FLAGS = (
    "--min-np",
    "--min-num-proc",
    "--max-np",
    "--max-num-proc",
    "--slots-per-host",
    "--slots",
    "--elastic-timeout",
    "--reset-limit",
    "--blacklist-cooldown-range",
    "--host-discovery-script",
)


def test_elastic_flags_take_horovodruns_values():
    config = parse(
        "-np",
        "3",
        "--min-np",
        "2",
        "--max-np",
        "5",
        "--slots-per-host",
        "2",
        "--elastic-timeout",
        "30",
        "--reset-limit",
        "4",
        "--blacklist-cooldown-range",
        "10",
        "100",
        "--host-discovery-script",
        "./discover.sh",
        "python",
        "train.py",
    )
    assert config.elastic and config.command == ("python", "train.py")
    assert (
        config.min_np,
        config.max_np,
        config.slots_per_host,
        config.elastic_timeout,
        config.reset_limit,
        config.blacklist_cooldown,
    ) == (2, 5, 2, 30, 4, (10, 100))
    assert parse("-np", "2", "-H", "a:1,b:1", "--min-np", "1", "python").elastic
    assert not parse("-np", "2", "python").elastic
    # Horovod's variable for the timeout, and scaleoutrun's pair variable
    env = parse(
        "--host-discovery-script",
        "d.sh",
        "-np",
        "2",
        "python",
        HOROVOD_ELASTIC_TIMEOUT="7",
        SCALEOUTRUN_BLACKLIST_COOLDOWN_RANGE="5 9",
    )
    assert env.elastic_timeout == 7 and env.blacklist_cooldown == (5, 9)
    # ... which a job that is not elastic ignores, while a flag is an error
    assert parse("-np", "2", "python", HOROVOD_ELASTIC_TIMEOUT="7").elastic_timeout == 7


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--max-np", "4"), "--max-np only applies to an elastic job"),
        (("--reset-limit", "1"), "--reset-limit only applies to an elastic job"),
        (("--host-discovery-script", "d.sh", "-H", "a:2"), "either --host-discovery-script or -H"),
        (("--host-discovery-script", "d.sh", "--min-np", "3"), "--min-np 3 is more than -np 2"),
        (("--host-discovery-script", "d.sh", "--max-np", "1"), "--max-np 1 is less than -np 2"),
        (
            ("--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "0", "5"),
            "0 is not a positive integer",
        ),
        (
            ("--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "5", "3601"),
            "1 <= MIN <= MAX <= 3600",
        ),
        (
            ("--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "9", "5"),
            "1 <= MIN <= MAX <= 3600",
        ),
        (
            ("--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "9"),
            "--blacklist-cooldown-range: 'python' is not an integer",
        ),
    ],
)
def test_elastic_flags_that_cannot_be_carried_out(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse("-np", "2", *argv, "python", "train.py")


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_refused_flags_are_named_with_what_to_do(flag):
    value = HOROVODRUN_FLAGS.get(flag)
    args = [flag] + (value.split()[:1] if value is not None else [])
    with pytest.raises(
        UsageError, match=f"^{re.escape(flag)} \\(horovodrun\\) is not supported: .{{20,}}"
    ):
        parse("-np", "2", *args, "python", "train.py")
    if value is not None:  # the --flag=value spelling too
        with pytest.raises(UsageError, match=re.escape(flag)):
            parse("-np", "2", f"{flag}={value}", "python", "train.py")


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--gloo", "Gloo"),
        ("--num-nccl-streams", "GPU"),
        ("--binding-args", "--bind-to"),
        ("--thread-affinity", "--ep-affinity"),
        ("--mpi-threads-disable", "MPI_THREAD_MULTIPLE"),
        ("--log-with-timestamp", "--prefix-output-with-timestamp"),
        ("--tcp", "--mpi-args"),
    ],
)
def test_refusals_say_why(flag, expected):
    with pytest.raises(UsageError, match=re.escape(expected)):
        parse(flag, "python")


def test_a_refused_flag_after_the_command_belongs_to_the_command():
    assert parse("-np", "2", "python", "x.py", "--gloo").command == ("python", "x.py", "--gloo")


def test_abbreviations_are_named():
    # horovodrun's argparse takes unique prefixes; scaleoutrun does not, and says so.
    with pytest.raises(UsageError, match="--fusion-threshold-mb"):
        parse("--fusion-thresh", "4", "python")


# --- the spellings and what they fill ---------------------------------------------------------


def test_short_and_single_dash_spellings():
    config = parse(
        "-p", "2200", "-i", "/keys/id", "-hostfile", "hosts", "-prefix-timestamp", "python"
    )
    assert (config.ssh_port, config.ssh_identity_file, config.hostfile) == (
        2200,
        "/keys/id",
        "hosts",
    )
    assert config.prefix_output_with_timestamp
    assert parse("-cb").check_build
    assert parse("-v").version and parse("--version").version  # no command needed
    assert not parse("--verbose", "python").version


def test_network_interfaces_in_every_spelling():
    config = parse(
        "--network-interface",
        "eth0",
        "--network-interfaces",
        "eth1,eth2",
        "--network-interface",
        "eth0,eth3",
        "python",
    )
    assert config.network_interfaces == ("eth0", "eth1", "eth2", "eth3")
    assert parse("python", SCALEOUTRUN_NETWORK_INTERFACES="ib0,ib1").network_interfaces == (
        "ib0",
        "ib1",
    )
    assert parse("python", SCALEOUTRUN_NETWORK_INTERFACE="ib0").network_interfaces == ("ib0",)
    # The flag wins over both variables.
    assert parse(
        "--network-interface", "eth9", "python", SCALEOUTRUN_NETWORK_INTERFACES="ib0"
    ).network_interfaces == ("eth9",)
    for bad in ("eth0,,eth1", "", "eth 0"):
        with pytest.raises(UsageError):
            parse("--network-interfaces", bad, "python")


def test_timeline_stall_and_log_flags_become_core_variables():
    config = parse(
        "--timeline-filename",
        "/tmp/t.json",
        "--timeline-mark-cycles",
        "--stall-check-warning-time-seconds",
        "30",
        "--stall-check-shutdown-time-seconds",
        "90",
        "--no-stall-check",
        "--log-level",
        "debug",
        "python",
    )
    assert tuning_environment(config) == {
        "SCALEOUT_TIMELINE": "/tmp/t.json",
        "SCALEOUT_TIMELINE_MARK_CYCLES": "1",
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": "30",
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "SCALEOUT_STALL_CHECK_DISABLE": "1",
        "SCALEOUT_LOG_LEVEL": "DEBUG",
    }
    # The older spellings mean the same.
    assert parse("--timeline", "a.json", "--stall-check-seconds", "7", "python") == parse(
        "--timeline-filename", "a.json", "--stall-check-warning-time-seconds", "7", "python"
    )
    # As horovodrun: cycle marks only with a timeline; --stall-check undoes --no-stall-check.
    assert "SCALEOUT_TIMELINE_MARK_CYCLES" not in tuning_environment(
        parse("--timeline-mark-cycles", "python")
    )
    assert (
        tuning_environment(
            parse("--timeline-filename", "t", "--no-timeline-mark-cycles", "python")
        )["SCALEOUT_TIMELINE_MARK_CYCLES"]
        == "0"
    )
    assert tuning_environment(parse("--no-stall-check", "--stall-check", "python")) == {
        "SCALEOUT_STALL_CHECK_DISABLE": "0"
    }


@pytest.mark.parametrize("level", ["TRACE", "debug", "Info", "WARNING", "error", "fatal"])
def test_log_levels_are_horovods_names(level):
    assert parse("--log-level", level, "python").log_level == level.upper()


def test_bad_log_levels_and_the_variable():
    for bad in ("VERBOSE", "3", ""):
        with pytest.raises(UsageError, match="TRACE, DEBUG, INFO, WARNING, ERROR, FATAL"):
            parse("--log-level", bad, "python")
    assert parse("python", SCALEOUT_LOG_LEVEL="warning").log_level == "WARNING"
    assert parse("python", SCALEOUT_LOG_LEVEL="2").log_level == "2"  # the core's older form
    with pytest.raises(UsageError, match="SCALEOUT_LOG_LEVEL"):
        parse("python", SCALEOUT_LOG_LEVEL="loud")


def test_flags_that_change_nothing():
    quiet = parse("-np", "2", "python")
    noisy = parse(
        "-np",
        "2",
        "--disable-cache",
        "--mpi",
        "--no-mpi-threads-disable",
        "--log-without-timestamp",
        "--log-hide-timestamp",
        "python",
    )
    assert quiet == noisy
    # --disable-cache is horovodrun's start-up check cache, not the core's response cache.
    assert "SCALEOUT_CACHE_CAPACITY" not in tuning_environment(noisy)


def test_autotune_flags_pass_horovods_settings_on_only_with_autotune():
    flags = [
        "--autotune-log-file",
        "tune.csv",
        "--autotune-warmup-samples",
        "0",
        "--autotune-steps-per-sample",
        "5",
        "--autotune-bayes-opt-max-samples",
        "12",
        "--autotune-gaussian-process-noise",
        "0.25",
    ]
    assert tuning_environment(parse("--autotune", *flags, "python")) == {
        "SCALEOUT_AUTOTUNE": "1",
        "SCALEOUT_AUTOTUNE_LOG": "tune.csv",
        "SCALEOUT_AUTOTUNE_WARMUP_SAMPLES": "0",
        "SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "12",
        "SCALEOUT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.25",
    }
    # Without --autotune they are passed on too (HOROVOD_AUTOTUNE=1 may be in the ranks'
    # environment; if not, the core names them as having no effect); --no-autotune drops them.
    assert tuning_environment(parse(*flags, "python")) == {
        k: v
        for k, v in tuning_environment(parse("--autotune", *flags, "python")).items()
        if k != "SCALEOUT_AUTOTUNE"
    }
    assert tuning_environment(parse("--autotune", "--no-autotune", *flags, "python")) == {
        "SCALEOUT_AUTOTUNE": "0"
    }
    from_file = parse_with_file(
        "autotune:\n  enabled: true\n  log_file: t.csv\n  steps_per_sample: 4\n", "python"
    )
    assert tuning_environment(from_file) == {
        "SCALEOUT_AUTOTUNE": "1",
        "SCALEOUT_AUTOTUNE_LOG": "t.csv",
        "SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE": "4",
    }
    for bad in (
        ["--autotune-steps-per-sample", "0"],
        ["--autotune-bayes-opt-max-samples", "101"],
        ["--autotune-gaussian-process-noise", "-1"],
    ):
        with pytest.raises(UsageError, match=re.escape(bad[0])):
            parse("--autotune", *bad, "python")


@pytest.mark.parametrize("what", ["allreduce", "allgather"])
def test_hierarchical_flags_and_variables(what):
    var, field = f"SCALEOUT_HIERARCHICAL_{what.upper()}", f"hierarchical_{what}"
    assert var not in tuning_environment(parse("python"))
    on = parse(f"--hierarchical-{what}", "python")
    off = parse(f"--no-hierarchical-{what}", "python")
    assert tuning_environment(on)[var] == "1"
    assert tuning_environment(off)[var] == "0"
    assert getattr(parse("python", **{var: "auto"}), field) is None
    assert getattr(parse("python", **{var: "0"}), field) is False
    with pytest.raises(UsageError, match=var):
        parse("python", **{var: "sometimes"})


def test_mpi_args_are_split_like_a_shell():
    assert parse("--mpi-args=-genv A '1 2'", "python").mpi_args == ("-genv", "A", "1 2")
    assert parse("--mpi-args", "--mca btl ^openib", "python").mpi_args == (
        "--mca",
        "btl",
        "^openib",
    )
    assert parse("python", SCALEOUTRUN_MPI_ARGS="-l").mpi_args == ("-l",)
    with pytest.raises(UsageError, match="cannot be split"):
        parse("--mpi-args", "-genv A 'open", "python")


def test_mpi_args_go_to_the_launcher_before_the_rank_command():
    for launcher in (HYDRA, OPEN_MPI):
        command = build_command(
            launcher, LaunchRequest(np=2, rank_command=RANK, extra_args=("-l", "--x y"))
        )
        assert command[-len(RANK) - 2 :] == ["-l", "--x y", *RANK]


def test_every_flag_with_an_effect_has_a_variable():
    for option in OPTIONS:
        assert option.env or option.flags == ("-v", "--version"), option.flags


# --- ssh: port and identity -------------------------------------------------------------------


def test_identity_file_reaches_both_launchers_ssh():
    request = LaunchRequest(
        np=4, rank_command=RANK, hosts=TWO_HOSTS, ssh_port=2222, ssh_identity_file="/keys/id_job"
    )
    assert launcher_variables(HYDRA, request, {}) == {
        "HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222 -i /keys/id_job",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-p 2222 -i /keys/id_job",
    }
    ompi = build_command(OPEN_MPI, request)
    assert ompi[ompi.index("plm_rsh_args") + 1] == "-p 2222 -i /keys/id_job"
    only_key = LaunchRequest(
        np=4, rank_command=RANK, hosts=TWO_HOSTS, ssh_identity_file="/keys/id_job"
    )
    assert launcher_variables(HYDRA, only_key, {})["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-i /keys/id_job"
    through_slurm = LaunchRequest(
        np=4, rank_command=RANK, hosts=TWO_HOSTS, ssh_identity_file="/k", remote_launch="slurm"
    )
    assert launcher_variables(HYDRA, through_slurm, {}) == {}
    assert "plm_rsh_args" not in build_command(OPEN_MPI, through_slurm)


def test_identity_file_reaches_the_unreachable_host_probe():
    assert _ssh_command("hostb", 2222, "/keys/id", 5.0) == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        "2222",
        "-i",
        "/keys/id",
        "hostb",
        "true",
    ]
    assert "-i" not in _ssh_command("hostb", None, None, 5.0)


def test_identity_file_with_white_space_is_refused():
    with pytest.raises(UsageError, match="white space"):
        parse("-i", "/my keys/id", "python")


def test_several_interfaces_on_each_launcher():
    request = LaunchRequest(np=2, rank_command=RANK, network_interfaces=("eth1", "eth2"))
    hydra = build_command(HYDRA, request)
    assert hydra[hydra.index("-iface") + 1] == "eth1"  # Hydra takes one
    ompi = " ".join(build_command(OPEN_MPI, request))
    assert "--mca btl_tcp_if_include eth1,eth2 --mca oob_tcp_if_include eth1,eth2" in ompi


# --- output -----------------------------------------------------------------------------------


def test_timestamp_is_horovods_asctime():
    assert re.fullmatch(rb"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", horovod_timestamp())


def test_timestamped_lines_put_the_time_before_the_rank():
    ticks = iter([b"T1", b"T2", b"T3"])
    prefixer = LinePrefixer(b"[1] ", clock=lambda: next(ticks))
    assert prefixer.feed(b"par") == b""  # no complete line: no reading taken
    assert prefixer.feed(b"tial\nsecond\nthi") == b"T1[1] partial\nT1[1] second\n"
    assert prefixer.finish() == b"T2[1] thi\n"


@pytest.mark.parametrize(
    "size, rank, name",
    [
        (1, 0, "rank.0"),
        (2, 1, "rank.1"),
        (10, 3, "rank.3"),
        (11, 3, "rank.03"),
        (101, 7, "rank.007"),
    ],
)
def test_output_files_are_padded_to_sort(size, rank, name):
    assert rank_output_dir("/logs", rank, size) == f"/logs/1/{name}"


# --- the config file --------------------------------------------------------------------------

HOROVOD_CONFIG = """
controller: mpi
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: false
  hierarchical_allgather: false
autotune:
  enabled: false
  log_file: 'horovod_autotune_log.txt'
  warmup_samples: 5
timeline:
  filename: 'horovod_timeline.json'
  mark_cycles: true
stall_check:
  enabled: true
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  mpi_threads_disable: false
logging:
  level: info
  with_timestamp: false
"""


def parse_with_file(text: str, *argv: str, **environ: str):
    return parse_config(
        ["--config-file", "c.yaml", *argv], environ, read_text={"c.yaml": text}.__getitem__
    )


def test_config_file_in_horovods_layout():
    config = parse_with_file(HOROVOD_CONFIG, "python")
    assert tuning_environment(config) == {
        "SCALEOUT_FUSION_THRESHOLD": str(32 << 20),
        "SCALEOUT_CYCLE_TIME": "10",
        "SCALEOUT_AUTOTUNE": "0",  # and, as horovodrun, no other autotune setting with it off
        "SCALEOUT_CACHE_CAPACITY": "2048",
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": "120",
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": "240",
        "SCALEOUT_STALL_CHECK_DISABLE": "0",
        "SCALEOUT_HIERARCHICAL_ALLREDUCE": "0",  # the file says false: as Horovod, flat
        "SCALEOUT_HIERARCHICAL_ALLGATHER": "0",
        "SCALEOUT_TIMELINE": "horovod_timeline.json",
        "SCALEOUT_TIMELINE_MARK_CYCLES": "1",
        "SCALEOUT_LOG_LEVEL": "INFO",
    }


def test_command_line_wins_over_the_file_which_wins_over_the_environment():
    config = parse_with_file(
        HOROVOD_CONFIG,
        "--cache-capacity",
        "7",
        "--stall-check",
        "--no-timeline-mark-cycles",
        "python",
        SCALEOUT_CYCLE_TIME="3",
        SCALEOUT_TIMELINE="env.json",
        SCALEOUTRUN_NP="4",
    )
    assert config.cache_capacity == 7  # the flag, not the file's 2048
    assert config.timeline_mark_cycles is False  # the flag, not the file's true
    assert config.stall_check_disable is False
    assert config.cycle_time_ms == 10  # the file, not the environment's 3
    assert config.timeline == "horovod_timeline.json"
    assert config.np == 4  # not in the file: the environment's
    assert parse_with_file("stall_check:\n  enabled: false\n", "python").stall_check_disable


def test_config_file_named_by_its_variable(tmp_path):
    path = tmp_path / "hvd.yaml"
    path.write_text("params:\n  cycle_time_ms: 2.5\n")
    assert parse("python", SCALEOUTRUN_CONFIG_FILE=str(path)).cycle_time_ms == 2.5
    assert parse("--config-file", str(path), "python").cycle_time_ms == 2.5


@pytest.mark.parametrize(
    "text, named",
    [
        ("params:\n  fusion_treshold_mb: 4\n", "'params.fusion_treshold_mb'"),
        ("parms:\n  cycle_time_ms: 4\n", "'parms'"),
        ("params:\n  cache_capacity: -1\n", "params.cache_capacity"),
        ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms"),
        ("params:\n  cycle_time_ms: true\n", "params.cycle_time_ms"),
        ("timeline:\n  mark_cycles: 'yes please'\n", "timeline.mark_cycles"),
        ("logging:\n  level: LOUD\n", "logging.level"),
        ("controller: gloo\n", "controller"),
        ("controller: nccl\n", "controller"),
        ("autotune:\n  steps_per_sample: 0\n", "autotune.steps_per_sample"),
        ("library_options:\n  num_nccl_streams: 2\n", "library_options.num_nccl_streams"),
        ("library_options:\n  mpi_threads_disable: true\n", "library_options.mpi_threads_disable"),
        ("logging:\n  with_timestamp: true\n", "logging.with_timestamp"),
        ("params: 5\n", "params"),
        ("- a\n- b\n", "top level"),
        ("params: {cycle_time_ms: [1\n", "not valid YAML"),
    ],
)
def test_config_file_errors_name_the_key(text, named):
    with pytest.raises(UsageError, match=re.escape(named)) as raised:
        parse_with_file(text, "python")
    assert str(raised.value).startswith("config file c.yaml: ")


def test_unknown_keys_list_the_known_ones():
    with pytest.raises(
        UsageError,
        match="known in params: cache_capacity, cycle_time_ms, "
        "fusion_threshold_mb, hierarchical_allgather, "
        "hierarchical_allreduce",
    ):
        parse_with_file("params:\n  fusion: 1\n", "python")


def test_empty_config_file_and_sections():
    nothing = dataclasses.replace(parse("python"), config_file="c.yaml")
    assert parse_with_file("", "python") == nothing
    assert parse_with_file("params:\ntimeline:\n", "python") == nothing


def test_unreadable_config_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read the config file"):
        parse("--config-file", str(tmp_path / "missing.yaml"), "python")
