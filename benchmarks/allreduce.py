#!/usr/bin/env python
"""Allreduce benchmark: scaleout beside mpi4py on the same MPI, in the same run.

    mpiexec -n 2 python benchmarks/allreduce.py
    scaleoutrun -np 2 python benchmarks/allreduce.py [--max-mb 16] [--iters N] [--quick]
    scaleoutrun -np 2 python benchmarks/allreduce.py --ep-servers 1,2,3 [--ep-only]

Table 1: float32 allreduce (Sum) from 4 KiB to 256 MiB. scaleout is timed through
`so.allreduce_(buf, op=so.Sum, name=...)` (in place into a preallocated array, the same name
every iteration so the response cache is used; `--no-inplace` times `so.allreduce`, which
returns a new array); mpi4py through `comm.Allreduce(x, y, op=MPI.SUM)` on a duplicate of
COMM_WORLD and, in the "IP" column, `comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)`: scaleout's
core reduces a single tensor with MPI_Allreduce(MPI_IN_PLACE, ...), so IP is the like-for-like
figure, while MPICH's out-of-place call pays an extra send-to-receive buffer copy.
One extra row times scaleout's Average op at one large size.

Table 1b (unless --no-halves): N elements in float32, float16 and bfloat16 (Average, in place)
from 64 KiB of float32 up: half precision travels and is staged as 2-byte elements (Note
[Halves on the wire]), so it should take about half the time.

Table 1c (unless --no-allgather): allgather of a float32 block per rank, 64 KiB to 64 MiB,
scaleout's so.allgather (a new array each call) beside mpi4py's Allgather.

Table 2: 200 float32 tensors of 16 KiB submitted with `so.allreduce_async_` back to back
(distinct names, the same every iteration) and then synchronized, timed end to end, beside one
pre-packed 3.2 MB mpi4py Allreduce and 200 back-to-back 16 KiB mpi4py Allreduces.

Table 2b: the same 200 x 16 KiB through each front end: numpy (`so.allreduce_async_`),
torch (`scaleout.torch.allreduce_async_` on tensors) and TensorFlow (eager
`scaleout.tensorflow.grouped_allreduce`, which submits all 200 in one call), end to end, and the
time to submit one collective (the submission loop alone, divided by 200, median over ranks'
iterations).

--contended: the same tables with a CPU hog (a busy loop) on every core of each machine,
started by its local rank 0 before the first table and stopped after the last, so that
scaleout's and MPICH's waiting are compared when no core is idle. With --contended (or
--wait-cost) a last table gives the cost of waiting: the CPU seconds each rank's process uses
while it waits 5 s in an allreduce for a late rank (the last one), beside mpi4py's Allreduce.
--second-job (alone or with --contended): a second scaleout job on the first rank's machine, as
many ranks as this job has there, running 1 MiB allreduces back to back for the whole run.

Table 3 (with --ep-servers K1,K2,...): scaleout's allreduce_ from --ep-min-mb up, with each
number K of endpoint servers. The core reads SCALEOUT_EP_SERVERS at init, so the script shuts
the core down and initializes it again for each K; the Ks take turns in two rounds (1 2 3,
3 2 1). A large allreduce is split across the K servers, each reducing its part on its own
communicator (below 256 KiB per server it is not split).

Method: warm-up first; the libraries are run in alternating blocks (A B B A A B ...) so
that machine noise hits both alike; a barrier before every timed iteration; an iteration's time
is the maximum over ranks (MPI MAX allreduce of the per-rank times); tables report medians.
Bus bandwidth = bytes * 2(n-1)/n / time (GB/s = 1e9 B/s). Rank 0 prints; other ranks are silent.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time

import numpy as np
from _common import Bench, CheckFailed, core_info, cpu_model, cpuset, fmt_time, table
from mpi4py import MPI

import scaleout as so

KiB = 1024
MiB = 1024 * KiB
SIZES = [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
SMALL_COUNT = 200
SMALL_FLOATS = 4096  # 16 KiB of float32

perf = time.perf_counter


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--max-mb",
        type=float,
        default=256.0,
        help="largest message in MiB (default 256; --quick: 16)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed iterations at the small sizes (default 1000; --quick: 100); "
        "sizes above 1 MiB get proportionally fewer, at least --min-iters",
    )
    p.add_argument(
        "--min-iters",
        type=int,
        default=None,
        help="fewest timed iterations at any size (default 10; --quick: 3)",
    )
    p.add_argument(
        "--small-iters",
        type=int,
        default=None,
        help="timed iterations of the 200 x 16 KiB case (default 60; --quick: 10)",
    )
    p.add_argument(
        "--average-mb",
        type=float,
        default=64.0,
        help="size in MiB of the extra Average-op row (default 64, capped by --max-mb; 0 skips it)",
    )
    p.add_argument(
        "--no-inplace",
        action="store_true",
        help="time so.allreduce (new result array) instead of so.allreduce_",
    )
    p.add_argument(
        "--no-mpi-in-place",
        action="store_true",
        help="leave out the comm.Allreduce(MPI.IN_PLACE, x) column (scaleout's core "
        "calls MPI_Allreduce in place, so that column is the like-for-like one)",
    )
    p.add_argument("--no-small", action="store_true", help="skip the 200 x 16 KiB tables")
    p.add_argument(
        "--no-halves", action="store_true", help="skip the half-precision table (table 1b)"
    )
    p.add_argument(
        "--no-allgather", action="store_true", help="skip the allgather table (table 1c)"
    )
    p.add_argument(
        "--no-frameworks",
        action="store_true",
        help="leave torch and TensorFlow out of the front-end table (table 2b)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a short run: max 16 MiB, 10x fewer iterations"
    )
    p.add_argument(
        "--spread", action="store_true", help="also print p10 and p90 of each measurement"
    )
    p.add_argument(
        "--ep-servers",
        type=ep_server_list,
        default=None,
        metavar="LIST",
        help="also time scaleout with each number of endpoint servers in LIST, "
        "e.g. 1,2,3, at the large sizes (table 3; default: not run)",
    )
    p.add_argument(
        "--ep-min-mb",
        type=float,
        default=1.0,
        help="smallest size in MiB of the endpoint-server table (default 1)",
    )
    p.add_argument(
        "--contended",
        action="store_true",
        help="run every table with a CPU hog on every core (see above)",
    )
    p.add_argument(
        "--second-job",
        action="store_true",
        help="run every table beside a second scaleout job on the same machine (see above)",
    )
    p.add_argument(
        "--wait-cost",
        action="store_true",
        help="time the CPU a rank spends waiting 5 s for a late peer (on with --contended)",
    )
    p.add_argument(
        "--ep-only",
        action="store_true",
        help="run only the endpoint-server table (needs --ep-servers)",
    )
    a = p.parse_args()
    if a.quick:
        if a.max_mb == 256.0:
            a.max_mb = 16.0
        a.iters = 100 if a.iters is None else a.iters
        a.min_iters = 3 if a.min_iters is None else a.min_iters
        a.small_iters = 10 if a.small_iters is None else a.small_iters
    a.iters = 1000 if a.iters is None else a.iters
    a.min_iters = 10 if a.min_iters is None else a.min_iters
    a.small_iters = 60 if a.small_iters is None else a.small_iters
    a.min_iters = max(1, min(a.min_iters, a.iters))
    if a.ep_only and not a.ep_servers:
        p.error("--ep-only needs --ep-servers LIST")
    return a


def ep_server_list(text: str) -> list:
    """'1,2,3' -> [1, 2, 3] (each at least 1, no repeats)."""
    try:
        ks = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers like 1,2,3") from None
    if not ks or min(ks) < 1 or len(set(ks)) != len(ks):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct numbers of servers, each >= 1")
    return ks


def iterations(nbytes: int, args) -> int:
    """args.iters up to 1 MiB, then inversely proportional to the size (a 'data budget' of
    args.iters x 2 MiB per library), never fewer than args.min_iters."""
    return max(args.min_iters, min(args.iters, int(args.iters * 2 * MiB // nbytes)))


def fmt_size(nbytes: int) -> str:
    if nbytes >= MiB and nbytes % MiB == 0:
        return f"{nbytes // MiB} MiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:.1f} MiB"
    return f"{nbytes // KiB} KiB"


def busbw(nbytes: int, sec: float, n: int) -> str:
    if n < 2 or not sec > 0:
        return "-"
    return f"{nbytes * 2 * (n - 1) / n / sec / 1e9:.2f}"


def stats(t: np.ndarray) -> tuple:
    return float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90))


def affinity_line(comm: MPI.Comm) -> str:
    """Each rank's CPU affinity (collective), e.g. 'r0:0 r1:1', or 'all ranks: 0-1'."""
    try:
        mine = cpuset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = "?"
    sets = comm.allgather(mine)
    if len(set(sets)) == 1:
        return f"all ranks: {sets[0]}"
    shown = " ".join(f"r{r}:{c}" for r, c in enumerate(sets[:16]))
    return shown + (f" ... ({len(sets)} ranks)" if len(sets) > 16 else "")


