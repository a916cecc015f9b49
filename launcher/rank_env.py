"""Which rank this process is, read from the variables the MPI launcher sets."""

from __future__ import annotations

from typing import Mapping, Optional

from .slurm import expand_counts

__all__ = [
    "rank_from_environment",
    "local_rank_and_size",
    "torch_rank_environment",
    "HOROVOD_SLOTS",
    "HOROVOD_NUMBERS",
    "horovod_rank_environment",
]

# Set by scaleoutrun for every rank: the job's hosts and their slots in rank order ("a:2,b:1"),
# and under the elastic driver each rank's worker number (Note [horovodrun's rank variables]).
HOROVOD_SLOTS = "SCALEOUT_HOROVOD_SLOTS"
HOROVOD_NUMBERS = "SCALEOUT_HOROVOD_NUMBERS"

# Hydra (MPICH, Intel MPI), Open MPI, PMIx launchers, Slurm's srun.
_RANK = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_LOCAL = (
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)


def rank_from_environment(environ: Mapping[str, str]) -> str:
    """The rank as text ("?" when no known launcher variable is set)."""
    for name in _RANK:
        value = environ.get(name, "")
        if value.isdigit():
            return value
    return "?"


def local_rank_and_size(environ: Mapping[str, str]) -> tuple[Optional[int], Optional[int]]:
    """This rank's index among the ranks of its host, and their number (None when unknown)."""
    for rank_name, size_name in _LOCAL:
        rank, size = environ.get(rank_name, ""), environ.get(size_name, "")
        if rank.isdigit() and size.isdigit():
            return int(rank), int(size)
    return _slurm_local(environ)


def _slurm_local(environ: Mapping[str, str]) -> tuple[Optional[int], Optional[int]]:
    """srun: SLURM_LOCALID, and this node's entry of SLURM_TASKS_PER_NODE ("2(x3),1")."""
    local, node = environ.get("SLURM_LOCALID", ""), environ.get("SLURM_NODEID", "")
    if not (local.isdigit() and node.isdigit()):
        return None, None
    try:
        counts = expand_counts(environ.get("SLURM_TASKS_PER_NODE", ""))
    except ValueError:
        return None, None
    if int(node) >= len(counts):
        return None, None
    return int(local), counts[int(node)]


def torch_rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """This rank's RANK, LOCAL_RANK and LOCAL_WORLD_SIZE for torch.distributed's env://, as
    torchrun gives them, under SCALEOUT_TORCH_* names (plan.torch_store_environment says why);
    what the MPI launcher does not say is left out."""
    env = {}
    rank = rank_from_environment(environ)
    if rank.isdigit():
        env["SCALEOUT_TORCH_RANK"] = rank
    local_rank, local_size = local_rank_and_size(environ)
    if local_rank is not None and local_size is not None:
        env["SCALEOUT_TORCH_LOCAL_RANK"] = str(local_rank)
        env["SCALEOUT_TORCH_LOCAL_WORLD_SIZE"] = str(local_size)
    return env


# Note [horovodrun's rank variables]
# horovodrun gives every worker HOROVOD_HOSTNAME (its host as the host list names it),
# HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK and HOROVOD_LOCAL_SIZE (its slot among its
# host's), and HOROVOD_CROSS_RANK and HOROVOD_CROSS_SIZE (its host's index among the hosts that
# have a slot of its local rank, and their number), and scripts read them before init() to pick
# a seed, a device or a log file. scaleoutrun's ranks are started by the MPI launcher, all with
# one command, so scaleoutrun passes the job's slots (HOROVOD_SLOTS, the hosts in rank order, as
# the launcher places the ranks) and each rank's wrapper works out its own. Under the elastic
# driver a worker's HOROVOD_RANK and HOROVOD_HOSTNAME are its identity, as in Horovod, where a
# survivor's process and environment live on through a reset: the driver numbers the workers
# (HOROVOD_NUMBERS, elastic_plan.worker_numbers) so that a survivor keeps its number across the
# restarts of its generation while hvd.rank() changes, and a worker on a new slot gets one never
# used before (Horovod's gets its generation's rank, which a survivor may hold: here identities
# stay unique). The other variables are the generation's (a Horovod survivor's os.environ keeps
# those of its start).
def horovod_rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """This rank's HOROVOD_* variables, as horovodrun gives them (Note [horovodrun's rank
    variables]); none when scaleoutrun did not say the job's slots or the launcher the rank."""
    rank = rank_from_environment(environ)
    slots = []
    for entry in environ.get(HOROVOD_SLOTS, "").split(","):
        host, _, count = entry.rpartition(":")
        if not host or not count.isdigit():
            return {}
        slots.append((host, int(count)))
    if not rank.isdigit() or not slots:
        return {}
    size = sum(count for _, count in slots)
    owners = [index for index, (_, count) in enumerate(slots) for _ in range(count)]
    if int(rank) >= size:
        return {}
    index = owners[int(rank)]
    host, count = slots[index]
    local_rank = int(rank) - owners.index(index)
    peers = [other for other, (_, count) in enumerate(slots) if count > local_rank]
    numbers = environ.get(HOROVOD_NUMBERS, "").split(",")
    number = numbers[int(rank)] if len(numbers) == size else rank
    return {
        "HOROVOD_HOSTNAME": host,
        "HOROVOD_RANK": number if number.isdigit() else rank,
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(count),
        "HOROVOD_CROSS_RANK": str(peers.index(index)),
        "HOROVOD_CROSS_SIZE": str(len(peers)),
    }
