"""scaleoutrun starting real ranks on this machine through the MPI's launcher.

Every launch is bounded by a subprocess timeout, so a launcher that fails to stop a job fails
the test instead of hanging it.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
from conftest import RANK, fake_mpiexec, rank_program, run_python, scaleoutrun

from scaleout.launcher.mpi_launcher import LaunchError, find_mpiexec


@pytest.fixture(scope="module", autouse=True)
def needs_mpiexec():
    try:
        find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    except LaunchError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("np", [2, 4])
def test_every_rank_runs_and_its_lines_carry_its_rank(tmp_path, np):
    program = rank_program(
        tmp_path,
        f"""
        import os, sys
        rank = {RANK}
        print("hello from", rank)
        print("second line", rank, flush=True)
        print("on stderr", rank, file=sys.stderr)
    """,
    )
    result = scaleoutrun("-np", str(np), sys.executable, program)
    assert result.returncode == 0, result.stderr
    for rank in range(np):
        assert f"[{rank}] hello from {rank}\n" in result.stdout
        assert f"[{rank}] second line {rank}\n" in result.stdout
        assert f"[{rank}] on stderr {rank}\n" in result.stderr
    # Whole lines only: nothing but prefixed lines reached stdout.
    assert all(re.match(r"\[\d\] ", line) for line in result.stdout.splitlines())


def test_mpi_works_inside_the_ranks(tmp_path):
    pytest.importorskip("mpi4py")
    program = rank_program(
        tmp_path,
        """
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        print("sum", comm.allreduce(comm.rank + 1), "size", comm.size)
    """,
    )
    result = scaleoutrun("-np", "4", sys.executable, program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sum 10 size 4") == 4


# A rank program's lines that wait until every one of `n` ranks has got this far (each leaves a
# file beside the program), instead of sleeping for a guess of how long starting takes.
def all_ranks_here(n: int) -> str:
    return f"""
        from pathlib import Path
        here = Path(__file__).parent
        (here / f'here.{{{RANK}}}').touch()
        deadline = time.monotonic() + 20
        while len(list(here.glob("here.*"))) < {n} and time.monotonic() < deadline:
            time.sleep(0.05)
    """


def test_a_rank_that_exits_non_zero_ends_the_job(tmp_path):
    program = rank_program(
        tmp_path,
        f"""
        import os, time
        if {RANK} == 1:
            os._exit(3)
        time.sleep(60)
    """,
    )
    started = time.monotonic()
    result = scaleoutrun("-np", "2", sys.executable, program, timeout=30)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "rank 1 exited with code 3" in result.stderr
    assert elapsed < 20, f"the sleeping rank kept the job alive for {elapsed:.0f} s"


def test_a_rank_killed_by_a_signal_ends_the_job(tmp_path):
    program = rank_program(
        tmp_path,
        """
        import os, signal, time
    """
        + all_ranks_here(4)
        + f"""
        if {RANK} == 2:   # once every rank runs
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)   # the scenario: the others would run on
    """,
    )
    started = time.monotonic()
    result = scaleoutrun("-np", "4", sys.executable, program, timeout=30)
    assert result.returncode == 128 + 9
    assert "rank 2 was killed by SIGKILL" in result.stderr
    assert time.monotonic() - started < 20


def test_a_rank_that_ignores_sigterm_is_killed(tmp_path):
    program = rank_program(
        tmp_path,
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    """
        + all_ranks_here(2)
        + f"""
        if {RANK} == 0:   # once every rank ignores SIGTERM
            raise SystemExit(5)
        time.sleep(60)   # the scenario: SIGTERM cannot end this
    """,
    )
    started = time.monotonic()
    result = scaleoutrun("-np", "2", sys.executable, program, timeout=40)
    assert result.returncode == 5
    assert "rank 0 exited with code 5" in result.stderr
    assert time.monotonic() - started < 25


