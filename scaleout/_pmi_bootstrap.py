"""MPI for ranks that no MPI launcher started (torchrun, Ray, or processes given torch's
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE): Note [PMI bootstrap].

Note [PMI bootstrap]
An MPI library learns its job from the launcher that started it; a process that torchrun (or
Ray, or a shell) started has none, and MPI_Init makes it a world of one: N such processes would
train N models (Note [No silent singletons]), and two MPICH singletons cannot connect to each
other either. What they share is torch's key-value store (TCPStore at MASTER_ADDR:MASTER_PORT,
which torchrun's agent or rank 0 serves). So before MPI_Init, each rank writes its host name to
the store; rank 0 reads them all, starts a PMI-1 server (scaleout/_pmi_server.py, a child
process that lives while rank 0 does) told the ranks' placement (PMI_process_mapping, so that
the MPI library and scaleout see which ranks share a machine), and puts its address in the
store; every rank connects to it and hands the connection to MPI as Hydra and srun's pmi2
plugin do: PMI_FD, PMI_RANK, PMI_SIZE. MPI_Init then speaks PMI-1 over it and the ranks form
one world. The libraries of the MPICH ABI read PMI_FD (MPICH, and Intel MPI, whose client is
MPICH's); Open MPI reads PMIx only, so with it init() refuses the job, saying to start it with
scaleoutrun or mpirun (or to use MPICH). The store's keys carry torchrun's restart count, so a
restarted worker group does not read the last one's address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional

from scaleout import _mpi_library
from scaleout._errors import MPIMismatchError

# What says a process was started by an MPI launcher (or a scheduler's PMI) already.
_LAUNCHED = (
    "PMI_FD",
    "PMI_PORT",
    "PMI_RANK",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_RANK",
)

_SERVER = Path(__file__).resolve().parent / "_pmi_server.py"
_server: Optional[subprocess.Popen] = None
_keep: List[Any] = []  # rank 0's end of the pipe its server watches: open while rank 0 lives


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether this process must join its job through torch's store: torch's RANK and
    WORLD_SIZE (more than one process) and no MPI launcher's variables."""
    size = environ.get("WORLD_SIZE", "")
    if not (size.isdigit() and int(size) > 1 and environ.get("RANK", "").isdigit()):
        return False
    if any(environ.get(name) for name in _LAUNCHED):
        return False
    return all(name == "WORLD_SIZE" for name, _, _ in _mpi_library.launcher_sizes(environ))


def from_torch_agent(environ: Mapping[str, str] = os.environ) -> None:
    """scaleout.init() in a process that torchrun started: joins the job through the store that
    torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE). Elsewhere (processes given torch's
    variables by hand, whose store init_process_group creates) it does nothing, and init()
    refuses the singleton it makes, saying what to do."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        environ["MASTER_ADDR"],
        int(environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=300),
    )
    bootstrap(store, int(environ["RANK"]), int(environ["WORLD_SIZE"]), environ)


def mapping(hosts: List[str]) -> str:
    """PMI_process_mapping for ranks on `hosts` (rank order): a block per run of consecutive
    ranks on one host, hosts numbered in order of first appearance."""
    ids: dict = {}
    blocks = []
    for host in hosts:
        node = ids.setdefault(host, len(ids))
        if blocks and blocks[-1][0] == node:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1])
    return "(vector," + ",".join(f"({node},1,{count})" for node, count in blocks) + ")"


def _outward_address(environ: Mapping[str, str]) -> str:
    """The address of this machine that the store's host reaches it by (loopback when the
    store is on this machine)."""
    master = environ.get("MASTER_ADDR", "127.0.0.1") or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(environ.get("MASTER_PORT", "1") or 1)))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _refuse_open_mpi() -> None:
    library = _mpi_library.probe()
    if library.abi == "openmpi":
        raise MPIMismatchError(
            f"this process was started without an MPI launcher (torchrun, Ray, or torch's "
            f"RANK and WORLD_SIZE given by hand), and its MPI is {library}: scaleout starts "
            "such ranks over PMI-1, which the MPICH ABI's libraries read (MPICH, Intel MPI) "
            "and Open MPI does not. Start the job with scaleoutrun (or Open MPI's mpirun), or "
            "install MPICH (`pip install mpich`) for mpi4py and scaleout"
        )


def bootstrap(store: Any, rank: int, size: int, environ: Mapping[str, str] = os.environ) -> None:
    """Joins this process to its job before MPI_Init (Note [PMI bootstrap]). `store` is a
    torch.distributed Store shared by the job's processes."""
    global _server
    if "mpi4py.MPI" in sys.modules:
        raise MPIMismatchError(
            "mpi4py.MPI was imported before scaleout could start MPI for a job without an MPI "
            "launcher (torchrun, Ray, or torch's RANK and WORLD_SIZE): its MPI_Init made this "
            "process a job of one. Import mpi4py.MPI only after init_process_group('scaleout') "
            "or scaleout.init()"
        )
    _refuse_open_mpi()
    prefix = f"scaleout/pmi/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(f"{prefix}host/{rank}", socket.gethostname())
    if rank == 0:
        hosts = [store.get(f"{prefix}host/{r}").decode() for r in range(size)]
        local = len(set(hosts)) == 1
        read_end, write_end = os.pipe()
        _server = subprocess.Popen(
            [
                sys.executable,
                str(_SERVER),
                "--size",
                str(size),
                "--host",
                "127.0.0.1" if local else "",
                "--advertise",
                "127.0.0.1" if local else _outward_address(environ),
                "--mapping",
                mapping(hosts),
                "--watch-fd",
                str(read_end),
            ],
            stdout=subprocess.PIPE,
            pass_fds=(read_end,),
            text=True,
        )
        os.close(read_end)
        _keep.append(write_end)
        address = _server.stdout.readline().strip()
        if not address:
            raise RuntimeError("scaleout's PMI server for this job did not start")
        store.set(f"{prefix}address", address)
    else:
        address = store.get(f"{prefix}address").decode()
    host, port = address.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)))
    # MPI owns the descriptor from now on: no Python object may close it (MPI_Finalize speaks
    # over it after the interpreter has collected its objects).
    fd = connection.detach()
    os.set_inheritable(fd, False)
    os.environ.update({"PMI_FD": str(fd), "PMI_RANK": str(rank), "PMI_SIZE": str(size)})