def header(args, n: int, affinity: str) -> list:
    cpu = cpu_model()
    mpi_lib = MPI.Get_library_version().strip().splitlines()[0].strip()
    mpi_lib = " ".join(mpi_lib.split())
    knobs = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SCALEOUT_")}
    mpich_knobs = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(("MPIR_CVAR_", "MPICH_", "OMP_NUM_THREADS"))
    }
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    lines = [
        f"# scaleout allreduce benchmark  {now}  host={socket.gethostname()}",
        f"# cpu={cpu}  nproc={os.cpu_count()}  ranks={n}  scaleout={so.__version__}  "
        f"mpi4py={__import__('mpi4py').__version__}  numpy={np.__version__}  "
        f"python={sys.version.split()[0]}",
        f"# MPI library: {mpi_lib}  (thread level {thread_level_name()})",
        f"# scaleout core: {core_info()}",
        f"# cpu affinity: {affinity}",
        "# scaleout allreduce data path: "
        + (
            "shared memory (SCALEOUT_SHM=1)"
            if so.config().get("SCALEOUT_SHM") == "1"
            else "MPI (SCALEOUT_SHM=0)"
        ),
        "# env: "
        + (" ".join(f"{k}={v}" for k, v in knobs.items()) or "no SCALEOUT_* set")
        + ("  " + " ".join(f"{k}={v}" for k, v in mpich_knobs.items()) if mpich_knobs else ""),
        f"# scaleout call: so.{'allreduce' if args.no_inplace else 'allreduce_'}(x, op=so.Sum, "
        f"name=<fixed per size>)  "
        f"({'new result array' if args.no_inplace else 'in place, preallocated'}); "
        "mpi4py calls: comm.Allreduce(x, y, op=MPI.SUM) (y preallocated)"
        + (
            ""
            if args.no_mpi_in_place
            else " and comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM) (column IP)"
        )
        + " on COMM_WORLD.Dup()",
        "# float32; time = max over ranks per iteration, median over iterations; "
        "barrier before each iteration; libraries interleaved in blocks; "
        "busbw = bytes*2(n-1)/n/time in GB/s",
    ]
    return lines


