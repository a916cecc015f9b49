#!/usr/bin/env python
"""Start-up under a real Slurm: the time from the command to the end of the first allreduce at
4 ranks on 2 nodes, ranks started by srun (--mpi=pmi2, no mpiexec) beside ranks started by
scaleoutrun inside an allocation (salloc, scaleoutrun reading it and starting Hydra's proxies
through srun).

    sudo python benchmarks/slurm_startup.py              # its own launcher: plain python, root
    python benchmarks/slurm_startup.py --runs 9

The cluster is tests/_slurm.py's (the Slurm tests' own): slurmctld, munge and a slurmd on hostA,
a slurmd on hostB, namespace hosts of this machine (tests/_hosts.py), made for the run and taken
down after it. The two commands, run from hostA:

    srun -N 2 -n 4 --mpi=pmi2 python slurm_startup.py --worker
    salloc -N 2 -n 4 scaleoutrun python slurm_startup.py --worker

Each rank (--worker) imports numpy and scaleout, calls init(), runs one 8-byte allreduce, prints
the wall-clock time at its end and shuts down. A run's figure is the latest rank's time minus the
time just before the command was started (the processes share this machine's clock); "whole
command" is until the command has returned (shutdown, the allocation's release). The two
commands alternate (A B B A ...) over --runs runs each, after one warm-up run of each (the first
job on a fresh cluster also pays for Python's file cache); the table gives the median, min and
max. The machine has 2 cores: 4 ranks and their launcher share them.

Where the cluster cannot be made (not root, no slurm-wlm or munge, no namespaces) it prints why
in one line and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the cluster is the tests' (tests/_slurm.py)

JOB_TIMEOUT = 120  # seconds: a start-up that takes longer is stuck
SCALEOUTRUN = [sys.executable, "-m", "scaleout.launcher.main"]


def worker() -> int:
    import numpy as np

    import scaleout as so

    so.init()
    so.allreduce(np.ones(1), name="first")
    print(f"FIRST {time.time():.6f}", flush=True)
    so.shutdown()
    return 0


def commands() -> dict[str, list[str]]:
    rank = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    return {
        "srun --mpi=pmi2": ["srun", "-N", "2", "-n", "4", "--mpi=pmi2", *rank],
        "salloc + scaleoutrun": ["salloc", "-N", "2", "-n", "4", *SCALEOUTRUN, *rank],
    }


def one_run(cluster, argv: list[str]) -> tuple[float, float]:
    """(to the end of the last rank's first allreduce, whole command) in seconds."""
    start = time.time()
    done = cluster.run(argv, timeout=JOB_TIMEOUT)
    whole = time.time() - start
    firsts = [float(line.split()[-1]) for line in done.stdout.splitlines() if "FIRST " in line]
    if done.returncode != 0 or len(firsts) != 4:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {done.returncode} with {len(firsts)} of 4 ranks' "
            f"times:\n{done.stdout}\n{done.stderr}"
        )
    return max(firsts) - start, whole


def versions(cluster) -> str:
    slurm = cluster.run(["sinfo", "--version"], timeout=30).stdout.strip()
    mpich = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split("\n")[0]
    return f"{slurm}; {mpich.strip()}"


def main(args) -> int:
    from _slurm import SlurmUnavailable, made_cluster

    forms = commands()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    try:
        with tempfile.TemporaryDirectory(prefix="slurm_startup_") as workdir:
            with made_cluster(Path(workdir), 2) as cluster:
                print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
                print(f"# {platform.node()}: {cpu_model()}, {os.cpu_count()} CPUs")
                print(f"# {versions(cluster)}")
                print(f"# 4 ranks on 2 nodes (hostA, hostB); {args.runs} runs each, medians\n")
                for argv in forms.values():
                    one_run(cluster, argv)  # warm-up
                order = list(forms)
                for _ in range(args.runs):
                    for name in order:
                        times[name].append(one_run(cluster, forms[name]))
                    order.reverse()
    except SlurmUnavailable as exc:
        print(f"slurm_startup: skipped: {exc}")
        return 0
    names = list(forms)
    print(f"{'':34}" + "".join(f"{name:>24}" for name in names))
    for index, what in enumerate(("command to first allreduce", "whole command")):
        cells = []
        for name in names:
            values = [run[index] for run in times[name]]
            cells.append(f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
        print(f"{what:34}" + "".join(f"{cell:>24}" for cell in cells))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each (default 7)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    sys.exit(worker() if parsed.worker else main(parsed))
