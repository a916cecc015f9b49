"""From a LaunchConfig to a JobPlan: where the ranks run and what every rank gets. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from .config import LaunchConfig
from .errors import UsageError
from .hosts import HostSlots, is_local_host, parse_host_list, ranks_per_host, read_hostfile
from .placement import NodePlan, PlacementError, PlacementRequest, parse_ep_affinity, plan_node
from .rank_env import HOROVOD_SLOTS
from .slurm import detect_allocation
from .topology import Topology

__all__ = [
    "HostSource",
    "JobPlan",
    "HostPlacement",
    "plan_job",
    "resolve_hosts",
    "placement_request",
    "plan_placement",
    "tuning_environment",
]


@dataclass(frozen=True)
class HostSource:
    """Where the ranks may run, and how the MPI's launcher reaches those hosts."""

    hosts: tuple[HostSlots, ...]
    origin: str  # for messages: "-H", "the Slurm allocation of job 7"
    remote_launch: str = "ssh"  # "ssh" or "slurm"
    default_np: Optional[int] = None  # the ranks to start when -np is not given


@dataclass(frozen=True)
class JobPlan:
    np: int
    # Ranks per host, in rank order; None when every rank runs on this machine.
    hosts: Optional[tuple[HostSlots, ...]]
    # The ranks this machine runs, and whether that is more than its CPUs.
    local_ranks: int
    oversubscribed: bool
    environment: dict[str, str] = field(default_factory=dict)  # added for every rank
    remote_launch: Optional[str] = None  # how hosts are reached: "ssh", "slurm"; None: local


def job_hosts(plan: JobPlan) -> tuple[HostSlots, ...]:
    """The job's hosts and slots in rank order: this machine ("localhost") alone when the
    plan names none."""
    return plan.hosts or (HostSlots("localhost", plan.np),)


def resolve_hosts(config: LaunchConfig, environ: Mapping[str, str]) -> Optional[HostSource]:
    """The hosts named by -H or --hostfile, else those of the Slurm allocation scaleoutrun runs
    in (--slurm auto or on); None when every rank runs on this machine. Reading the hostfile is
    its one side effect."""
    allocation = detect_allocation(environ) if config.slurm != "off" else None
    if config.slurm == "on" and allocation is None:
        raise UsageError(
            "--slurm on, but this is not inside a Slurm allocation "
            "(SLURM_JOB_ID and SLURM_JOB_NODELIST are not set)"
        )
    remote_launch = "slurm" if config.slurm == "on" else "ssh"
    if config.hosts is not None:
        return HostSource(tuple(parse_host_list(config.hosts)), "-H", remote_launch)
    if config.hostfile is not None:
        return HostSource(tuple(read_hostfile(config.hostfile)), config.hostfile, remote_launch)
    if allocation is not None:
        return HostSource(allocation.hosts, allocation.describe(), "slurm", allocation.ntasks)
    return None


def plan_job(
    config: LaunchConfig,
    local_cpus: int,
    source: Optional[HostSource] = None,
    is_local=is_local_host,
) -> JobPlan:
    """The job's shape. source: from resolve_hosts (passed in so this stays free of I/O)."""
    np = config.np
    if np is None:
        if source is None:
            raise UsageError(
                "the number of ranks is missing: give -np N "
                "(or -H/--hostfile, whose slots then set it)"
            )
        np = source.default_np or sum(entry.slots for entry in source.hosts)
    placed = tuple(ranks_per_host(source.hosts, np, source.origin)) if source is not None else None
    if placed is None:
        local_ranks = np
    else:
        # Hosts that are all this machine (localhost, 127.0.0.1, its name) share its CPUs.
        local_ranks = sum(entry.slots for entry in placed if is_local(entry.host))
    return JobPlan(
        np=np,
        hosts=placed,
        local_ranks=local_ranks,
        oversubscribed=local_ranks > local_cpus,
        environment=tuning_environment(config),
        remote_launch=source.remote_launch if source is not None else None,
    )


@dataclass(frozen=True)
class HostPlacement:
    host: str
    first_rank: int  # the global rank of its local rank 0
    plan: NodePlan
    local: bool  # False: planned with this machine's topology, an assumption


def placement_request(config: LaunchConfig) -> PlacementRequest:
    try:
        affinity = parse_ep_affinity(config.ep_affinity) if config.ep_affinity else None
    except PlacementError as exc:
        raise UsageError(str(exc)) from None
    return PlacementRequest(
        bind_to=config.bind_to,
        map_by=config.map_by,
        ep_servers=config.ep_servers,
        ep_affinity=affinity,
        threads_per_rank=config.threads_per_rank,
    )