def thread_level_name() -> str:
    lvl = MPI.Query_thread()
    return {
        MPI.THREAD_SINGLE: "SINGLE",
        MPI.THREAD_FUNNELED: "FUNNELED",
        MPI.THREAD_SERIALIZED: "SERIALIZED",
        MPI.THREAD_MULTIPLE: "MULTIPLE",
    }.get(lvl, lvl)


def check_close(what: str, got: np.ndarray, want: float) -> None:
    if not np.allclose(got, want):
        raise CheckFailed(f"{what}: wrong result (got {got.ravel()[:4]} ..., want {want})")


def measure(args, comm, bench, nbytes: int, op: int, warmup: int) -> dict:
    """Times scaleout (op) beside mpi4py Allreduce (Sum) out of place and, unless
    --no-mpi-in-place, in place, all interleaved; returns per-iteration times by key."""
    rank, n = comm.rank, comm.size
    count = nbytes // 4
    iters = iterations(nbytes, args)
    opname = "Average" if op == so.Average else "Sum"
    name = f"bench.allreduce.{opname}.{nbytes}"
    want = (n + 1) / 2.0 if op == so.Average else n * (n + 1) / 2.0  # rank r gives r+1
    buf = np.full(count, rank + 1, dtype=np.float32)  # scaleout's (in place unless told)
    x = np.full(count, rank + 1, dtype=np.float32)  # mpi4py send buffer
    y = np.empty_like(x)  # mpi4py receive buffer
    fns = {}

    # Correctness once per size (also the first warm-up of each). Sum in place would grow the
    # values every iteration, so such buffers are zeroed afterwards (zeros stay zeros);
    # Average keeps (n+1)/2 where it is.
    if args.no_inplace:
        check_close(
            f"scaleout allreduce {opname} {fmt_size(nbytes)}",
            so.allreduce(buf, op=op, name=name),
            want,
        )
        fns["so"] = lambda: so.allreduce(buf, op=op, name=name)
    else:
        so.allreduce_(buf, op=op, name=name)
        check_close(f"scaleout allreduce_ {opname} {fmt_size(nbytes)}", buf, want)
        if op == so.Sum:
            buf[...] = 0.0
        fns["so"] = lambda: so.allreduce_(buf, op=op, name=name)

    comm.Allreduce(x, y, op=MPI.SUM)
    check_close(f"mpi4py Allreduce {fmt_size(nbytes)}", y, n * (n + 1) / 2.0)
    fns["mpi"] = lambda: comm.Allreduce(x, y, op=MPI.SUM)

    if not args.no_mpi_in_place:
        z = np.full(count, rank + 1, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, z, op=MPI.SUM)
        check_close(f"mpi4py Allreduce IN_PLACE {fmt_size(nbytes)}", z, n * (n + 1) / 2.0)
        z[...] = 0.0
        fns["mpi_ip"] = lambda: comm.Allreduce(MPI.IN_PLACE, z, op=MPI.SUM)

    keys = list(fns)
    times = bench.interleaved([fns[k] for k in keys], iters, warmup)
    result = dict(zip(keys, times))
    result["iters"] = iters
    return result