def test_a_missing_program_is_named(tmp_path):
    result = scaleoutrun("-np", "2", str(tmp_path / "no-such-program"), timeout=30)
    assert result.returncode != 0
    assert "could not start" in result.stderr and "no-such-program" in result.stderr


def test_ranks_that_never_start_end_the_launch(tmp_path):
    # A launcher that starts nothing and ignores SIGTERM: the ranks are named, the launcher is
    # killed after the grace period.
    fake = fake_mpiexec(tmp_path, "trap '' TERM\nsleep 60\n")
    started = time.monotonic()
    result = scaleoutrun(
        "-np", "2", "--start-timeout", "1", "--mpiexec", fake, "python", "-c", "pass", timeout=40
    )
    assert result.returncode == 1
    assert "ranks 0, 1 (on localhost) did not start within 1 s" in result.stderr
    assert time.monotonic() - started < 20


def test_tuning_flags_and_the_users_environment_reach_every_rank(tmp_path):
    program = rank_program(
        tmp_path,
        """
        import os
        names = ["SCALEOUT_FUSION_THRESHOLD", "SCALEOUT_CYCLE_TIME", "SCALEOUT_CACHE_CAPACITY",
                 "SCALEOUT_STALL_CHECK_TIME_SECONDS", "SCALEOUT_TIMELINE", "MY_SETTING"]
        print(" ".join(f"{n}={os.environ.get(n)}" for n in names))
    """,
    )
    result = scaleoutrun(
        "-np",
        "2",
        "--fusion-threshold-mb",
        "8",
        "--cycle-time-ms",
        "3",
        "--cache-capacity",
        "16",
        "--stall-check-seconds",
        "9",
        "--timeline",
        "/tmp/tl.json",
        sys.executable,
        program,
        env={"MY_SETTING": "kept"},
    )
    assert result.returncode == 0, result.stderr
    expected = (
        f"SCALEOUT_FUSION_THRESHOLD={8 << 20} SCALEOUT_CYCLE_TIME=3 "
        "SCALEOUT_CACHE_CAPACITY=16 SCALEOUT_STALL_CHECK_TIME_SECONDS=9 "
        "SCALEOUT_TIMELINE=/tmp/tl.json MY_SETTING=kept"
    )
    assert result.stdout.count(expected) == 2


def test_mpi_yield_switch(tmp_path):
    program = rank_program(
        tmp_path,
        """
        import os
        print("yield", os.environ.get("MPIR_CVAR_ENABLE_HEAVY_YIELD"),
              os.environ.get("OMPI_MCA_mpi_yield_when_idle"))
    """,
    )
    on = scaleoutrun("-np", "2", "--mpi-yield", "on", sys.executable, program)
    assert on.returncode == 0, on.stderr
    assert on.stdout.count("yield") == 2 and "None None" not in on.stdout
    off = scaleoutrun(
        "-np",
        "2",
        "--mpi-yield",
        "off",
        sys.executable,
        program,
        env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "", "OMPI_MCA_mpi_yield_when_idle": ""},
    )
    assert off.returncode == 0, off.stderr
    assert off.stdout.count("yield  ") == 2  # the (empty) user settings, untouched


