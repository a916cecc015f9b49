"""The placement planner: for the ranks of one node, their domain, compute cores, endpoint-server
cores and thread count. Pure functions over a Topology.

Conventions users know from MLSL and oneCCL (see Note [Placement] below):
- ranks are spread over the node's sockets (or NUMA nodes), consecutive ranks side by side;
- each rank gets a contiguous block of its domain's physical cores (all their hyperthreads);
- its K endpoint-server cores are the last K cores of its block, excluded from its compute cores;
- compute threads = compute cores, unless asked otherwise.

Note [Placement]
Binding modes. 'core' binds a rank to its own block's compute cores. 'socket'
and 'numa' bind it to every compute core of the sockets or NUMA nodes its block lies in (shared
with the other ranks there); endpoint cores stay reserved either way. 'none' binds nothing and
only sets thread counts. 'auto' is 'core' when every rank gets at least one compute core, else
'none' (an oversubscribed node). Endpoint-server cores are not part of a rank's CPU mask: the
core pins its endpoint threads to them itself (SCALEOUT_EP_CORES), which Linux allows because
sched_setaffinity is bounded by the cpuset, not by the process's current mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .topology import Core, Topology, format_cpu_list, parse_cpu_list

__all__ = [
    "PlacementError",
    "PlacementRequest",
    "RankPlacement",
    "NodePlan",
    "plan_node",
    "rank_environment",
    "THREAD_VARIABLES",
    "parse_ep_affinity",
]

# Thread-count variables set for the program unless the user set them.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
)


class PlacementError(ValueError):
    """A placement that cannot be made on this node (reported before anything starts)."""


@dataclass(frozen=True)
class PlacementRequest:
    bind_to: str = "auto"  # auto, none, core, socket, numa
    map_by: str = "socket"  # socket, numa, core
    ep_servers: Optional[int] = None  # None: 1 when a rank has 4+ cores, else 0
    ep_affinity: Optional[tuple[int, ...]] = None
    threads_per_rank: Optional[int] = None

    def to_args(self) -> list[str]:
        """The same request as rank_exec flags (each rank plans again on its own node)."""
        args = ["--bind-to", self.bind_to, "--map-by", self.map_by]
        if self.ep_servers is not None:
            args += ["--ep-servers", str(self.ep_servers)]
        if self.ep_affinity is not None:
            args += ["--ep-affinity", ",".join(map(str, self.ep_affinity))]
        if self.threads_per_rank is not None:
            args += ["--threads-per-rank", str(self.threads_per_rank)]
        return args


@dataclass(frozen=True)
class RankPlacement:
    local_rank: int
    bind: str  # the binding applied: none, core, socket or numa
    sockets: tuple[int, ...]  # the sockets its block lies in (all, when not bound)
    cpus: tuple[int, ...]  # its CPU mask; () when not bound
    compute_cores: tuple[int, ...]  # first logical CPU of each of its own compute cores
    ep_cpus: tuple[int, ...]  # one logical CPU per endpoint server; () when not pinned
    ep_servers: int  # endpoint-server threads (0: the core's default, one)
    threads: int


@dataclass(frozen=True)
class NodePlan:
    ranks: tuple[RankPlacement, ...]
    notes: tuple[str, ...] = ()


def parse_ep_affinity(text: str) -> tuple[int, ...]:
    try:
        cpus = parse_cpu_list(text)
    except ValueError as exc:
        raise PlacementError(f"--ep-affinity: {exc}") from None
    if len(set(cpus)) != len(cpus):
        raise PlacementError(f"--ep-affinity {text!r} names a CPU twice")
    return tuple(cpus)


def _split(items: Sequence, parts: int) -> list[list]:
    """items in `parts` contiguous runs, as even as possible (the first runs get the extra)."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        runs.append(list(items[start:end]))
        start = end
    return runs


def _domains(topology: Topology, map_by: str) -> list[list[Core]]:
    if map_by == "core":
        return [list(topology.cores)]
    key = (lambda core: core.socket) if map_by == "socket" else (lambda core: core.numa)
    groups: dict[int, list[Core]] = {}
    for core in topology.cores:
        groups.setdefault(key(core), []).append(core)
    return [groups[index] for index in sorted(groups)]


def _blocks(topology: Topology, local_size: int, map_by: str) -> list[list[Core]]:
    """Each local rank's block of cores: ranks spread over the domains, consecutive ranks in the
    same domain; fewer ranks than domains: each rank spans several whole domains."""
    domains = _domains(topology, map_by)
    if local_size <= len(domains):
        return [
            [core for domain in group for core in domain] for group in _split(domains, local_size)
        ]
    blocks = []
    for domain, count in zip(
        domains, [len(run) for run in _split(range(local_size), len(domains))]
    ):
        if count > len(domain):
            raise PlacementError(
                f"{count} ranks on a {map_by} domain of {len(domain)} cores: more ranks than "
                f"cores (--map-by {map_by}); use fewer ranks, --map-by core, or --bind-to none"
            )
        blocks += _split(domain, count)
    return blocks


