"""MPI for ranks that no MPI launcher started (torchrun, Ray, or processes given torch's
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE): Note [PMI bootstrap].

Note [PMI bootstrap]
An MPI library learns its job from the launcher that started it; a process that torchrun (or
Ray, or a shell) started has none, and MPI_Init makes it a world of one: N such processes would
train N models (Note [No silent singletons]), and two MPICH singletons cannot connect to each
other either. What they share is torch's key-value store (TCPStore at MASTER_ADDR:MASTER_PORT,
which torchrun's agent or rank 0 serves). So before MPI_Init, each rank writes its host name and
address to the store; rank 0 reads them all (and removes them), starts a PMI-1 server
(scaleout/_pmi_server.py, a child process) told the ranks' placement (PMI_process_mapping, so
that the MPI library and scaleout see which ranks share a machine), and puts its address in the
store; every rank connects to it and hands the connection to MPI as Hydra and srun's pmi2
plugin do: PMI_FD, PMI_RANK, PMI_SIZE. MPI_Init then speaks PMI-1 over it and the ranks form
one world; once it has, rank 0 removes the address, and every rank the PMI variables (a child
process must not read them). The server ends the job's connections when a rank dies before
finalizing (ranks in MPI_Init then fail instead of waiting), and exits when every rank has
finalized. The libraries that read PMI_FD are MPICH's and Intel MPI's (tested) and MVAPICH's
(not tested); others (Open MPI reads PMIx) are refused before MPI starts, saying to start the
job with scaleoutrun or the MPI's launcher. torchrun's workers inherit the variables of a
launcher that started torchrun itself (srun, mpiexec): under torchrun those are not theirs, and
are removed. The keys carry torchrun's restart count and are removed once read, and a rank
that finds a server gone (a key a failed round left) reads the key again for a while, so a
restarted worker group does not join the last one's server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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
# The PMI client's variables that an outer launcher leaves to torchrun's workers.
_INHERITED_PREFIXES = ("PMI_", "PMIX_")
_INHERITED = ("MPI_LOCALRANKID",)
# The families whose library reads PMI_FD: MPICH's own client (MVAPICH's too, untested).
_PMI1_FAMILIES = ("MPICH", "Intel MPI", "MVAPICH")

_SERVER = Path(__file__).resolve().parent / "_pmi_server.py"
_server: Optional[subprocess.Popen] = None
_keep: List[Any] = []  # rank 0's end of the pipe its server watches: open while rank 0 lives
_joined: Optional[tuple] = None  # (store, address key, rank) once this process bootstrapped


def wanted(environ: Mapping[str, str], size: Optional[int] = None) -> bool:
    """Whether this process must join its job through torch's store: a job of more than one
    process (`size`, else torch's RANK and WORLD_SIZE) and no MPI launcher of its own (under
    torchrun, an outer launcher's variables are inherited, not its own)."""
    if size is None:
        world = environ.get("WORLD_SIZE", "")
        if not (world.isdigit() and environ.get("RANK", "").isdigit()):
            return False
        size = int(world)
    if size <= 1:
        return False
    if environ.get("TORCHELASTIC_RUN_ID"):
        return True
    if any(environ.get(name) for name in _LAUNCHED):
        return False
    return all(name == "WORLD_SIZE" for name, _, _ in _mpi_library.launcher_sizes(environ))


def bootstrapped() -> bool:
    return _joined is not None


def from_torch_agent(environ: Mapping[str, str] = os.environ) -> None:
    """scaleout.init() in a process that torchrun started: joins the job through the store that
    torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE). Elsewhere (processes given torch's
    variables by hand, whose store init_process_group creates) it does nothing, and init()
    refuses the job of one that MPI makes, saying what to do."""
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


def _route(address: str) -> str:
    """This machine's address on the route to `address` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        return s.getsockname()[0]


def _own_address(environ: Mapping[str, str]) -> str:
    """An address of this machine that others can reach: the one on the route to the store's
    host, else the host name's."""
    try:
        if environ.get("MASTER_ADDR"):
            found = _route(socket.gethostbyname(environ["MASTER_ADDR"]))
            if not found.startswith("127."):
                return found
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _refuse_other_mpis() -> None:
    library = _mpi_library.probe()
    if library.abi == "openmpi" or library.family not in _PMI1_FAMILIES:
        raise MPIMismatchError(
            f"this process was started without an MPI launcher (torchrun, Ray, or torch's "
            f"RANK and WORLD_SIZE given by hand), and its MPI is {library}: scaleout starts "
            "such ranks over PMI-1, which MPICH's and Intel MPI's libraries read and this one "
            "does not. Start the job with scaleoutrun (or the MPI's own launcher), or install "
            "MPICH (`pip install mpich`) for mpi4py and scaleout"
        )


def bootstrap(store: Any, rank: int, size: int, environ: Mapping[str, str] = os.environ) -> None:
    """Joins this process to its job before MPI_Init (Note [PMI bootstrap]). `store` is a
    torch.distributed Store shared by the job's processes."""
    global _server, _joined
    if "mpi4py.MPI" in sys.modules:
        raise MPIMismatchError(
            "mpi4py.MPI was imported before scaleout could start MPI for a job without an MPI "
            "launcher (torchrun, Ray, or torch's RANK and WORLD_SIZE): its MPI_Init made this "
            "process a job of one. Import mpi4py.MPI only after init_process_group('scaleout') "
            "or scaleout.init()"
        )
    _refuse_other_mpis()
    for name in list(os.environ):
        if name.startswith(_INHERITED_PREFIXES) or name in _INHERITED:
            del os.environ[name]
    prefix = f"scaleout/pmi/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(f"{prefix}host/{rank}", f"{socket.gethostname()} {_own_address(environ)}")
    key = f"{prefix}address"
    if rank == 0:
        places = []
        for r in range(size):
            places.append(store.get(f"{prefix}host/{r}").decode().split(" ", 1))
            try:
                store.delete_key(f"{prefix}host/{r}")
            except Exception:  # noqa: BLE001  (a store without deletion: keys stay)
                pass
        hosts = [host for host, _ in places]
        local = len(set(hosts)) == 1
        advertise = "127.0.0.1"
        if not local:
            remote = next(addr for host, addr in places if host != hosts[0])
            advertise = _route(remote) if not remote.startswith("127.") else remote
            if advertise.startswith("127."):
                raise RuntimeError(
                    f"scaleout cannot tell which address the other machines reach rank 0 by "
                    f"(rank 0's host {hosts[0]}; another rank's host "
                    f"{next(h for h in hosts if h != hosts[0])} gave {remote}): their host "
                    "names resolve to loopback addresses; give MASTER_ADDR as an address "
                    "every machine reaches"
                )
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
                advertise,
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
        store.set(key, address)
        connection = _connect(address)
    else:
        connection = None
        for _ in range(40):  # a server a failed round left: its key is replaced soon
            address = store.get(key).decode()
            try:
                connection = _connect(address)
                break
            except ConnectionRefusedError:
                time.sleep(0.25)
        if connection is None:
            raise RuntimeError(
                f"scaleout's PMI server at {address} (from torch's store) refused every "
                "connection for 10 s: rank 0 did not start one for this job"
            )
    # MPI owns the descriptor from now on: no Python object may close it (MPI_Finalize speaks
    # over it after the interpreter has collected its objects).
    fd = connection.detach()
    os.set_inheritable(fd, False)
    os.environ.update({"PMI_FD": str(fd), "PMI_RANK": str(rank), "PMI_SIZE": str(size)})
    _joined = (store, key, rank)


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=30)
    connection.settimeout(None)  # blocking again: MPI's client reads it so
    return connection


def after_init() -> None:
    """Once MPI_Init has joined every rank: rank 0 removes the server's address from the store,
    and the PMI variables leave this process's environment (its children must not read them)."""
    if _joined is None:
        return
    store, key, rank = _joined
    for name in ("PMI_FD", "PMI_RANK", "PMI_SIZE"):
        os.environ.pop(name, None)
    if rank == 0:
        try:
            store.delete_key(key)
        except Exception:  # noqa: BLE001
            pass