def plan_placement(
    plan: JobPlan,
    request: PlacementRequest,
    topology: Topology,
    include_remote: bool,
    is_local=is_local_host,
) -> list[HostPlacement]:
    """Each host's placement, planned on this machine's topology.

    Local hosts are checked for real: an impossible request is a UsageError before anything
    starts. Remote hosts (include_remote, for --print-placement) are planned as if they were
    like this machine; when launching, each rank plans again on its own node and reports a
    placement it cannot make there.
    """
    hosts = job_hosts(plan)
    placements, first = [], 0
    for entry in hosts:
        local = plan.hosts is None or is_local(entry.host)
        if local or include_remote:
            try:
                node = plan_node(topology, entry.slots, request)
            except PlacementError as exc:
                where = "" if plan.hosts is None else f" on {entry.host}"
                raise UsageError(f"cannot place {entry.slots} rank(s){where}: {exc}") from None
            placements.append(HostPlacement(entry.host, first, node, local))
        first += entry.slots
    return placements


def tuning_environment(config: LaunchConfig) -> dict[str, str]:
    """The SCALEOUT_* variables every rank gets from the tuning flags that were given."""
    values = {
        "SCALEOUT_FUSION_THRESHOLD": config.fusion_threshold_bytes,
        "SCALEOUT_CYCLE_TIME": config.cycle_time_ms,
        "SCALEOUT_AUTOTUNE": config.autotune,
        "SCALEOUT_CACHE_CAPACITY": config.cache_capacity,
        "SCALEOUT_STALL_CHECK_TIME_SECONDS": config.stall_check_seconds,
        "SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS": config.stall_shutdown_seconds,
        "SCALEOUT_STALL_CHECK_DISABLE": config.stall_check_disable,
        "SCALEOUT_HIERARCHICAL_ALLREDUCE": config.hierarchical_allreduce,
        "SCALEOUT_HIERARCHICAL_ALLGATHER": config.hierarchical_allgather,
        "SCALEOUT_TIMELINE": config.timeline,
        # As horovodrun: cycle marks only mean something in a timeline.
        "SCALEOUT_TIMELINE_MARK_CYCLES": config.timeline_mark_cycles if config.timeline else None,
        "SCALEOUT_STATS": config.stats,
        "SCALEOUT_LOG_LEVEL": config.log_level,
    }
    if config.autotune is not False:
        # Unless autotuning was turned off here: with HOROVOD_AUTOTUNE=1 in the ranks'
        # environment they apply, and without it the core names each as having no effect
        # (horovodrun drops them silently unless --autotune is given).
        values.update(
            {
                "SCALEOUT_AUTOTUNE_LOG": config.autotune_log,
                "SCALEOUT_AUTOTUNE_WARMUP_SAMPLES": config.autotune_warmup_samples,
                "SCALEOUT_AUTOTUNE_STEPS_PER_SAMPLE": config.autotune_steps_per_sample,
                "SCALEOUT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": config.autotune_bayes_opt_max_samples,
                "SCALEOUT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": config.autotune_gaussian_process_noise,
            }
        )
    return {name: _format(value) for name, value in values.items() if value is not None}


def torch_store_environment(
    plan: JobPlan,
    free_port: Callable[[], int],
    this_machine: Callable[[], str],
    is_local=is_local_host,
) -> dict[str, str]:
    """What torch.distributed's env:// store needs that every rank shares, as torchrun gives
    it, under SCALEOUT_TORCH_* names: `import scaleout.torch` turns them into torch's own
    (Note [torch.distributed backend]), so that only programs using scaleout see them, and
    `init_process_group("scaleout")` needs no arguments. The rank wrapper adds each rank's own
    (rank_env.torch_rank_environment). this_machine: an address of this machine the other
    hosts can reach, for when rank 0 runs here and others elsewhere. free_port: a port free
    here (when rank 0 runs on another host, it is free here, probably there too)."""
    if plan.hosts is None or all(is_local(entry.host) for entry in plan.hosts):
        address = "127.0.0.1"
    elif is_local(plan.hosts[0].host):
        address = this_machine()
    else:
        address = plan.hosts[0].host
    return {
        "SCALEOUT_TORCH_WORLD_SIZE": str(plan.np),
        "SCALEOUT_TORCH_MASTER_ADDR": address,
        "SCALEOUT_TORCH_MASTER_PORT": str(free_port()),
    }


def horovod_slots_environment(plan: JobPlan) -> dict[str, str]:
    """The job's hosts and slots in rank order, from which each rank's wrapper works out
    horovodrun's variables for it (Note [horovodrun's rank variables] in rank_env)."""
    hosts = job_hosts(plan)
    return {HOROVOD_SLOTS: ",".join(f"{entry.host}:{entry.slots}" for entry in hosts)}


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
