#!/usr/bin/env python
"""How soon an elastic job goes on after losing a rank (Note [Elastic driver]), beside a cold
start of the same job, in one run.

    python benchmarks/elastic_recovery.py [--repeats 3] [--kill-at 10] [--namespaces]

Each repeat runs examples/elastic_pytorch_digits.py under scaleoutrun's elastic driver at 3
ranks on this machine (localhost:2 and 127.0.0.1:1, two names of it), kills rank 2 (SIGKILL,
from outside) once commit --kill-at is made, and times what follows. With --namespaces (root,
sshd) the ranks run on two hosts made of network namespaces (tests/_hosts.py: hostA:2 and
hostB:1, scaleoutrun on hostA, ranks started over ssh) and the whole of hostB is lost instead
(its sshd, the launcher's daemon and its rank killed at once). Times:
  cold start   scaleoutrun started -> the job's first commit (start-up, imports, one step)
  relaunch     the kill -> the driver starts the next generation (the survivors saw the death
               and stopped for a restart; the generation's end was judged)
  resume       the kill -> the next generation's first commit (its ranks started, loaded the
               newest commit, synced, trained a step and committed)
Medians over --repeats. A commit follows every step, so at most the step under way is lost.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _elastic_job import EXAMPLE, ElasticJob  # noqa: E402
from _hosts import INTERFACE, NETWORK_ENV, SSH_PORT, made_hosts  # noqa: E402


def one_run(workdir: Path, kill_at: int, hosts=None) -> dict:
    """One repeat; `hosts`: namespace hosts (tests/_hosts.py) to run on, else this machine."""
    command = [sys.executable, str(EXAMPLE), "--epochs", "30"]
    started = time.monotonic()
    if hosts is None:
        job = ElasticJob(
            workdir, "localhost:2\n127.0.0.1:1\n", ["-np", "3", "--min-np", "2"], command
        )
    else:
        job = ElasticJob(
            workdir,
            "hostA:2\nhostB:1\n",
            [
                "-np",
                "3",
                "--min-np",
                "2",
                "--ssh-port",
                str(SSH_PORT),
                "--network-interface",
                INTERFACE,
            ],
            command,
            env=NETWORK_ENV,
            runner=hosts._enter("hostA") + [sys.executable],
        )
    try:
        job.wait_for_commit(0)
        first = time.monotonic()
        job.wait_for_commit(kill_at)
        victim = job.rank_pid(2, generation=0)
        killed = time.monotonic()
        if hosts is None:
            os.kill(victim, signal.SIGKILL)
        else:
            hosts.kill_host("hostB")
        job.wait_for("generation 1", lambda: "generation 1:" in job.err_path.read_text())
        relaunched, before = time.monotonic(), job.newest_commit()  # generation 0 has ended
        job.wait_for("a commit of generation 1", lambda: job.newest_commit() > before)
        resumed = time.monotonic()
    finally:
        job.stop()
    return {
        "cold start": first - started,
        "relaunch": relaunched - killed,
        "resume": resumed - killed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument(
        "--namespaces", action="store_true", help="two hosts of network namespaces; hostB is lost"
    )
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="elastic-recovery-") as workdir:
            if args.namespaces:  # fresh hosts every repeat: the last one lost hostB
                (Path(workdir) / "hosts").mkdir()
                with made_hosts(Path(workdir) / "hosts", 2) as hosts:
                    runs.append(one_run(Path(workdir), args.kill_at, hosts))
            else:
                runs.append(one_run(Path(workdir), args.kill_at))
        print(
            f"repeat {repeat + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()),
            flush=True,
        )
    where = (
        "hostA:2 + hostB:1 (network namespaces), hostB lost"
        if args.namespaces
        else "localhost:2 + 127.0.0.1:1, rank 2 killed"
    )
    print(f"\nelastic job at 3 ranks on {where}; medians of {args.repeats}")
    print(f"{'phase':<12} {'seconds':>8}")
    for key in ("cold start", "relaunch", "resume"):
        print(f"{key:<12} {statistics.median(r[key] for r in runs):8.2f}")
    print(
        f"resume / cold start: "
        f"{statistics.median(r['resume'] / r['cold start'] for r in runs):.2f}x"
    )


if __name__ == "__main__":
    main()
