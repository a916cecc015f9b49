"""Which rank this process is, read from the variables the MPI launcher sets."""

from __future__ import annotations

from typing import Mapping, Optional

from .slurm import expand_counts

__all__ = ["rank_from_environment", "local_rank_and_size", "torch_rank_environment"]

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