def main() -> int:
    args = parse_args()
    world = MPI.COMM_WORLD
    comm = world.Dup()
    so.init()
    rank, n = so.rank(), so.size()
    if n != comm.size:
        raise SystemExit(f"scaleout size {n} != MPI world size {comm.size}")
    out = print if rank == 0 else (lambda *a, **k: None)
    bench = Bench(comm)
    t_start = perf()
    hogs = start_hogs(comm) if args.contended else []
    second = start_second_job(comm) if args.second_job else None
    for line in header(args, n, affinity_line(comm)):
        out(line)
    if args.contended:
        out(
            f"# contended: {comm.allreduce(len(hogs))} CPU hogs (busy loops) on this job's "
            "machines, one per core"
        )
    if second is not None:
        out(
            f"# contended: a second scaleout job ({second[2]} ranks, 1 MiB allreduces back to "
            "back) on this machine"
        )
    out()

    if not args.ep_only:
        sizes_table(args, comm, bench, n, out)
        if not args.no_halves:
            out()
            halves_table(args, comm, bench, n, out)
        if not args.no_allgather:
            out()
            allgather_table(args, comm, bench, n, out)
        if not args.no_small:
            out()
            small_table(args, comm, bench, rank, n, out)
            out()
            frontends_table(args, comm, bench, rank, n, out)
    if args.ep_servers:
        if not args.ep_only:
            out()
        ep_table(args, comm, bench, rank, n, out)

    if args.contended or args.second_job or args.wait_cost:
        out()
        wait_cost_table(comm, rank, n, out)
    stop_hogs(hogs)
    if second is not None:
        rounds = stop_second_job(second)
        out(f"# the second job ran {rounds} allreduces meanwhile")
    out()
    out(f"# total benchmark time {perf() - t_start:.1f} s")
    comm.Barrier()
    comm.Free()
    so.shutdown()
    return 0


def start_hogs(comm) -> list:
    """One busy-loop process per core of this machine, started by its local rank 0."""
    import subprocess

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hogs = []
    if local.rank == 0:
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
    local.Barrier()
    local.Free()
    time.sleep(0.5)  # let them reach their loops
    return hogs


SECOND_JOB = """
import os, sys
import numpy as np
import scaleout as so
so.init()
x = np.ones(1 << 18, np.float32)   # 1 MiB
rounds = 0
while True:
    # One decision for every rank (rank 0 looks for the stop file): none may stop alone.
    if so.broadcast(np.array([os.path.exists(sys.argv[1])]), 0, name="stop?")[0]:
        break
    for _ in range(20):
        so.allreduce_(x, op=so.Sum, name="second")
    rounds += 20
if so.rank() == 0:
    print(rounds, flush=True)
so.shutdown()
"""


