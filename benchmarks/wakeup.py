#!/usr/bin/env python
"""What waking a sleeping thread costs on this machine now: the probe of Note [Wake-ups].

    python benchmarks/wakeup.py [--rounds 5] [--trips 5000]

Two processes pass a byte back and forth over two pipes, each sleeping in a blocking read
until the other writes: once on two different CPUs (every trip wakes a sleeping CPU) and once
both on one CPU (a wake-up there is a switch on a busy CPU), then once more with the reader
polling instead of sleeping on two CPUs (no wake-up at all). The round trip is printed for
each, median over rounds. On this VM the cross-CPU trip is a few microseconds in one state and
70-80 us in the other, while the polling and same-CPU trips stay put: that state is what
scaleout's waits are shaped around (yield before sleeping). Needs two CPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def trip_time(cpus: tuple[int, int], trips: int, poll: bool) -> float:
    """Seconds per round trip between a parent on cpus[0] and a child on cpus[1]."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    if poll:
        os.set_blocking(down_r, False)
        os.set_blocking(up_r, False)

    def read(fd):
        while True:
            try:
                data = os.read(fd, 1)
            except BlockingIOError:
                continue
            if data:
                return

    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpus[1]})
        for _ in range(trips):
            read(down_r)
            os.write(up_w, b"x")
        os._exit(0)
    os.sched_setaffinity(0, {cpus[0]})
    read_fd, write_fd = up_r, down_w
    start = time.perf_counter()
    for _ in range(trips):
        os.write(write_fd, b"x")
        read(read_fd)
    elapsed = time.perf_counter() - start
    os.waitpid(pid, 0)
    for fd in (down_r, down_w, up_r, up_w):
        os.close(fd)
    return elapsed / trips


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--trips", type=int, default=5000)
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("wakeup.py needs two CPUs")
    a, b = cpus[0], cpus[1]
    cases = {
        f"sleeping reader, CPUs {a} and {b}": ((a, b), False),
        f"sleeping reader, CPU {a} alone": ((a, a), False),
        f"polling reader, CPUs {a} and {b}": ((a, b), True),
    }
    times = {name: [] for name in cases}
    try:
        for _ in range(args.rounds):
            for name, (pair, poll) in cases.items():
                times[name].append(trip_time(pair, args.trips, poll))
    finally:
        os.sched_setaffinity(0, set(cpus))
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, round trips over two pipes, median of {args.rounds}"
    )
    for name, values in times.items():
        print(f"{name:40s} {statistics.median(values) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