def test_hosts_are_handed_to_the_launcher(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine only\nlocalhost slots=2\n")
    program = rank_program(tmp_path, "print('ran')")
    for hosts in (["-H", "localhost:2"], ["--hostfile", str(hostfile)]):
        result = scaleoutrun(*hosts, "--verbose", sys.executable, program)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("ran") == 2  # -np defaults to the slots
        assert "localhost:2" in result.stderr  # the launcher command line, printed by -v


@pytest.mark.parametrize(
    "args",
    [
        ["-np", "0", "python"],
        ["-np", "-2", "python"],
        ["--bogus", "python"],
        ["-np", "2"],
        ["-H", "a:1", "-np", "3", "python"],
    ],
)
def test_usage_errors_exit_2(args):
    result = scaleoutrun(*args, timeout=30)
    assert result.returncode == 2
    assert "scaleoutrun: error:" in result.stderr


def test_check_build():
    result = scaleoutrun("--check-build", timeout=60)
    probe = run_python("from scaleout import _native; _native.build_info()")
    if probe.returncode != 0:  # the core is not built here: the report must say so, exit 1
        assert result.returncode == 1, result.stdout + result.stderr
        assert "cannot be loaded" in result.stderr
        pytest.skip("the native core is not loadable here; checked the error path only")
    assert result.returncode == 0, result.stderr
    for heading in ("scaleout core:", "built with:", "MPI", "torch", "tensorflow"):
        assert heading in result.stdout


def test_the_summary_names_the_rank_that_failed_first_in_cause(tmp_path):
    # Rank 1 raises after init; rank 0, waiting in a collective, then fails with ShutDownError
    # (often first in time). The summary names rank 1 and shows its last lines.
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
    for _ in range(3):
        result = scaleoutrun("-np", "2", sys.executable, program, timeout=45)
        assert result.returncode != 0
        summary = result.stderr[result.stderr.index("scaleoutrun: job failed") :]
        assert re.match(
            r"scaleoutrun: job failed: rank 1 (exited with code 1|failed first)", summary
        ), summary
        assert "rank 1's last lines" in summary and "a bug on rank one" in summary, summary


def test_the_ranks_an_error_blames_are_named_from_its_record(tmp_path):
    # Note [Rank reports]: rank 0's error, made as the core's errors are (from_core), blames
    # ranks 1 and 2 as data, in words scaleoutrun does not read; they never report an end.
    program = rank_program(
        tmp_path,
        f"""
        import os, time
        from scaleout._errors import from_core
        if {RANK} == 0:
            raise from_core("SHUT_DOWN", "the words do not matter", (1, 2), None)
        time.sleep(40)
    """,
    )
    result = scaleoutrun("-np", "3", sys.executable, program, timeout=45)
    assert result.returncode == 1, result.stderr
    summary = result.stderr[result.stderr.index("scaleoutrun: job failed") :]
    assert summary.startswith(
        "scaleoutrun: job failed: ranks 1, 2 failed first (the errors of the others name them); "
        "then rank 0 exited with code 1; the other ranks were stopped"
    ), summary
    assert "scaleoutrun: rank 0 reports" not in result.stderr  # consumed by scaleoutrun


def test_a_rank_that_leaves_early_is_named(tmp_path):
    # Rank 1 ends with exit code 0 without shutting scaleout down while rank 0 waits for it.
    program = rank_program(
        tmp_path,
        """
        import os
        import numpy as np
        import scaleout as so
        so.init()
        so.allreduce(np.ones(4), name="first")
        if so.rank() == 1:
            os._exit(0)
        so.allreduce(np.ones(4), name="never")
    """,
    )
    result = scaleoutrun("-np", "2", sys.executable, program, timeout=45)
    assert result.returncode != 0
    # Before rank 0 has failed, or after, with its error naming rank 1: rank 1 either way.
    assert re.search(
        r"job failed: rank 1 ended with code 0 while (rank 0 still ran|the others still needed "
        r"it \(without shutting scaleout down\))",
        result.stderr,
    ), result.stderr
    assert "without a rank reporting a failure" not in result.stderr


# The real launcher, its stderr (where the rank wrappers' reports pass on their way to
# scaleoutrun) copied through a filter that writes, per rank, the segments reported so far: a
# rank can wait for its wrappers' report itself instead of for a guessed time.
REPORTED_SEGMENTS = r"""
import re, sys
from pathlib import Path
directory, seen = Path(sys.argv[1]), {}
for line in sys.stdin.buffer:
    sys.stderr.buffer.write(line)
    sys.stderr.buffer.flush()
    found = re.match(rb"scaleoutrun: rank (\d+) on \S+ maps MPI segments (.+)$", line.rstrip())
    if found:
        names = seen.setdefault(int(found.group(1)), set())
        names.update(found.group(2).decode().split())
        temporary = directory / f".reported.{found.group(1).decode()}"
        temporary.write_text(" ".join(sorted(names)))
        temporary.replace(directory / f"reported.{found.group(1).decode()}")
"""


def test_mpi_segments_of_a_killed_job_are_removed(tmp_path):
    from scaleout.launcher import shm_cleanup

    real = find_mpiexec(os.environ.get("SCALEOUT_MPIEXEC"), sys.executable, os.environ)
    (tmp_path / "filter.py").write_text(REPORTED_SEGMENTS)
    launcher = tmp_path / "mpiexec"
    launcher.write_text(
        f'#!/bin/bash\nexec {real} "$@" '
        f"2> >(exec {sys.executable} {tmp_path / 'filter.py'} {tmp_path} >&2)\n"
    )
    launcher.chmod(0o755)
    program = rank_program(
        tmp_path,
        f"""
        import os, signal, sys, time
        from pathlib import Path
        import numpy as np
        import scaleout as so
        from scaleout.launcher import shm_cleanup
        so.init()
        so.allreduce(np.ones(1 << 16), name="warm")   # MPICH maps its segments by now
        rank = {RANK}
        mine = shm_cleanup.segments_mapped_by(os.getpid())
        Path({str(tmp_path)!r}, f"mapped.{{rank}}").write_text(" ".join(sorted(mine)))
        # Until this rank's wrapper has told scaleoutrun about them (its report went by).
        report, deadline = Path({str(tmp_path)!r}, f"reported.{{rank}}"), time.monotonic() + 20
        while mine and not (report.exists() and mine <= set(report.read_text().split())):
            if time.monotonic() > deadline:
                sys.exit(f"rank {{rank}}: no report of {{sorted(mine)}} within 20 s")
            time.sleep(0.05)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)   # the scenario: rank 0 still runs when rank 1 dies
    """,
    )
    before = set(os.listdir(shm_cleanup.SHM_DIR))
    result = scaleoutrun(
        "-np", "2", "--mpiexec", str(launcher), sys.executable, program, timeout=45
    )
    assert result.returncode != 0
    assert "killed by SIGKILL" in result.stderr, result.stderr  # not a rank's timeout
    # The job's own segments: other jobs on this machine may come and go meanwhile.
    mapped = {name for rank in (0, 1) for name in (tmp_path / f"mapped.{rank}").read_text().split()}
    if not mapped:
        pytest.skip("this MPI's ranks map no shared-memory segment")
    left = {
        name
        for name in set(os.listdir(shm_cleanup.SHM_DIR)) - before
        if name.startswith(shm_cleanup.PREFIXES) and name in mapped
    }
    assert not left, f"left behind in /dev/shm: {sorted(left)}"


def test_only_the_jobs_own_unmapped_segments_are_removed(tmp_path):
    import mmap

    from scaleout.launcher import shm_cleanup

    directory = tmp_path / "shm"
    directory.mkdir()
    # Segments this job's ranks mapped: one still mapped (by this process), one left behind.
    # And one the job never mapped: unmapped as far as this process can see, it may be a live
    # job's in another container that shares /dev/shm but not its pids.
    kept, stale, foreign = (
        directory / f"mpich_shm_{what}" for what in ("mapped", "stale", "other")
    )
    for path in (kept, stale, foreign):
        path.write_bytes(b"\0" * 4096)
    with open(kept, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert shm_cleanup.segments_mapped_by(os.getpid(), directory) == {kept.name}
        removed = shm_cleanup.remove_unmapped({kept.name, stale.name}, directory)
    assert removed == [stale.name]
    assert kept.exists() and not stale.exists() and foreign.exists()
