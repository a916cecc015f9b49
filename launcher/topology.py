"""A node's CPU topology: sockets, NUMA nodes, physical cores and their hyperthreads.

detect() reads Linux's /sys (no hwloc needed) and keeps only the CPUs this process may use, so
a cgroup, taskset or batch-system restriction is respected. synthetic() describes a node in
words, for planning and tests without the hardware.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional

__all__ = [
    "Core",
    "Topology",
    "detect",
    "synthetic",
    "parse_cpu_list",
    "format_cpu_list",
    "local_cpus",
]


@dataclass(frozen=True)
class Core:
    """One physical core: where it sits, and its logical CPUs (hyperthreads), lowest first."""

    socket: int
    numa: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    cores: tuple[Core, ...]  # ordered by socket, NUMA node, then lowest logical CPU

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({core.socket for core in self.cores}))

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({core.numa for core in self.cores}))

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(cpu for core in self.cores for cpu in core.cpus))

    def core_of(self, cpu: int) -> Optional[Core]:
        return next((core for core in self.cores if cpu in core.cpus), None)

    def describe(self) -> str:
        threads = max((len(core.cpus) for core in self.cores), default=1)
        return (
            f"{len(self.sockets)} socket(s), {len(self.numa_nodes)} NUMA node(s), "
            f"{len(self.cores)} cores, {threads} thread(s) per core"
        )


def _ordered(cores: Iterable[Core]) -> Topology:
    return Topology(tuple(sorted(cores, key=lambda core: (core.socket, core.numa, core.cpus[0]))))


def synthetic(
    sockets: int, cores_per_socket: int, threads_per_core: int = 1, numa_per_socket: int = 1
) -> Topology:
    """A described node, numbered as Linux numbers Intel and AMD servers: the first hyperthread
    of every core first (socket by socket), then the second ones, and so on."""
    total = sockets * cores_per_socket
    per_numa = cores_per_socket // numa_per_socket
    cores = []
    for socket in range(sockets):
        for index in range(cores_per_socket):
            first = socket * cores_per_socket + index
            numa = socket * numa_per_socket + min(index // per_numa, numa_per_socket - 1)
            cores.append(
                Core(socket, numa, tuple(first + t * total for t in range(threads_per_core)))
            )
    return _ordered(cores)


def parse_cpu_list(text: str) -> list[int]:
    """Linux's CPU list format: '0-3,8,10-11' (also accepted: plain commas, spaces)."""
    cpus: list[int] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list (like 0-3,8)")
        cpus += range(int(first), int(last) + 1) if dash else [int(first)]
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The compact form: [0, 1, 2, 3, 8] -> '0-3,8'."""
    ordered = sorted(set(cpus))
    parts, start = [], None
    for index, cpu in enumerate(ordered):
        if start is None:
            start = cpu
        if index + 1 == len(ordered) or ordered[index + 1] != cpu + 1:
            parts.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(parts)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def detect(sys_root: str = "/sys", allowed: Optional[Iterable[int]] = None) -> Topology:
    """This node's topology from sysfs, limited to the CPUs in allowed (default: the CPUs this
    process may run on). Without sysfs, every allowed CPU counts as a core of one socket."""
    allowed_set = set(os.sched_getaffinity(0) if allowed is None else allowed)
    cpu_root = os.path.join(sys_root, "devices", "system", "cpu")
    numa_of: dict[int, int] = {}
    for node_dir in glob.glob(os.path.join(sys_root, "devices", "system", "node", "node[0-9]*")):
        text = _read(os.path.join(node_dir, "cpulist"))
        if text:
            for cpu in parse_cpu_list(text):
                numa_of[cpu] = int(os.path.basename(node_dir)[4:])
    cores: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for cpu in sorted(allowed_set):
        topo = os.path.join(cpu_root, f"cpu{cpu}", "topology")
        package = _read(os.path.join(topo, "physical_package_id"))
        siblings = _read(os.path.join(topo, "core_cpus_list")) or _read(
            os.path.join(topo, "thread_siblings_list")
        )
        socket = int(package) if package and package.lstrip("-").isdigit() else 0
        group = tuple(parse_cpu_list(siblings)) if siblings else (cpu,)
        cores.setdefault((max(socket, 0), group), []).append(cpu)
    return _ordered(
        Core(socket, numa_of.get(cpus[0], 0), tuple(sorted(cpus)))
        for (socket, _), cpus in cores.items()
    )


def local_cpus() -> int:
    """The CPUs this process may use (what decides whether this machine's ranks oversubscribe
    it)."""
    return len(os.sched_getaffinity(0))
