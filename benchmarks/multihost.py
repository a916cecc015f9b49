#!/usr/bin/env python
"""Multi-host benchmark: flat MPI, scaleout flat and scaleout hierarchical allreduce across
rate-limited links between network-namespace hosts on this machine, with the bytes that crossed
the links per allreduce, measured.

    sudo python benchmarks/multihost.py                    # its own launcher: plain python, root
    python benchmarks/multihost.py --quick                 # up to 16 MiB, few iterations
    python benchmarks/multihost.py --rates 1gbit --max-mb 64 --hosts 3 --ranks-per-host 2

The hosts are tests/_hosts.py's (the multi-host tests' own): hostA, hostB (, hostC ...), each a
network, UTS and mount namespace with an sshd, joined by veth links (two hosts: one pair; three
or more: each to a bridge in a switch namespace). Both ends of every link get
`tc qdisc replace dev <end> root tbf rate <R> burst <B> latency 100ms`, so each direction of
each host's link has rate R; B is what the link sends in 1 ms, at least 128 KiB
(tests/_hosts.py burst_for says why). Jobs run with UCX_TLS=self,tcp so that the ranks' bytes
between hosts cross the links (inside a host MPICH uses its own shared memory).

For each rate, two scaleoutrun jobs from hostA over ssh, each with ranks-per-host ranks on every
host (scaleoutrun --mpi-yield on: the ranks share this machine's cores):
  SCALEOUT_HIERARCHICAL_ALLREDUCE=0: mpi4py `comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)` (flat
      MPI, the baseline) beside scaleout's `so.allreduce_` (flat: MPI_Allreduce in the core);
  SCALEOUT_HIERARCHICAL_ALLREDUCE=1: the same mpi4py baseline beside scaleout hierarchical.
Each job times float32 Sum at 1 MiB .. --max-mb; the 200 x 16 KiB case (200 so.allreduce_async_
back to back, then synchronize; beside one pre-packed 3.2 MB mpi4py Allreduce and 200 back-to-back
16 KiB ones); float16 beside float32 allreduces of the same number of elements (4 and 16 MiB
of float32); allgather (1 and 8 MiB per rank, beside mpi4py's Allgather; the jobs also set
SCALEOUT_HIERARCHICAL_ALLGATHER to the mode) and alltoall (1 and 8 MiB sent per rank, beside
mpi4py's Alltoall); and benchmarks/torch_step.py's MLP step (its model and steppers: no
communication, scaleout's DistributedOptimizer, and the same with Compression.topk(0.01): the
top 1% of each gradient exchanged, the rest kept as residual; `--torch-only` runs only this).
The step's communication part is its time minus the no-communication step's.

Method (benchmarks/allreduce.py's): warm-up first; methods in alternating blocks (A B B A ...);
a barrier before every timed iteration; an iteration's time is the maximum over ranks; medians.
Bytes: around every timed block (warm-up excluded), each host's local rank 0 reads its link's
/sys/class/net/<if>/statistics/{tx,rx}_bytes and runs `ss -Htinp`, summing bytes_sent (TCP
payload, retransmissions included) of the established sockets each rank's pid owns whose peer is
on another host. A method's "link" figure is the sum over hosts of tx_bytes (frames with their
headers) over its blocks divided by its iterations; "per rank" the same from ss for each rank.
Both include the timing's own traffic (the barrier before each iteration, the maximum over
ranks), given on its own as "an empty iteration".

The script is its own launcher: run it as root with plain python (not under mpiexec or
scaleoutrun); it runs itself with --worker in the jobs. Where the hosts cannot be made (not root,
no ip, tc or sshd ...) it prints why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
from _common import Bench, CheckFailed, core_info, cpu_model, fmt_time, table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the hosts are the tests' (tests/_hosts.py)

KiB = 1024
MiB = 1024 * KiB
SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
SMALL_COUNT = 200
SMALL_FLOATS = 4096  # 16 KiB of float32
JOB_TIMEOUT = 3600  # seconds: a job that takes longer is stuck
MODES = {"0": "flat", "1": "hierarchical"}  # SCALEOUT_HIERARCHICAL_ALLREDUCE -> scaleout row

perf = time.perf_counter


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rates",
        default="1gbit,10gbit",
        help="link rates in tc's notation, comma-separated (default 1gbit,10gbit)",
    )
    p.add_argument(
        "--max-mb",
        type=float,
        default=256.0,
        help="largest allreduce in MiB, from 1 MiB (default 256; --quick: 16)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed iterations at 1 MiB (default 30; --quick: 10); larger sizes get "
        "proportionally fewer, at least 5 (--quick: 3)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a short run: up to 16 MiB, few iterations and steps"
    )
    p.add_argument("--hosts", type=int, default=2, help="namespace hosts (default 2)")
    p.add_argument("--ranks-per-host", type=int, default=2, help="ranks on each host (default 2)")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch MLP step")
    p.add_argument(
        "--torch-only", action="store_true", help="only the torch MLP step (dense and top-k 1%%)"
    )
    # What the parent hands its jobs (not for users).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--min-iters", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--small-iters", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--interface", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    quick = a.quick
    if quick and a.max_mb == 256.0:
        a.max_mb = 16.0
    defaults = {
        "iters": (30, 10),
        "min_iters": (5, 3),
        "small_iters": (30, 10),
        "steps": (20, 5),
        "rounds": (4, 2),
    }
    for name, (normal, short) in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, short if quick else normal)
    a.min_iters = max(1, min(a.min_iters, a.iters))
    if a.torch_only and a.no_torch:
        p.error("--torch-only and --no-torch leave nothing to run")
    a.rates = [r.strip() for r in a.rates.split(",") if r.strip()]
    if not a.worker:
        from _hosts import LinkLimit

        try:
            a.limits = [LinkLimit(r) for r in a.rates]
        except ValueError as exc:
            p.error(str(exc))
        if not a.limits:
            p.error("--rates: give at least one rate, e.g. 1gbit")
        if not 2 <= a.hosts <= 26:
            p.error("--hosts: between 2 and 26")
        if a.ranks_per_host < 1:
            p.error("--ranks-per-host: at least 1")
        if a.max_mb < 1:
            p.error("--max-mb: at least 1 (the sizes start at 1 MiB)")
    return a


def iterations(nbytes: int, args) -> int:
    """args.iters at 1 MiB, then inversely proportional to the size, at least args.min_iters."""
    return max(args.min_iters, min(args.iters, int(args.iters * MiB // nbytes)))


def fmt_size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def fmt_mib(nbytes: Optional[float]) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:.2f}"


# ============================================================================================
# In the jobs (--worker): every rank runs this.
# ============================================================================================


def tcp_bytes_sent_off_host(pids: set) -> Optional[dict]:
    """{pid: bytes_sent} over the established TCP sockets of each pid in `pids` whose peer is
    another address than the socket's own (so on another host: ranks of one host reach each
    other at the host's own address); None where ss cannot tell."""
    try:
        out = subprocess.run(
            ["ss", "-Htinp", "state", "established"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    sent = {pid: 0 for pid in pids}
    owner = None
    details = counters = 0
    for line in out.stdout.splitlines():
        if line[:1].isspace():  # the details of the socket on the line before
            details += 1
            match = re.search(r"\bbytes_sent:(\d+)", line)
            counters += match is not None
            if owner is not None and match:
                sent[owner] += int(match.group(1))
            owner = None
            continue
        owner = None
        addresses = [t for t in line.split() if re.fullmatch(r"\S+:\d+", t)][:2]
        users = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        mine = [p for p in users if p in pids]
        if len(addresses) == 2 and mine:
            local, peer = (
                a.rsplit(":", 1)[0].strip("[]").replace("::ffff:", "") for a in addresses
            )
            if local != peer:
                owner = mine[0]
    # A kernel without tcpi_bytes_sent (before 4.19) prints none: say so rather than 0.
    return None if details and not counters else sent


class LinkMeter:
    """Reads, at a snapshot (collective), every host's link counters and every rank's TCP bytes
    sent off its host; each host's local rank 0 reads for its host."""

    def __init__(self, comm, interface: str, local_rank: int):
        self.comm = comm
        self.reader = local_rank == 0
        self.statistics = Path("/sys/class/net") / interface / "statistics"
        self.pids = comm.allgather(os.getpid())
        hosts = comm.allgather(socket.gethostname())
        self.host_pids = {p for p, h in zip(self.pids, hosts) if h == socket.gethostname()}

    def snapshot(self) -> Optional[dict]:
        """On rank 0: {"tx": [bytes per host], "sent": [bytes per rank] or None}; else None."""
        self.comm.Barrier()
        mine = None
        if self.reader:
            mine = {
                "tx": int((self.statistics / "tx_bytes").read_text()),
                "sent": tcp_bytes_sent_off_host(self.host_pids),
            }
        got = self.comm.gather(mine, root=0)
        if self.comm.rank != 0:
            return None
        readings = [g for g in got if g is not None]
        sent = {}
        for g in readings:
            if g["sent"] is None:
                sent = None
                break
            sent.update(g["sent"])
        return {
            "tx": [g["tx"] for g in readings],
            "sent": None if sent is None else [sent.get(p, 0) for p in self.pids],
        }


class Tally:
    """A method's timed iterations and the bytes of the blocks that held them."""

    def __init__(self):
        self.times, self.iters = [], 0
        self.tx: list = []  # per host
        self.sent: Optional[list] = []  # per rank; None where ss could not tell

    def add(self, times, before: Optional[dict], after: Optional[dict]) -> None:
        self.times.extend(float(t) for t in times)
        self.iters += len(times)
        if before is None:  # not rank 0
            return
        deltas = [a - b for a, b in zip(after["tx"], before["tx"])]
        self.tx = deltas if not self.tx else [t + d for t, d in zip(self.tx, deltas)]
        if self.sent is not None and before["sent"] is not None and after["sent"] is not None:
            deltas = [a - b for a, b in zip(after["sent"], before["sent"])]
            self.sent = deltas if not self.sent else [s + d for s, d in zip(self.sent, deltas)]
        else:
            self.sent = None

    def summary(self) -> dict:
        per_rank = None if not self.sent else [s / self.iters for s in self.sent]
        return {
            "median": float(np.median(self.times)),
            "iters": self.iters,
            "link": sum(self.tx) / self.iters,
            "busiest_host": max(self.tx, default=0) / self.iters,
            "per_rank": per_rank,
        }


def measured(bench: Bench, meter: LinkMeter, fns: list, iters: int, warmup: int) -> list:
    """Bench.interleaved with the link read around every block: one Tally summary per fn."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    rounds = min(iters, 10)
    block_sizes = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    tallies = [Tally() for _ in fns]
    order = list(range(len(fns)))
    for b in block_sizes:
        for k in order:
            before = meter.snapshot()
            times = bench.run_block(fns[k], b)
            tallies[k].add(times, before, meter.snapshot())
        order.reverse()
    return [t.summary() for t in tallies]


def check_close(what: str, got, want: float) -> None:
    if not np.allclose(got, want):
        raise CheckFailed(f"{what}: wrong result (got {np.ravel(got)[:4]} ..., want {want})")


def worker(args) -> int:
    from mpi4py import MPI

    import scaleout as so

    so.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.rank, comm.size
    meter = LinkMeter(comm, args.interface, so.local_rank())
    bench = Bench(comm)
    want = n * (n + 1) / 2.0  # rank r gives r + 1
    result = {
        "algorithm": so.config()["allreduce_algorithm"],
        "ranks": n,
        "others_algorithms": {c: so.config()[f"{c}_algorithm"] for c in ("allgather", "alltoall")},
        "affinity": comm.allgather(sorted(os.sched_getaffinity(0))),
        "sizes": [],
    }

    # The timing's own traffic: an iteration with nothing in it.
    result["empty"] = measured(bench, meter, [lambda: None], 20, 0)[0]

    if not args.torch_only:
        for nbytes in [s for s in SIZES if s <= args.max_mb * MiB]:
            result["sizes"].append(size_case(args, comm, bench, meter, nbytes, want))
        result["small"] = small_case(args, comm, bench, meter, want)
        result["halves"] = [
            half_case(args, comm, bench, meter, nbytes)
            for nbytes in (4 * MiB, 16 * MiB)
            if nbytes <= args.max_mb * MiB
        ]
        result["others"] = [
            case(args, comm, bench, meter, nbytes)
            for case in (allgather_case, alltoall_case)
            for nbytes in (MiB, 8 * MiB)
            if nbytes <= args.max_mb * MiB
        ]
    if not args.no_torch:
        result["torch"] = torch_case(args, meter)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    comm.Barrier()
    comm.Free()
    so.shutdown()
    return 0


def size_case(args, comm, bench: Bench, meter: LinkMeter, nbytes: int, want: float) -> dict:
    """One size: mpi4py's in-place Allreduce beside scaleout's allreduce_, interleaved."""
    from mpi4py import MPI

    import scaleout as so

    name = f"bench.multihost.{nbytes}"
    buf = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
    so.allreduce_(buf, op=so.Sum, name=name)
    check_close(f"scaleout allreduce_ {fmt_size(nbytes)}", buf, want)
    z = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
    comm.Allreduce(MPI.IN_PLACE, z, op=MPI.SUM)
    check_close(f"mpi4py Allreduce IN_PLACE {fmt_size(nbytes)}", z, want)
    buf[...] = 0.0  # zeros stay zeros under Sum
    z[...] = 0.0
    mpi_r, so_r = measured(
        bench,
        meter,
        [
            lambda: comm.Allreduce(MPI.IN_PLACE, z, op=MPI.SUM),
            lambda: so.allreduce_(buf, op=so.Sum, name=name),
        ],
        iterations(nbytes, args),
        warmup=1 if nbytes >= 16 * MiB else 3,
    )
    return {"bytes": nbytes, "mpi": mpi_r, "so": so_r}


def small_case(args, comm, bench: Bench, meter: LinkMeter, want: float) -> dict:
    """200 x 16 KiB: scaleout async back to back, then synchronize; mpi4py packed and one by
    one."""
    from mpi4py import MPI

    import scaleout as so

    rank = comm.rank
    names = [f"bench.multihost.small.{i}" for i in range(SMALL_COUNT)]
    tensors = [np.full(SMALL_FLOATS, rank + 1, dtype=np.float32) for _ in range(SMALL_COUNT)]
    packed = np.full(SMALL_COUNT * SMALL_FLOATS, rank + 1, dtype=np.float32)
    each = [np.full(SMALL_FLOATS, rank + 1, dtype=np.float32) for _ in range(SMALL_COUNT)]

    def so_async():
        handles = [so.allreduce_async_(t, op=so.Sum, name=nm) for t, nm in zip(tensors, names)]
        for h in handles:
            so.synchronize(h)

    def mpi_packed():
        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.SUM)

    def mpi_each():
        for a in each:
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    for fn, arrays, what in (
        (so_async, tensors, "scaleout 200 x 16 KiB"),
        (mpi_packed, [packed], "mpi4py packed 3.2 MB"),
        (mpi_each, each, "mpi4py 200 x 16 KiB"),
    ):
        fn()
        for a in arrays:
            check_close(what, a, want)
            a[...] = 0.0
    got = measured(bench, meter, [so_async, mpi_packed, mpi_each], args.small_iters, warmup=3)
    return dict(zip(["so", "mpi_packed", "mpi_each"], got))


def half_case(args, comm, bench: Bench, meter: LinkMeter, nbytes: int) -> dict:
    """N = nbytes / 4 elements: scaleout's allreduce_ (Average) in float32 beside float16 (Note
    [Halves on the wire]: half the bytes should cross)."""
    import scaleout as so

    count = nbytes // 4
    f32 = np.ones(count, np.float32)
    f16 = np.ones(count, np.float16)
    fns = [
        lambda: so.allreduce_(f32, op=so.Average, name=f"bench.multihost.f32.{nbytes}"),
        lambda: so.allreduce_(f16, op=so.Average, name=f"bench.multihost.f16.{nbytes}"),
    ]
    for fn in fns:
        fn()
    check_close(f"float16 Average {fmt_size(nbytes)}", f16.astype(np.float32), 1.0)
    f32_r, f16_r = measured(bench, meter, fns, iterations(nbytes, args), warmup=1)
    return {"bytes": nbytes, "float32": f32_r, "float16": f16_r}


def allgather_case(args, comm, bench: Bench, meter: LinkMeter, nbytes: int) -> dict:
    """Every rank gives `nbytes` (float32): mpi4py's Allgather beside scaleout's allgather
    (hierarchical in the HIER=1 job: SCALEOUT_HIERARCHICAL_ALLGATHER follows the mode)."""
    import scaleout as so

    n, count = comm.size, nbytes // 4
    mine = np.full(count, comm.rank, dtype=np.float32)
    gathered = np.empty(n * count, dtype=np.float32)
    return compared_case(
        "allgather",
        nbytes,
        bench,
        meter,
        iterations(n * nbytes, args),
        lambda: so.allgather(mine, name=f"bench.multihost.allgather.{nbytes}"),
        lambda: comm.Allgather(mine, gathered),
        gathered,
        np.repeat(np.arange(n, dtype=np.float32), count),
    )


def alltoall_case(args, comm, bench: Bench, meter: LinkMeter, nbytes: int) -> dict:
    """Every rank sends nbytes / size (float32) to each rank: mpi4py's Alltoall beside
    scaleout's alltoall (the same algorithm in both jobs: Note [Staged alltoall])."""
    import scaleout as so

    n, count = comm.size, nbytes // 4 // comm.size
    mine = np.repeat(np.arange(n, dtype=np.float32) + 100 * comm.rank, count)
    received = np.empty(n * count, dtype=np.float32)
    return compared_case(
        "alltoall",
        nbytes,
        bench,
        meter,
        iterations(nbytes, args),
        lambda: so.alltoall(mine, name=f"bench.multihost.alltoall.{nbytes}"),
        lambda: comm.Alltoall(mine, received),
        received,
        np.repeat(100 * np.arange(n, dtype=np.float32) + comm.rank, count),
    )


def compared_case(
    what: str,
    nbytes: int,
    bench: Bench,
    meter: LinkMeter,
    iters: int,
    so_call,
    mpi_call,
    mpi_out: np.ndarray,
    want: np.ndarray,
) -> dict:
    """scaleout's so_call() (returning its result) beside mpi4py's mpi_call() (filling
    mpi_out), each checked against `want` once, then timed interleaved."""
    if not np.array_equal(so_call(), want):
        raise CheckFailed(f"scaleout {what} {fmt_size(nbytes)}: wrong result")
    mpi_call()
    if not np.array_equal(mpi_out, want):
        raise CheckFailed(f"mpi4py {what} {fmt_size(nbytes)}: wrong result")
    mpi_r, so_r = measured(bench, meter, [mpi_call, so_call], iters, warmup=2)
    return {"what": what, "bytes": nbytes, "mpi": mpi_r, "so": so_r}


def torch_case(args, meter: LinkMeter) -> dict:
    """benchmarks/torch_step.py's MLP step, no communication and scaleout's
    DistributedOptimizer, in alternating rounds; bytes read around every round's steps."""
    try:
        import torch
        import torch_step
    except ImportError as exc:
        return {"error": f"torch is not available ({exc})"}
    torch.set_num_threads(1)
    label, model_cls, batch = torch_step.MODELS["mlp"]
    modes = ["no comm", "scaleout", torch_step.TOPK]
    steppers, grad_bytes = torch_step.make_steppers(model_cls, batch, modes=modes)
    for mode in modes:
        for _ in range(3):
            steppers[mode]()
    tallies = {mode: Tally() for mode in modes}
    for round_index in range(args.rounds):
        for mode in modes if round_index % 2 == 0 else modes[::-1]:
            before = meter.snapshot()
            times = torch_step.timed_steps(steppers[mode], args.steps)
            tallies[mode].add(times, before, meter.snapshot())
    return {
        "model": label,
        "batch": batch,
        "grad_bytes": grad_bytes,
        **{mode: tallies[mode].summary() for mode in modes},
    }


# ============================================================================================
# The parent: makes the hosts, runs the jobs, prints the tables.
# ============================================================================================


def header(args, hosts_count: int) -> list:
    import importlib.metadata as md

    import mpi4py

    mpi4py.rc.initialize = False  # the library's version only: no MPI in this process
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    def version(package: str) -> str:
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return "absent"

    cpu = cpu_model()
    mpi_lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    knobs = " ".join(
        f"{k}={v}"
        for k, v in sorted(os.environ.items())
        if k.startswith(("SCALEOUT_", "MPIR_CVAR_", "UCX_"))
    )
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    links = (
        "one veth pair"
        if hosts_count == 2
        else f"{hosts_count} veth pairs to a bridge in a switch namespace"
    )
    rates = ", ".join(
        f"{lim.rate} (burst {lim.burst_bytes // KiB} KiB, latency {lim.latency})"
        for lim in args.limits
    )
    return [
        f"# scaleout multi-host benchmark  {now}  host={socket.gethostname()}",
        f"# cpu={cpu}  nproc={os.cpu_count()}  kernel={platform.release()}  "
        f"scaleout={version('scaleout')}  mpi4py={version('mpi4py')}  numpy={version('numpy')}  "
        f"torch={version('torch')}  python={platform.python_version()}",
        f"# MPI library: {mpi_lib}",
        f"# scaleout core: {core_info()}",
        f"# hosts: {hosts_count} network-namespace hosts on this machine x {args.ranks_per_host} "
        f"ranks, {links}; scaleoutrun from hostA over ssh, --mpi-yield on "
        f"({hosts_count * args.ranks_per_host} ranks share {os.cpu_count()} cores)",
        f"# links: tc tbf on both ends of each link; rates: {rates}; UCX_TLS=self,tcp",
        "# env: " + (knobs or "no SCALEOUT_*, MPIR_CVAR_* or UCX_* set"),
        "# float32 Sum; time = max over ranks per iteration, median over iterations; barrier "
        "before each iteration; methods of a job interleaved in blocks",
        "# link = bytes on the links per allreduce (sum over hosts of the interface's tx_bytes, "
        "frames); per rank = TCP payload bytes each rank sent to other hosts (ss bytes_sent), "
        "shown as max (min) over ranks; both measured around the timed blocks, divided by the "
        "iterations",
    ]


def run_job(hosts, args, mode: str) -> tuple[Optional[dict], str]:
    """One scaleoutrun job across the hosts with SCALEOUT_HIERARCHICAL_ALLREDUCE=mode: rank 0's
    RESULT, and a line about the job."""
    from _hosts import INTERFACE, NETWORK_ENV, job_command

    worker_args = (
        [
            "--worker",
            "--interface",
            INTERFACE,
            "--max-mb",
            str(args.max_mb),
            "--iters",
            str(args.iters),
            "--min-iters",
            str(args.min_iters),
            "--small-iters",
            str(args.small_iters),
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
        ]
        + (["--no-torch"] if args.no_torch else [])
        + (["--torch-only"] if args.torch_only else [])
    )
    command = job_command(
        {h: args.ranks_per_host for h in hosts.names}, Path(__file__).resolve(), *worker_args
    )
    env = {
        **NETWORK_ENV,
        "SCALEOUT_HIERARCHICAL_ALLREDUCE": mode,
        "SCALEOUT_HIERARCHICAL_ALLGATHER": mode,
    }
    drops = hosts.qdisc_drops()
    started = perf()
    try:
        done = hosts.run_on(hosts.names[0], command, env=env, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {JOB_TIMEOUT} s"
    took = perf() - started
    found = None
    for line in done.stdout.splitlines():
        match = re.match(r"^\[0\] RESULT (.*)$", line)
        if match:
            found = json.loads(match.group(1))
    if done.returncode != 0 or found is None:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        return None, f"failed (exit {done.returncode}) after {took:.0f} s:\n{tail}"
    dropped = hosts.qdisc_drops() - drops
    affinity = " ".join(f"r{r}:{cpu_list(c)}" for r, c in enumerate(found["affinity"]))
    return found, (
        f"{took:.0f} s; scaleout's algorithm: {found['algorithm']}; "
        f"packets tbf dropped: {dropped}; cpu affinity {affinity}"
    )


def cpu_list(cores: list) -> str:
    return ",".join(str(c) for c in cores) if len(cores) < 4 else f"{cores[0]}-{cores[-1]}"


def per_rank_cell(summary: dict) -> str:
    sent = summary.get("per_rank")
    if not sent:
        return "-"
    return f"{fmt_mib(max(sent))} ({fmt_mib(min(sent))})"


def sizes_table(jobs: dict, out) -> None:
    rows = []
    sizes = next(iter(j for j in jobs.values() if j), {"sizes": []})["sizes"]
    for i, entry in enumerate(sizes):
        nbytes = entry["bytes"]
        for mode, job in jobs.items():
            if not job:
                continue
            got = job["sizes"][i]
            for key, label in (("mpi", "MPI flat (mpi4py)"), ("so", f"scaleout {MODES[mode]}")):
                s = got[key]
                speedup = got["mpi"]["median"] / s["median"]
                rows.append(
                    [
                        fmt_size(nbytes),
                        mode,
                        label,
                        s["iters"],
                        fmt_time(s["median"]),
                        f"{speedup:.2f}" if key == "so" else "1",
                        fmt_mib(s["link"]),
                        f"{s['link'] / nbytes:.2f}",
                        per_rank_cell(s),
                        "-" if not s["per_rank"] else f"{max(s['per_rank']) / nbytes:.2f}",
                    ]
                )
    hdr = [
        "size",
        "HIER",
        "method",
        "iters",
        "time",
        "MPI/this",
        "link MiB",
        "link/size",
        "per rank MiB max (min)",
        "max/size",
    ]
    out(
        "## allreduce_ / Allreduce(IN_PLACE), float32 Sum; HIER = the job's "
        "SCALEOUT_HIERARCHICAL_ALLREDUCE; MPI/this = speed-up over flat MPI in the same job"
    )
    for line in table(rows, hdr, ["l", "r", "l"] + ["r"] * 7):
        out(line)


def small_table(jobs: dict, out) -> None:
    rows = []
    labels = {
        "so": "scaleout: 200 x allreduce_async_, then synchronize",
        "mpi_packed": "mpi4py: 1 x Allreduce of 3.2 MB, pre-packed",
        "mpi_each": "mpi4py: 200 x Allreduce of 16 KiB, one after another",
    }
    for mode, job in jobs.items():
        if not job:
            continue
        small = job["small"]
        for key, label in labels.items():
            s = small[key]
            rows.append(
                [
                    mode,
                    label,
                    s["iters"],
                    fmt_time(s["median"]),
                    f"{small['mpi_packed']['median'] / s['median']:.2f}",
                    fmt_mib(s["link"]),
                    per_rank_cell(s),
                ]
            )
    out(
        f"## {SMALL_COUNT} x 16 KiB float32 (3.2 MB in all), Sum, end to end; bytes per "
        "iteration; packed/this = speed-up over the pre-packed mpi4py Allreduce in the same job"
    )
    for line in table(
        rows,
        ["HIER", "case", "iters", "time", "packed/this", "link MiB", "per rank MiB max (min)"],
        ["r", "l", "r", "r", "r", "r", "r"],
    ):
        out(line)


def halves_table(jobs: dict, out) -> None:
    rows = []
    for mode, job in jobs.items():
        for got in (job or {}).get("halves", []):
            for key in ("float32", "float16"):
                s = got[key]
                rows.append(
                    [
                        fmt_size(got["bytes"]),
                        mode,
                        key,
                        s["iters"],
                        fmt_time(s["median"]),
                        f"{s['median'] / got['float32']['median']:.2f}",
                        fmt_mib(s["link"]),
                        per_rank_cell(s),
                    ]
                )
    if not rows:
        return
    out(
        "## scaleout allreduce_ of N elements (size = N float32s), Average, float32 and float16; "
        "this/f32 = time over float32's in the same job; bytes per allreduce"
    )
    for line in table(
        rows,
        [
            "size",
            "HIER",
            "dtype",
            "iters",
            "time",
            "this/f32",
            "link MiB",
            "per rank MiB max (min)",
        ],
        ["l", "r", "l", "r", "r", "r", "r", "r"],
    ):
        out(line)


def algorithm_label(algorithm: str) -> str:
    """config()'s <collective>_algorithm, in a few words."""
    if algorithm.startswith("hierarchical"):
        return "hierarchical"
    if algorithm.startswith("shared memory between"):
        return "(shared memory inside hosts, mpi across)"
    return f"flat ({algorithm})"


def others_table(jobs: dict, out) -> None:
    rows = []
    for mode, job in jobs.items():
        for got in (job or {}).get("others", []):
            nbytes = got["bytes"]
            for key in ("mpi", "so"):
                s = got[key]
                label = (
                    f"mpi4py {got['what'].capitalize()}"
                    if key == "mpi"
                    else "scaleout " + algorithm_label(job["others_algorithms"][got["what"]])
                )
                rows.append(
                    [
                        got["what"],
                        fmt_size(nbytes),
                        mode,
                        label,
                        s["iters"],
                        fmt_time(s["median"]),
                        f"{got['mpi']['median'] / s['median']:.2f}" if key == "so" else "1",
                        fmt_mib(s["link"]),
                        per_rank_cell(s),
                    ]
                )
    if not rows:
        return
    out(
        "## allgather (size: each rank's block) and alltoall (size: what each rank sends in "
        "all), float32; HIER = the job's SCALEOUT_HIERARCHICAL_ALLREDUCE and _ALLGATHER; "
        "MPI/this = speed-up over mpi4py in the same job; bytes per iteration"
    )
    for line in table(
        rows,
        [
            "collective",
            "size",
            "HIER",
            "method",
            "iters",
            "time",
            "MPI/this",
            "link MiB",
            "per rank MiB max (min)",
        ],
        ["l", "r", "r", "l", "r", "r", "r", "r", "r"],
    ):
        out(line)


def torch_table(jobs: dict, out) -> None:
    rows, about = [], None
    for mode, job in jobs.items():
        t = (job or {}).get("torch")
        if not t:
            continue
        if "error" in t:
            out(f"## torch MLP step: {t['error']}")
            return
        about = t
        base = t["no comm"]["median"]
        dense = t["scaleout"]["median"] - base
        for key in [k for k in t if isinstance(t[k], dict)]:
            s = t[key]
            label = {"no comm": "no communication", "scaleout": f"scaleout {MODES[mode]}"}.get(
                key, key
            )
            comm = s["median"] - base
            rows.append(
                [
                    mode,
                    label,
                    s["iters"],
                    fmt_time(s["median"]),
                    "-" if key == "no comm" else "+" + fmt_time(comm),
                    "-" if key in ("no comm", "scaleout") or comm <= 0 else f"{dense / comm:.2f}x",
                    fmt_mib(s["link"]),
                    per_rank_cell(s),
                ]
            )
    if not rows:
        return
    out(
        f"## torch_step.py's {about['model']}, batch {about['batch']} per rank, "
        f"{about['grad_bytes'] / MiB:.1f} MiB of gradients, 1 thread per rank; step = the "
        "slowest rank's; bytes per step; modes alternated in rounds"
    )
    for line in table(
        rows,
        [
            "HIER",
            "mode",
            "steps",
            "step",
            "communication",
            "dense comm / this",
            "link MiB",
            "per rank MiB max (min)",
        ],
        ["r", "l", "r", "r", "r", "r", "r", "r"],
    ):
        out(line)


def goal_lines(jobs: dict, local_size: int, limit, out) -> None:
    """The hierarchical goal, from 16 MiB up: per-rank bytes at most 1/local_size of flat's,
    and at least 1.6x flat MPI's speed; reported, not asserted. Beside it, the link's floor:
    the busiest host's measured bytes at the link's rate, a time no algorithm that sends those
    bytes can beat."""
    flat, hier = jobs.get("0"), jobs.get("1")
    if not (flat and hier):
        return
    for f, h in zip(flat["sizes"], hier["sizes"]):
        if f["bytes"] < 16 * MiB:
            continue
        speedup = h["mpi"]["median"] / h["so"]["median"]

        def share(of: dict) -> str:
            if not (h["so"]["per_rank"] and of["per_rank"]):
                return "-"
            return f"{max(h['so']['per_rank']) / max(of['per_rank']):.2f}"

        floor = h["so"]["busiest_host"] * 8 / limit.bits_per_second
        out(
            f"# goal at {fmt_size(f['bytes'])}: hierarchical is {speedup:.2f}x flat MPI's speed "
            f"(goal >= 1.6); its largest per-rank bytes are {share(h['mpi'])} of flat MPI's and "
            f"{share(f['so'])} of scaleout flat's (goal <= 1/{local_size} = "
            f"{1 / local_size:.2f}); the link's floor {fmt_time(floor)} (busiest host's bytes / "
            f"{limit.rate}): hierarchical takes {h['so']['median'] / floor:.2f}x it, flat MPI "
            f"{h['mpi']['median'] / floor:.2f}x (HIER=1 job) and {f['mpi']['median'] / floor:.2f}x "
            "(HIER=0 job)"
        )


def empty_line(jobs: dict) -> str:
    parts = [
        f"HIER={mode}: {fmt_time(job['empty']['median'])}, link "
        f"{job['empty']['link']:.0f} B, per rank max "
        + ("-" if not job["empty"]["per_rank"] else f"{max(job['empty']['per_rank']):.0f} B")
        for mode, job in jobs.items()
        if job
    ]
    return "# an empty iteration (the barrier and the timing's own traffic): " + "; ".join(parts)


def main(args) -> int:
    from _hosts import HostsUnavailable, made_hosts, missing_prerequisite

    missing = missing_prerequisite(rate_limited=True)
    if missing:
        print(f"multihost benchmark skipped: {missing}")
        return 0
    out = print
    started = perf()
    for line in header(args, args.hosts):
        out(line)
    with tempfile.TemporaryDirectory(prefix="scaleout-multihost-") as workdir:
        try:
            with made_hosts(Path(workdir), args.hosts, args.limits[0]) as hosts:
                for limit in args.limits:
                    hosts.limit_links(limit)
                    jobs, notes = {}, []
                    for mode in MODES:
                        print(
                            f"# running {limit.rate}, SCALEOUT_HIERARCHICAL_ALLREDUCE={mode} ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        jobs[mode], note = run_job(hosts, args, mode)
                        notes.append(f"# job HIER={mode}: {note}")
                    out()
                    out(
                        f"# ===== links at {limit.rate}: {args.hosts} hosts x "
                        f"{args.ranks_per_host} ranks ====="
                    )
                    for note in notes:
                        out(note)
                    if not any(jobs.values()):
                        continue
                    out(empty_line(jobs))
                    if not args.torch_only:
                        out()
                        sizes_table(jobs, out)
                        goal_lines(jobs, args.ranks_per_host, limit, out)
                        out()
                        small_table(jobs, out)
                        out()
                        halves_table(jobs, out)
                        out()
                        others_table(jobs, out)
                    if not args.no_torch:
                        out()
                        torch_table(jobs, out)
        except HostsUnavailable as exc:
            print(f"multihost benchmark skipped: {exc}")
            return 0
    out()
    out(f"# total benchmark time {perf() - started:.0f} s")
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    if not arguments.worker:
        sys.exit(main(arguments))
    try:
        sys.exit(worker(arguments))
    except CheckFailed as e:
        from mpi4py import MPI

        print(f"rank {MPI.COMM_WORLD.rank}: {e}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