def _endpoint_cores(
    topology: Topology, blocks: list[list[Core]], request: PlacementRequest
) -> tuple[list[list[Core]], list[tuple[int, ...]]]:
    """Each rank's endpoint cores and endpoint CPUs (one per server)."""
    local_size = len(blocks)
    if request.ep_affinity is not None:
        cpus = request.ep_affinity
        if request.ep_servers is not None and len(cpus) != request.ep_servers * local_size:
            raise PlacementError(
                f"--ep-affinity names {len(cpus)} CPUs, but {local_size} ranks with "
                f"--ep-servers {request.ep_servers} need {request.ep_servers * local_size}"
            )
        if len(cpus) % local_size:
            raise PlacementError(
                f"--ep-affinity names {len(cpus)} CPUs, not a multiple of the "
                f"{local_size} ranks on this node"
            )
        per_rank = len(cpus) // local_size
        cores = []
        for cpu in cpus:
            core = topology.core_of(cpu)
            if core is None:
                raise PlacementError(
                    f"--ep-affinity names CPU {cpu}, which this node does not "
                    f"have (or this process may not use): CPUs are "
                    f"{format_cpu_list(topology.cpus)}"
                )
            cores.append(core)
        return (
            [cores[r * per_rank : (r + 1) * per_rank] for r in range(local_size)],
            [cpus[r * per_rank : (r + 1) * per_rank] for r in range(local_size)],
        )
    ep_cores = []
    for rank, block in enumerate(blocks):
        count = (
            request.ep_servers if request.ep_servers is not None else (1 if len(block) >= 4 else 0)
        )
        if count >= len(block) and count > 0:
            raise PlacementError(
                f"--ep-servers {count} leaves rank {rank} no compute core: its block has "
                f"{len(block)} core(s); use fewer endpoint servers or fewer ranks per node"
            )
        ep_cores.append(block[len(block) - count :] if count else [])
    return ep_cores, [tuple(core.cpus[0] for core in cores) for cores in ep_cores]


def _bound_plan(
    topology: Topology, local_size: int, request: PlacementRequest, bind: str
) -> NodePlan:
    blocks = _blocks(topology, local_size, request.map_by)
    ep_cores, ep_cpus = _endpoint_cores(topology, blocks, request)
    reserved = {core for cores in ep_cores for core in cores}
    ranks = []
    for rank, block in enumerate(blocks):
        compute = [core for core in block if core not in reserved]
        if not compute:
            raise PlacementError(
                f"rank {rank} has no compute core left: its block "
                f"{format_cpu_list(c.cpus[0] for c in block)} is all "
                "endpoint-server cores"
            )
        if bind == "core":
            mask = compute
        else:
            domain_of = (lambda core: core.socket) if bind == "socket" else (lambda core: core.numa)
            mine = {domain_of(core) for core in block}
            mask = [
                core for core in topology.cores if domain_of(core) in mine and core not in reserved
            ]
        ranks.append(
            RankPlacement(
                local_rank=rank,
                bind=bind,
                sockets=tuple(sorted({core.socket for core in block})),
                cpus=tuple(sorted(cpu for core in mask for cpu in core.cpus)),
                compute_cores=tuple(core.cpus[0] for core in compute),
                ep_cpus=ep_cpus[rank],
                ep_servers=len(ep_cpus[rank]),
                threads=request.threads_per_rank or len(compute),
            )
        )
    return NodePlan(tuple(ranks))


def _unbound_plan(
    topology: Topology, local_size: int, request: PlacementRequest, note: Optional[str]
) -> NodePlan:
    threads = request.threads_per_rank or max(1, len(topology.cores) // local_size)
    ep_cpus: list[tuple[int, ...]] = [()] * local_size
    if request.ep_affinity is not None:  # explicit endpoint CPUs are honoured even unbound
        ep_cpus = _endpoint_cores(topology, [[]] * local_size, request)[1]
    ranks = tuple(
        RankPlacement(
            local_rank=rank,
            bind="none",
            sockets=topology.sockets,
            cpus=(),
            compute_cores=(),
            ep_cpus=ep_cpus[rank],
            ep_servers=len(ep_cpus[rank]) or request.ep_servers or 0,
            threads=threads,
        )
        for rank in range(local_size)
    )
    return NodePlan(ranks, (note,) if note else ())


def plan_node(topology: Topology, local_size: int, request: PlacementRequest) -> NodePlan:
    """The placement of local ranks 0..local_size-1 on a node. Raises PlacementError for a
    request that cannot be met (the message says why and what to change)."""
    if local_size < 1:
        raise PlacementError("no ranks to place")
    if not topology.cores:
        raise PlacementError("no usable CPU found on this node")
    bind = request.bind_to
    if bind == "none":
        return _unbound_plan(topology, local_size, request, None)
    if bind == "auto":
        if local_size > len(topology.cores):
            return _unbound_plan(
                topology,
                local_size,
                request,
                f"{local_size} ranks on {len(topology.cores)} cores: ranks are not bound "
                "(--bind-to auto on an oversubscribed node)",
            )
        try:
            return _bound_plan(topology, local_size, request, "core")
        except PlacementError:
            if request.ep_servers is not None or request.ep_affinity is not None:
                raise
            return _unbound_plan(
                topology,
                local_size,
                request,
                "the ranks do not fit one per core in their domains: not bound (--bind-to auto)",
            )
    if bind == "core" and local_size > len(topology.cores):
        raise PlacementError(
            f"--bind-to core with {local_size} ranks on a node of "
            f"{len(topology.cores)} cores: more ranks than cores"
        )
    return _bound_plan(topology, local_size, request, bind)


def rank_environment(placement: RankPlacement, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a rank's program gets from its placement.

    SCALEOUT_* describe the plan to the core (and to scaleout's placement report);
    the thread-count variables are set only where the user has not set them.
    """
    env = {
        "SCALEOUT_BIND_TO": placement.bind,
        "SCALEOUT_COMPUTE_CORES": ",".join(map(str, placement.cpus)),
        "SCALEOUT_EP_CORES": ",".join(map(str, placement.ep_cpus)),
        "SCALEOUT_EP_SERVERS": str(placement.ep_servers),
        "SCALEOUT_COMPUTE_THREADS": str(placement.threads),
    }
    for name in THREAD_VARIABLES:
        if not environ.get(name):
            env[name] = str(placement.threads)
    return env
