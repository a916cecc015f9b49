"""horovodrun's launch-time flags with real ranks on this machine (2 of them): output files,
timestamps, --mpi-args, the ssh identity file, the config file, --version and refusals.

Every launch is bounded by a subprocess timeout, as in test_launcher_launch.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap

import pytest
from conftest import RANK, rank_program, scaleoutrun

from scaleout.launcher.mpi_launcher import LaunchError, MPIFamily, find_mpiexec, probe_family

# Horovod's timestamp (C's asctime) directly followed by scaleoutrun's rank tag.
STAMPED = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[(\d)\] (.*)$")


@pytest.fixture(scope="module")
def launcher():
    try:
        return probe_family(
            find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
        )
    except LaunchError as exc:
        pytest.skip(str(exc))


def two_line_program(tmp_path) -> str:
    return rank_program(
        tmp_path,
        f"""
        import os, sys
        rank = {RANK}
        print("out", rank, flush=True)
        print("err", rank, file=sys.stderr, flush=True)
        print("out again", rank)
    """,
    )


def test_output_filename_writes_each_ranks_files_and_the_terminal_still_gets_them(
    launcher, tmp_path
):
    program = two_line_program(tmp_path)
    result = scaleoutrun(
        "-np", "2", "--output-filename", "logs", sys.executable, program, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        where = tmp_path / "logs" / "1" / f"rank.{rank}"  # relative to scaleoutrun's cwd
        assert (where / "stdout").read_text() == f"[{rank}] out {rank}\n[{rank}] out again {rank}\n"
        assert (where / "stderr").read_text() == f"[{rank}] err {rank}\n"
        assert f"[{rank}] out again {rank}\n" in result.stdout
        assert f"[{rank}] err {rank}\n" in result.stderr
    assert sorted(os.listdir(tmp_path / "logs" / "1")) == ["rank.0", "rank.1"]


def test_output_filename_that_cannot_be_created_is_a_usage_error(launcher, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = scaleoutrun(
        "-np", "2", "--output-filename", str(blocker / "logs"), sys.executable, "-c", "pass"
    )
    assert result.returncode == 2
    assert "--output-filename" in result.stderr


def test_prefix_output_with_timestamp(launcher, tmp_path):
    program = two_line_program(tmp_path)
    result = scaleoutrun(
        "-np",
        "2",
        "--prefix-output-with-timestamp",
        "--output-filename",
        str(tmp_path / "logs"),
        sys.executable,
        program,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        match = STAMPED.match(line)
        assert match, line
        assert match.group(2).startswith("out") and match.group(2).endswith(match.group(1))
    err_lines = [line for line in result.stderr.splitlines() if STAMPED.match(line)]
    assert sorted(STAMPED.match(line).group(2) for line in err_lines) == ["err 0", "err 1"]
    # The files get the same lines as the terminal.
    saved = (tmp_path / "logs" / "1" / "rank.1" / "stdout").read_text().splitlines()
    assert [STAMPED.match(line).group(2) for line in saved] == ["out 1", "out again 1"]


def test_mpi_args_reach_the_launcher(launcher, tmp_path):
    program = rank_program(
        tmp_path,
        f"""
        import os
        print("got", {RANK}, os.environ.get("FROM_MPI_ARGS"))
    """,
    )
    if launcher.family is MPIFamily.HYDRA:
        extra = "-genv FROM_MPI_ARGS 'two words'"
    else:
        extra = "-x 'FROM_MPI_ARGS=two words'"
    result = scaleoutrun("-np", "2", f"--mpi-args={extra}", sys.executable, program)
    assert result.returncode == 0, result.stderr
    assert "[0] got 0 two words\n" in result.stdout and "[1] got 1 two words\n" in result.stdout


def test_identity_file_and_port_reach_the_ssh_the_launcher_runs(launcher, tmp_path):
    if launcher.family is not MPIFamily.HYDRA:
        pytest.skip("the stand-in ssh below speaks to Hydra's proxy launch")
    # An ssh stand-in on PATH: it records its arguments and runs the remote command here, so
    # the "remote" host is this machine reached the way a real one would be.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "ssh_calls"
    ssh = bin_dir / "ssh"
    ssh.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {calls}
        while [ $# -gt 0 ]; do
          case "$1" in
            -p|-i|-o|-l) shift 2 ;;
            -*) shift ;;
            *) break ;;
          esac
        done
        shift
        exec sh -c "$*"
        """)
    )
    ssh.chmod(0o755)
    key = tmp_path / "id_job"
    key.write_text("not a real key\n")
    program = rank_program(
        tmp_path,
        f"""
        import os
        print("ran", {RANK})
    """,
    )
    result = scaleoutrun(
        "-H",
        "localhost:1,far.invalid:1",
        "-p",
        "2222",
        "-i",
        str(key),
        sys.executable,
        program,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    assert "[0] ran 0\n" in result.stdout and "[1] ran 1\n" in result.stdout
    recorded = calls.read_text().split()
    assert recorded[recorded.index("-i") + 1] == str(key)
    assert recorded[recorded.index("-p") + 1] == "2222"
    assert "far.invalid" in recorded


def test_missing_identity_file_is_a_usage_error(launcher, tmp_path):
    result = scaleoutrun("-np", "2", "-i", str(tmp_path / "no_key"), sys.executable, "-c", "pass")
    assert result.returncode == 2
    assert "--ssh-identity-file" in result.stderr and "no_key" in result.stderr


def _layouts():
    me = socket.gethostname()
    return [
        (
            ["-np", "3", "-H", "localhost:2,127.0.0.1:1"],
            {
                0: ["localhost", "0", "3", "0", "2", "0", "2"],
                1: ["localhost", "1", "3", "1", "2", "0", "1"],
                2: ["127.0.0.1", "2", "3", "0", "1", "1", "2"],
            },
        ),
        (
            ["-np", "2", "-H", f"{me}:1,localhost:1"],
            {0: [me, "0", "2", "0", "1", "0", "2"], 1: ["localhost", "1", "2", "0", "1", "1", "2"]},
        ),
        (["-np", "2"], {k: ["localhost", str(k), "2", str(k), "2", "0", "1"] for k in (0, 1)}),
    ]


@pytest.mark.parametrize("hosts, want", _layouts(), ids=["np3-two-names", "np2-hostname", "np2"])
def test_every_rank_gets_horovodruns_rank_variables(launcher, tmp_path, hosts, want):
    # Note [horovodrun's rank variables]: set before the program starts, as horovodrun sets
    # them, from the hosts as -H names them (localhost without -H).
    program = rank_program(
        tmp_path,
        """
        import json, os
        names = ("HOSTNAME", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
        print("VARS", json.dumps([os.environ.get("HOROVOD_" + name) for name in names]))
        import scaleout
        scaleout.init()
    """,
    )
    result = scaleoutrun(*hosts, sys.executable, program)
    assert result.returncode == 0, result.stderr
    got = {
        int(rank): json.loads(found)
        for rank, found in re.findall(r"^\[(\d)\] VARS (.*)$", result.stdout, re.M)
    }
    assert got == want
    # The core reads none of them and, unlike a HOROVOD_* variable without effect, says nothing
    # of them (native/common/config.cc kLauncherSet).
    assert "HOROVOD_" not in result.stderr, result.stderr


def test_config_file_and_tuning_flags_reach_every_rank(launcher, tmp_path):
    config = tmp_path / "horovod.yaml"
    config.write_text(
        "params:\n  cycle_time_ms: 4\n  cache_capacity: 64\n"
        "timeline:\n  filename: /tmp/tl.json\n  mark_cycles: true\n"
        "stall_check:\n  enabled: false\n  shutdown_time_seconds: 30\n"
    )
    program = rank_program(
        tmp_path,
        """
        import os
        names = ["SCALEOUT_CYCLE_TIME", "SCALEOUT_CACHE_CAPACITY", "SCALEOUT_TIMELINE",
                 "SCALEOUT_TIMELINE_MARK_CYCLES", "SCALEOUT_STALL_CHECK_DISABLE",
                 "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS", "SCALEOUT_LOG_LEVEL"]
        print(" ".join(f"{n}={os.environ.get(n)}" for n in names))
    """,
    )
    result = scaleoutrun(
        "-np",
        "2",
        "--config-file",
        str(config),
        "--cache-capacity",
        "8",
        "--log-level",
        "error",
        sys.executable,
        program,
    )
    assert result.returncode == 0, result.stderr
    expected = (
        "SCALEOUT_CYCLE_TIME=4 SCALEOUT_CACHE_CAPACITY=8 SCALEOUT_TIMELINE=/tmp/tl.json "
        "SCALEOUT_TIMELINE_MARK_CYCLES=1 SCALEOUT_STALL_CHECK_DISABLE=1 "
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS=30 SCALEOUT_LOG_LEVEL=ERROR"
    )
    assert result.stdout.count(expected) == 2


@pytest.mark.parametrize("flag", ["-v", "--version"])
def test_version(flag):
    result = scaleoutrun(flag)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*\n", result.stdout)


def test_refused_flag_exits_2_naming_it():
    result = scaleoutrun("-np", "2", "--gloo", "python", "-c", "pass")
    assert result.returncode == 2
    assert "--gloo (horovodrun) is not supported: scaleout has no Gloo" in result.stderr
