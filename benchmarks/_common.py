"""What the benchmarks share: timing collectives the same way (Bench), formatting, the native
core's identity and a free port. Imports MPI only when a Bench is used, so a launcher process
(dlrm.py's and multihost.py's parents, dlrm.py's DDP workers) can import this without starting
MPI."""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import statistics
from time import perf_counter as perf

__all__ = [
    "Bench",
    "CheckFailed",
    "core_info",
    "cpu_model",
    "cpuset",
    "fmt_time",
    "free_port",
    "run_on_hosts",
    "table",
]


class CheckFailed(Exception):
    """A benchmark's result was wrong: its figures would mean nothing."""


class Bench:
    """Times callables with a barrier before each iteration; an iteration's time is the
    maximum over ranks."""

    def __init__(self, comm):
        self.comm = comm

    def run_block(self, fn, iters: int):
        import numpy as np
        from mpi4py import MPI

        local = np.empty(iters, dtype=np.float64)
        for i in range(iters):
            self.comm.Barrier()
            t0 = perf()
            fn()
            local[i] = perf() - t0
        worst = np.empty_like(local)
        self.comm.Allreduce(local, worst, op=MPI.MAX)
        return worst

    def interleaved(self, fns: list, iters: int, warmup: int) -> list:
        """Runs every fn `warmup` times, then `iters` timed iterations of each in alternating
        blocks (order reversed every round), so machine noise hits them alike; returns one
        array of per-iteration times per fn."""
        import numpy as np

        for fn in fns:
            for _ in range(warmup):
                fn()
        self.comm.Barrier()
        rounds = min(iters, 10)
        block_sizes = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
        times = [[] for _ in fns]
        order = list(range(len(fns)))
        for b in block_sizes:
            for k in order:
                times[k].append(self.run_block(fns[k], b))
            order.reverse()
        return [np.concatenate(t) for t in times]


def back_to_back_medians(fns: list, blocks: int, seconds: float, comm, warmup: int) -> list:
    """Per fn, the median over `blocks` blocks of its seconds per call: each block runs fn back
    to back for about `seconds` (the same number of calls on every rank: rank 0's clock decides,
    over `comm`, an mpi4py communicator) and counts the slowest rank's time per call; the fns
    alternate block by block (A B B A ...) so that the machine's state hits all alike. Each fn
    first runs `warmup` times."""
    from mpi4py import MPI

    def block(fn) -> float:
        comm.Barrier()
        calls, t0 = 0, perf()
        while True:
            for _ in range(50):
                fn()
            calls += 50
            if comm.bcast(perf() - t0 >= seconds, root=0):
                break
        return comm.allreduce((perf() - t0) / calls, op=MPI.MAX)

    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    for _ in range(blocks):
        for k in order:
            times[k].append(block(fns[k]))
        order.reverse()
    return [statistics.median(t) for t in times]


def fmt_time(sec: float) -> str:
    if sec != sec:  # NaN
        return "-"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} us"
    if sec < 1.0:
        return f"{sec * 1e3:.3g} ms"
    return f"{sec:.3g} s"


def table(rows: list, headers: list, align: list) -> list:
    """A Markdown table's lines; align holds "r" (right) or "l" per column."""
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]

    def line(cells):
        return (
            "| "
            + " | ".join(
                (str(c).rjust(w) if a == "r" else str(c).ljust(w))
                for c, w, a in zip(cells, widths, align)
            )
            + " |"
        )

    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align)
        )
        + "|"
    )
    return [line(headers), sep] + [line(r) for r in rows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpuset(cores) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    cores, parts, i = sorted(cores), [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)


def cpu_model() -> str:
    """The CPU's model name, for a benchmark's header ("unknown" where Linux does not say)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def core_info() -> str:
    """The native core's build line, file and a short hash: the core may be rebuilt between
    runs, so a table can be tied to the binary that produced it."""
    try:
        from scaleout import _native

        info = _native.build_info()
        path = info["library"]
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path)).astimezone()
        return (
            f"{info['build']}; {os.path.basename(path)} sha256:{digest} "
            f"built {mtime.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        )
    except Exception as e:  # informational only
        return f"unavailable ({type(e).__name__}: {e})"


def run_on_hosts(script: str, worker_args: list, hosts: int, rate: str, what: str) -> int:
    """Runs `script` with `worker_args` across `hosts` of tests/_hosts.py's network-namespace
    hosts, one rank each, every link limited to `rate` (tc tbf), started by scaleoutrun from the
    first host; prints rank 0's output. As root; where the hosts cannot be made it says why and
    returns 0 (a benchmark with nothing to measure here is not a failure)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _hosts import (
        INTERFACE,
        NETWORK_ENV,
        SSH_PORT,
        HostsUnavailable,
        LinkLimit,
        made_hosts,
        missing_prerequisite,
    )

    missing = missing_prerequisite(rate_limited=True)
    if missing:
        print(f"{what} across hosts skipped: {missing}")
        return 0
    with tempfile.TemporaryDirectory(prefix="scaleout-bench-") as workdir:
        try:
            with made_hosts(Path(workdir), hosts, LinkLimit(rate)) as made:
                command = [
                    sys.executable,
                    "-m",
                    "scaleout.launcher.main",
                    "-H",
                    ",".join(f"{h}:1" for h in made.names),
                    "--ssh-port",
                    str(SSH_PORT),
                    "--network-interface",
                    INTERFACE,
                    sys.executable,
                    str(Path(script).resolve()),
                    *worker_args,
                ]
                try:
                    done = made.run_on(made.names[0], command, env=NETWORK_ENV, timeout=3600)
                except subprocess.TimeoutExpired:
                    print("the job did not finish within an hour")
                    return 1
        except HostsUnavailable as exc:
            print(f"{what} across hosts skipped: {exc}")
            return 0
    print(f"{hosts} hosts x 1 rank, links at {rate} (tc tbf)")
    print(done.stdout.replace("[0] ", ""), end="")
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode
