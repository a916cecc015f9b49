"""An elastic job under test: scaleoutrun running examples/elastic_pytorch_digits.py (or
another script) in the background, with a discovery script that prints a file the test may
change, and the test's hands on it: its commits as they are made, its ranks' processes (to
kill -9 them), its output when it ends. Used by tests/test_elastic.py and
tests/test_multihost_elastic.py."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

import pytest
from conftest import SCALEOUTRUN_MODULE

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "elastic_pytorch_digits.py"


class ElasticJob:
    def __init__(
        self,
        workdir: Path,
        hosts: str,
        flags: Sequence[str],
        script: Sequence[str],
        env: Optional[dict] = None,
        runner: Optional[Sequence[str]] = None,
        job: Optional[str] = None,
        store: Optional[Path] = None,
    ):
        """hosts: what the discovery script prints at first; flags: scaleoutrun's; script:
        the command of every rank; runner: what starts scaleoutrun (default: this Python);
        job, store: an earlier job's id and commits, to resume it."""
        self.dir = workdir
        self.hosts_file = workdir / "hosts.txt"
        self.hosts_file.write_text(hosts)
        self.store = store or workdir / "commits"
        self.job = job or f"test-{uuid.uuid4().hex[:8]}"
        self.out_path, self.err_path = workdir / "stdout.txt", workdir / "stderr.txt"
        command = [
            *(runner or [sys.executable]),
            "-m",
            SCALEOUTRUN_MODULE,
            *flags,
            "--host-discovery-script",
            f"cat {self.hosts_file}",
            *script,
        ]
        full_env = {
            **os.environ,
            "SCALEOUT_ELASTIC_JOB": self.job,
            "SCALEOUT_ELASTIC_DIR": str(self.store),
            **(env or {}),
        }
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=err,
                env=full_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def set_hosts(self, hosts: str) -> None:
        temporary = self.hosts_file.with_suffix(".new")
        temporary.write_text(hosts)
        temporary.replace(self.hosts_file)  # the script never reads half a file

    def newest_commit(self) -> int:
        """The newest commit any host has marked complete, -1 before the first."""
        found = [
            int(m.group(1))
            for path in self.store.glob("*/commit-*.done")
            if (m := re.match(r"commit-(\d+)\.done$", path.name))
        ]
        return max(found, default=-1)

    def wait_for(self, what: str, ready, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended before {what}\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"no {what} within {timeout} s\n{self.output()}")
            time.sleep(0.02)

    def wait_for_commit(self, at_least: int) -> None:
        self.wait_for(f"commit {at_least}", lambda: self.newest_commit() >= at_least)

    def rank_pid(self, rank: int, generation: int) -> Optional[int]:
        """The process of the rank's program (not its wrapper) in that generation."""
        found = self._rank_process(rank, generation)
        return found[0] if found is not None else None

    def rank_variables(self, rank: int, generation: int) -> dict[str, str]:
        """The environment of the rank's program in that generation, once it runs."""
        found = []
        self.wait_for(
            f"rank {rank} of generation {generation}",
            lambda: found.append(self._rank_process(rank, generation)) or found[-1],
        )
        return found[-1][1]

    def _rank_process(self, rank: int, generation: int) -> Optional[tuple[int, dict[str, str]]]:
        wanted = {
            f"SCALEOUT_ELASTIC_JOB={self.job}",
            f"PMI_RANK={rank}",
            f"SCALEOUT_ELASTIC_GENERATION={generation}",
        }
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"rank_exec.py" in cmdline or b"scaleout.launcher" in cmdline:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    variables = set(f.read().decode(errors="replace").split("\0"))
            except OSError:
                continue
            if wanted <= variables:
                pairs = (item.partition("=") for item in variables if "=" in item)
                return int(entry), {name: value for name, _, value in pairs}
        return None

    def kill_rank(self, rank: int, generation: int) -> None:
        """kill -9 of the rank's program, once it runs."""
        found = []
        self.wait_for(
            f"rank {rank} of generation {generation}",
            lambda: found.append(self.rank_pid(rank, generation)) or found[-1],
        )
        os.kill(found[-1], signal.SIGKILL)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def finish(self, timeout: float = 150) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the elastic job did not finish in {timeout} s (a hang)\n{self.output()}")
        return subprocess.CompletedProcess(
            self.proc.args,
            self.proc.returncode,
            self.out_path.read_text(),
            self.err_path.read_text(),
        )

    def output(self) -> str:
        return f"--- stdout\n{self.out_path.read_text()}\n--- stderr\n{self.err_path.read_text()}"


def digits_result(stdout: str) -> tuple[float, dict[int, int]]:
    """The example's test accuracy, and how many training samples were trained on how many
    times (from --count-samples)."""
    accuracy = float(re.search(r"test accuracy ([\d.]+)", stdout).group(1))
    counts = re.search(r"was trained on: (\{.*\})", stdout).group(1)
    return accuracy, ast.literal_eval(counts)