def start_second_job(comm):
    """Rank 0 starts another scaleout job through this MPI's mpiexec, with as many ranks as
    this job has on rank 0's machine; returns (process, stop file, ranks) on rank 0, else None."""
    import subprocess
    import tempfile

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks = local.size
    local.Free()
    job = None
    if comm.rank == 0:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        stop = os.path.join(tempfile.mkdtemp(prefix="second-job-"), "stop")
        # Not this job's launcher settings: the second job is a job of its own.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCAL", "OMPI_"))
        }
        process = subprocess.Popen(
            [
                mpiexec if os.path.exists(mpiexec) else "mpiexec",
                "-n",
                str(ranks),
                sys.executable,
                "-c",
                SECOND_JOB,
                stop,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        job = (process, stop, ranks)
    comm.Barrier()
    time.sleep(2.0)  # its ranks start and reach their loop
    return job


def stop_second_job(job) -> str:
    process, stop, _ = job
    open(stop, "w").close()
    try:
        out, _ = process.communicate(timeout=30)
    except Exception:  # noqa: BLE001  (a benchmark must end)
        process.kill()
        out, _ = process.communicate()
    return (out or "?").strip() or "?"


def stop_hogs(hogs: list) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def wait_cost_table(comm, rank: int, n: int, out, late: float = 5.0) -> None:
    """CPU seconds a rank uses while it waits `late` seconds for the last rank, in scaleout's
    allreduce and in mpi4py's Allreduce; each rank's figure, the waiting ranks' maximum."""
    x = np.ones(1024, np.float32)

    def waited(fn) -> float:
        comm.Barrier()
        cpu = time.process_time()
        if rank == n - 1:
            time.sleep(late)
        fn()
        used = time.process_time() - cpu
        return max(comm.allgather(used if rank != n - 1 else 0.0))

    scaleout_cpu = waited(lambda: so.allreduce_(x, op=so.Sum, name="bench.wait"))
    mpi_cpu = waited(lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM))
    out(
        f"## cost of waiting {late:g} s for a late rank (CPU seconds of a waiting rank's "
        "process, the maximum over the waiting ranks)"
    )
    rows = [
        ["scaleout allreduce_", f"{scaleout_cpu:.2f}", f"{scaleout_cpu / late:.0%}"],
        ["mpi4py Allreduce", f"{mpi_cpu:.2f}", f"{mpi_cpu / late:.0%}"],
    ]
    for line in table(
        rows, ["library", "CPU s while waiting", "share of the wait"], ["l", "r", "r"]
    ):
        out(line)


def sizes_table(args, comm, bench, n, out) -> None:
    """Table 1: scaleout beside mpi4py from 4 KiB to --max-mb, and the Average row."""
    max_bytes = int(args.max_mb * MiB)
    sizes = [s for s in SIZES if s <= max_bytes]
    cases = [(s, so.Sum) for s in sizes]
    # Extra row: the Average op (a scaling pass after the sum) at one large size.
    if args.average_mb > 0 and sizes:
        want = int(min(args.average_mb, args.max_mb) * MiB)
        avg_bytes = max([s for s in sizes if s <= want], default=0)
        if avg_bytes:
            cases.append((avg_bytes, so.Average))

    ip = not args.no_mpi_in_place
    rows, spread_rows = [], []
    for nbytes, op in cases:
        r = measure(args, comm, bench, nbytes, op, warmup=2 if nbytes >= 16 * MiB else 10)
        m = {k: float(np.median(v)) for k, v in r.items() if k != "iters"}
        label = fmt_size(nbytes) + (" Average" if op == so.Average else "")
        row = [
            label,
            r["iters"],
            fmt_time(m["so"]),
            fmt_time(m["mpi"]),
            f"{m['so'] / m['mpi']:.2f}",
        ]
        if ip:
            row += [fmt_time(m["mpi_ip"]), f"{m['so'] / m['mpi_ip']:.2f}"]
        row += [busbw(nbytes, m["so"], n), busbw(nbytes, m["mpi"], n)]
        if ip:
            row += [busbw(nbytes, m["mpi_ip"], n)]
        rows.append(row)
        srow = [label]
        for k in ("so", "mpi", "mpi_ip"):
            if k in r:
                p = stats(r[k])
                srow += [fmt_time(p[1]), fmt_time(p[2])]
        spread_rows.append(srow)

    so_call = "so.allreduce" if args.no_inplace else "so.allreduce_"
    out(
        f"## allreduce, float32, op Sum; medians. scaleout = {so_call}; "
        "mpi4py = Allreduce(x, y)"
        + ("; mpi4py IP = Allreduce(IN_PLACE, x)" if ip else "")
        + "; ratio = scaleout / mpi4py"
    )
    hdr = ["size", "iters", "scaleout", "mpi4py", "ratio"]
    if ip:
        hdr += ["mpi4py IP", "ratio IP"]
    hdr += ["scaleout busbw", "mpi4py busbw"] + (["IP busbw"] if ip else [])
    for line in table(rows, hdr, ["l"] + ["r"] * (len(hdr) - 1)):
        out(line)
    out("(busbw in GB/s; the Average row times scaleout's Average against MPI's Sum)")
    counts = so.stats()["collectives"]["allreduce"]
    out(
        f"(fast lane: {counts['lane_calls']} of this rank's {counts['calls']} scaleout allreduces "
        "so far, warm-up included; Note [Fast lane])"
    )
    if args.spread:
        out()
        shdr = ["size", "scaleout p10", "scaleout p90", "mpi4py p10", "mpi4py p90"]
        if ip:
            shdr += ["IP p10", "IP p90"]
        for line in table(spread_rows, shdr, ["l"] + ["r"] * (len(shdr) - 1)):
            out(line)


def halves_table(args, comm, bench, n, out) -> None:
    """Table 1b: N elements in float32, float16 (numpy) and bfloat16 (torch), Average, in
    place, interleaved: what half precision saves (Note [Halves on the wire])."""
    try:
        import torch

        import scaleout.torch as so_torch
    except ImportError:
        torch = None
    rows = []
    for nbytes in [s for s in SIZES if 64 * KiB <= s <= args.max_mb * MiB]:
        count = nbytes // 4
        f32 = np.ones(count, np.float32)
        f16 = np.ones(count, np.float16)
        fns = [
            lambda: so.allreduce_(f32, op=so.Average, name=f"bench.half.f32.{nbytes}"),
            lambda: so.allreduce_(f16, op=so.Average, name=f"bench.half.f16.{nbytes}"),
        ]
        if torch is not None:
            bf16 = torch.ones(count, dtype=torch.bfloat16)
            fns.append(
                lambda: so_torch.allreduce_(
                    bf16, op=so_torch.Average, name=f"bench.half.bf16.{nbytes}"
                )
            )
        for fn in fns:
            fn()
        check_close(f"float16 Average {fmt_size(nbytes)}", f16.astype(np.float32), 1.0)
        if torch is not None:
            check_close(f"bfloat16 Average {fmt_size(nbytes)}", bf16.float().numpy(), 1.0)
        times = bench.interleaved(
            fns, iterations(nbytes, args), warmup=2 if nbytes >= 16 * MiB else 10
        )
        m = [float(np.median(t)) for t in times]
        row = [fmt_size(nbytes), f"{count:,}", fmt_time(m[0]), fmt_time(m[1]), f"{m[1] / m[0]:.2f}"]
        row += [fmt_time(m[2]), f"{m[2] / m[0]:.2f}"] if torch is not None else ["-", "-"]
        rows.append(row)
    out(
        "## half precision: N elements, op Average, in place; size = N float32s; ratio = this "
        "/ float32 (float16 through numpy, bfloat16 through scaleout.torch)"
    )
    hdr = ["size", "N", "float32", "float16", "ratio", "bfloat16", "ratio"]
    for line in table(rows, hdr, ["l"] + ["r"] * (len(hdr) - 1)):
        out(line)


def allgather_table(args, comm, bench, n, out) -> None:
    """Table 1c: every rank gives a float32 block; scaleout's allgather (a new array, as
    Horovod's) beside mpi4py's Allgather into a preallocated one, interleaved."""
    rows = []
    for nbytes in [s for s in SIZES if 64 * KiB <= s <= min(args.max_mb, 64) * MiB]:
        count = nbytes // 4
        mine = np.full(count, comm.rank, np.float32)
        gathered = np.empty(n * count, np.float32)
        want = np.repeat(np.arange(n, dtype=np.float32), count)
        name = f"bench.allgather.{nbytes}"
        if not np.array_equal(so.allgather(mine, name=name), want):
            raise CheckFailed(f"scaleout allgather {fmt_size(nbytes)}: wrong result")
        comm.Allgather(mine, gathered)
        if not np.array_equal(gathered, want):
            raise CheckFailed(f"mpi4py Allgather {fmt_size(nbytes)}: wrong result")
        times = bench.interleaved(
            [lambda: so.allgather(mine, name=name), lambda: comm.Allgather(mine, gathered)],
            iterations(n * nbytes, args),
            warmup=3,
        )
        m = [float(np.median(t)) for t in times]
        rows.append([fmt_size(nbytes), fmt_time(m[0]), fmt_time(m[1]), f"{m[0] / m[1]:.2f}"])
    out(
        f"## allgather, float32, size = each rank's block; scaleout = so.allgather (algorithm: "
        f"{so.config()['allgather_algorithm']}); mpi4py = Allgather into a preallocated array"
    )
    for line in table(rows, ["size", "scaleout", "mpi4py", "ratio"], ["l", "r", "r", "r"]):
        out(line)


def reinit_with_servers(k: int) -> None:
    """Shuts the core down and starts it again with k endpoint servers (read at init). The
    servers split MPI allreduces, so the shared-memory path is turned off."""
    so.shutdown()
    os.environ["SCALEOUT_EP_SERVERS"] = str(k)
    os.environ["SCALEOUT_SHM"] = "0"
    so.init()
    got = so.placement()["endpoint_servers"]
    if got != k:
        raise CheckFailed(f"asked for {k} endpoint servers, the core reports {got}")


def ep_table(args, comm, bench, rank, n, out) -> None:
    """Table 3: scaleout's allreduce_ at the large sizes with each number of endpoint servers.

    K is fixed for the life of an init, so the Ks cannot be interleaved iteration by iteration
    as the libraries are in table 1: instead each K runs half its iterations in each of two
    rounds, the second in reverse order (1 2 3, then 3 2 1)."""
    ks = args.ep_servers
    max_bytes = int(args.max_mb * MiB)
    sizes = [s for s in SIZES if args.ep_min_mb * MiB <= s <= max_bytes]
    if not sizes:
        out(
            f"## endpoint servers: no sizes between --ep-min-mb {args.ep_min_mb} and "
            f"--max-mb {args.max_mb}"
        )
        return
    before = os.environ.get("SCALEOUT_EP_SERVERS")
    shm_before = os.environ.get("SCALEOUT_SHM")
    ep_cores = [c for c in os.environ.get("SCALEOUT_EP_CORES", "").split(",") if c]
    rounds = 2
    times = {(k, nbytes): [] for k in ks for nbytes in sizes}
    want = n * (n + 1) / 2.0
    for round_index in range(rounds):
        for k in ks if round_index % 2 == 0 else ks[::-1]:
            reinit_with_servers(k)
            for nbytes in sizes:
                buf = np.full(nbytes // 4, rank + 1, dtype=np.float32)
                name = f"bench.ep.{nbytes}"
                so.allreduce_(buf, op=so.Sum, name=name)
                check_close(
                    f"scaleout allreduce_ {fmt_size(nbytes)} with {k} endpoint servers", buf, want
                )
                buf[...] = 0.0  # zeros stay zeros under Sum
                iters = max(1, iterations(nbytes, args) // rounds)
                warmup = 1 if nbytes >= 16 * MiB else 3
                fn = lambda: so.allreduce_(buf, op=so.Sum, name=name)  # noqa: E731
                times[(k, nbytes)].append(bench.interleaved([fn], iters, warmup)[0])
    for name, value in (("SCALEOUT_EP_SERVERS", before), ("SCALEOUT_SHM", shm_before)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    first = ks[0]
    rows = []
    for nbytes in sizes:
        med = {k: float(np.median(np.concatenate(times[(k, nbytes)]))) for k in ks}
        iters = sum(len(t) for t in times[(first, nbytes)])
        row = [fmt_size(nbytes), iters] + [fmt_time(med[k]) for k in ks]
        row += [busbw(nbytes, med[k], n) for k in ks]
        row += [f"{med[k] / med[first]:.2f}" for k in ks[1:]]
        rows.append(row)
    out(
        f"## endpoint servers: so.allreduce_ over MPI (SCALEOUT_SHM=0), float32, Sum, with K "
        f"servers per rank; medians over {rounds} rounds; ratio = time with K / time with "
        f"K={first}"
    )
    hdr = (
        ["size", "iters"]
        + [f"K={k}" for k in ks]
        + [f"busbw K={k}" for k in ks]
        + [f"K={k} / K={first}" for k in ks[1:]]
    )
    for line in table(rows, hdr, ["l"] + ["r"] * (len(hdr) - 1)):
        out(line)
    pinned = (
        f"servers pinned to SCALEOUT_EP_CORES={','.join(ep_cores)} (rank 0's; servers "
        f"beyond {len(ep_cores)} run unpinned)"
        if ep_cores
        else "no SCALEOUT_EP_CORES: servers unpinned"
    )
    out(
        f"(busbw in GB/s; {pinned}; an allreduce is split only at 256 KiB or more per server; "
        f"{os.cpu_count()} CPUs on this host)"
    )


def small_table(args, comm, bench, rank, n, out) -> None:
    """200 x 16 KiB: scaleout async back to back then synchronize, vs mpi4py."""
    expect_sum = n * (n + 1) / 2.0
    iters = args.small_iters
    names = [f"bench.small.{i}" for i in range(SMALL_COUNT)]
    names_new = [f"bench.small_new.{i}" for i in range(SMALL_COUNT)]
    tensors = [np.full(SMALL_FLOATS, rank + 1, dtype=np.float32) for _ in range(SMALL_COUNT)]
    packed_x = np.full(SMALL_COUNT * SMALL_FLOATS, rank + 1, dtype=np.float32)
    packed_y = np.empty_like(packed_x)
    small_x = [np.full(SMALL_FLOATS, rank + 1, dtype=np.float32) for _ in range(SMALL_COUNT)]
    small_y = [np.empty_like(a) for a in small_x]

    # correctness once
    handles = [so.allreduce_async_(t, op=so.Sum, name=nm) for t, nm in zip(tensors, names)]
    for h in handles:
        so.synchronize(h)
    for t in tensors:
        check_close("scaleout 200 x 16 KiB", t, expect_sum)
        t[...] = 0.0
    handles = [so.allreduce_async(t, op=so.Sum, name=nm) for t, nm in zip(small_x, names_new)]
    for h in handles:
        check_close("scaleout 200 x 16 KiB (allreduce_async)", so.synchronize(h), expect_sum)
    del handles

    def so_inplace():
        hs = [so.allreduce_async_(t, op=so.Sum, name=nm) for t, nm in zip(tensors, names)]
        for h in hs:
            so.synchronize(h)

    def so_new():
        hs = [so.allreduce_async(t, op=so.Sum, name=nm) for t, nm in zip(small_x, names_new)]
        for h in hs:
            so.synchronize(h)

    def mpi_packed():
        comm.Allreduce(packed_x, packed_y, op=MPI.SUM)

    def mpi_each():
        for a, b in zip(small_x, small_y):
            comm.Allreduce(a, b, op=MPI.SUM)

    fns = [so_inplace, so_new, mpi_packed, mpi_each]
    times = bench.interleaved(fns, iters, warmup=5)
    check_close("mpi4py packed", packed_y, expect_sum)
    check_close("mpi4py 200 x 16 KiB", small_y[-1], expect_sum)
    med = [float(np.median(t)) for t in times]
    total = SMALL_COUNT * SMALL_FLOATS * 4
    labels = [
        "scaleout: 200 x allreduce_async_ (in place), then synchronize",
        "scaleout: 200 x allreduce_async (new arrays), then synchronize",
        "mpi4py: 1 x Allreduce of 3.2 MB, pre-packed",
        "mpi4py: 200 x Allreduce of 16 KiB, one after another",
    ]
    rows = []
    for label, m, t in zip(labels, med, times):
        p = stats(t)
        row = [label, fmt_time(m), f"{m / med[2]:.2f}", f"{m / med[3]:.2f}", busbw(total, m, n)]
        if args.spread:
            row += [fmt_time(p[1]), fmt_time(p[2])]
        rows.append(row)
    out(
        f"## {SMALL_COUNT} x 16 KiB float32 (3.2 MB in all), Sum, end to end; "
        f"median of {iters} iterations"
    )
    hdr = ["case", "median", "/ packed", "/ 200 mpi4py", "busbw GB/s"]
    align = ["l", "r", "r", "r", "r"]
    if args.spread:
        hdr += ["p10", "p90"]
        align += ["r", "r"]
    for line in table(rows, hdr, align):
        out(line)


def frontends_table(args, comm, bench, rank, n, out) -> None:
    """200 x 16 KiB through numpy, torch and TensorFlow: end to end, and the submission cost."""
    expect_sum = n * (n + 1) / 2.0
    iters = args.small_iters
    submit_times = {}

    def timed(label, submit, finish):
        submit_times[label] = []

        def fn():
            t0 = perf()
            pending = submit()
            submit_times[label].append((perf() - t0) / SMALL_COUNT)
            finish(pending)

        return fn

    arrays = [np.full(SMALL_FLOATS, rank + 1, dtype=np.float32) for _ in range(SMALL_COUNT)]
    names = [f"bench.fe.np.{i}" for i in range(SMALL_COUNT)]
    cases = [
        (
            "numpy: so.allreduce_async_",
            timed(
                "numpy",
                lambda: [
                    so.allreduce_async_(a, op=so.Sum, name=nm) for a, nm in zip(arrays, names)
                ],
                lambda hs: [so.synchronize(h) for h in hs],
            ),
        )
    ]
    checks = [lambda: arrays[-1]]
    resets = [lambda: [a.fill(0.0) for a in arrays]]
    if not args.no_frameworks:
        try:
            import torch

            import scaleout.torch as sot
        except ImportError:
            torch = None
        if torch is not None:
            tensors = [torch.full((SMALL_FLOATS,), float(rank + 1)) for _ in range(SMALL_COUNT)]
            tnames = [f"bench.fe.torch.{i}" for i in range(SMALL_COUNT)]
            cases.append(
                (
                    "torch: scaleout.torch.allreduce_async_",
                    timed(
                        "torch",
                        lambda: [
                            sot.allreduce_async_(t, op=sot.Sum, name=nm)
                            for t, nm in zip(tensors, tnames)
                        ],
                        lambda hs: [sot.synchronize(h) for h in hs],
                    ),
                )
            )
            checks.append(lambda: tensors[-1].numpy())
            resets.append(lambda: [t.zero_() for t in tensors])
        try:
            import tensorflow as tf

            import scaleout.tensorflow as sotf
        except ImportError:
            tf = None
        if tf is not None:
            tf_in = [tf.fill([SMALL_FLOATS], float(rank + 1)) for _ in range(SMALL_COUNT)]
            tf_out = [None]

            def tf_step():
                tf_out[0] = sotf.grouped_allreduce(tf_in, op=sotf.Sum, name="bench.fe.tf")

            cases.append(("TensorFlow: eager grouped_allreduce of 200", tf_step))
            checks.append(lambda: tf_out[0][-1].numpy())
    labels = [c[0] for c in cases]
    for (label, fn), get in zip(cases, checks):  # correctness once, then zeros (Sum stays 0)
        fn()
        check_close(label, np.asarray(get()), expect_sum)
    for reset in resets:
        reset()
    times = bench.interleaved([c[1] for c in cases], iters, warmup=5)
    med = [float(np.median(t)) for t in times]
    rows = []
    for label, key, m in zip(labels, ["numpy", "torch", "tf"], med):
        per = submit_times.get(key)
        if per:
            local = np.array([float(np.median(per))])
            worst = np.empty_like(local)
            comm.Allreduce(local, worst, op=MPI.MAX)
            per_call = f"{worst[0] * 1e6:.2f} us"
        else:
            per_call = "n/a (one call)"
        rows.append([label, fmt_time(m), f"{m / med[0]:.2f}", per_call])
    out(
        f"## {SMALL_COUNT} x 16 KiB float32 through each front end, Sum, end to end; "
        f"median of {iters} iterations"
    )
    for line in table(
        rows, ["case", "median", "/ numpy", "submit one (median)"], ["l", "r", "r", "r"]
    ):
        out(line)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as e:
        print(f"rank {MPI.COMM_WORLD.rank}: {e}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
