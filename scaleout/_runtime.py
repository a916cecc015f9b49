"""Process-level state: starting and stopping the runtime, the rank layout, config(), stats and
the timeline.

The public init() is scaleout._process_set_registry's: after `start` it registers the process
sets given to init, which runs a collective (a layer above this one)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional

from scaleout import _binding, _mpi_library, _native, _pmi_bootstrap
from scaleout._errors import InvalidArgumentError, MPIMismatchError, NotInitializedError

__all__ = [
    "start",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_threads_supported",
    "mpi_built",
    "config",
    "placement",
    "mpi_enabled",
    "gloo_enabled",
    "nccl_built",
    "cuda_built",
    "rocm_built",
    "gloo_built",
    "ccl_built",
    "ddl_built",
    "is_homogeneous",
    "start_timeline",
    "stop_timeline",
    "stats",
]

_state_lock = threading.Lock()
_topology: Optional[tuple] = None
_atexit_registered = False


def _signed(handle: int) -> int:
    """mpi4py gives a handle's bits as an unsigned integer (an MPICH communicator, an int, sign
    extended); the core takes them as an int64."""
    return handle - (1 << 64) if handle >= 1 << 63 else handle


def _comm_handle(comm: Any) -> Optional[int]:
    """The C handle of the communicator to run on (None: MPI_COMM_WORLD)."""
    if comm is None:
        return None
    from mpi4py import MPI

    if isinstance(comm, MPI.Comm):
        return _signed(comm.handle)
    if isinstance(comm, (list, tuple)):
        ranks = [int(r) for r in comm]
        group = MPI.COMM_WORLD.Get_group().Incl(ranks)
        sub = MPI.COMM_WORLD.Create_group(group) if MPI.COMM_WORLD.rank in ranks else None
        if sub is None or sub == MPI.COMM_NULL:
            raise ValueError(
                f"init(comm={ranks}): this process (world rank "
                f"{MPI.COMM_WORLD.rank}) is not in the list"
            )
        return _signed(sub.handle)
    raise TypeError(
        f"init(comm=...) takes an mpi4py communicator or a list of ranks, not {type(comm).__name__}"
    )


def start(comm: Any = None) -> bool:
    """init()'s first part, on every rank (collective): loads the native library and starts the
    runtime on `comm` (see init). Returns False, doing nothing, when it runs already."""
    global _topology, _atexit_registered
    if _pmi_bootstrap.wanted(os.environ) and not _pmi_bootstrap.bootstrapped():
        _pmi_bootstrap.from_torch_agent()  # Note [PMI bootstrap]
    _native.ensure_loaded()
    with _state_lock:
        if _binding.is_initialized():
            return False
        _binding.init(_comm_handle(comm))
        _refuse_a_singleton()
        _pmi_bootstrap.after_init()
        _topology = _binding.topology()
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    return True


def _refuse_a_singleton() -> None:
    """Note [No silent singletons]: right after the core started (its collectives in a world of
    1 wait for nobody), before the user's first."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    if size == 1 and _pmi_bootstrap.bootstrapped():
        _binding.shutdown()
        raise MPIMismatchError(
            f"this process joined its job of {os.environ.get('PMI_SIZE')} through torch's store "
            f"(Note [PMI bootstrap]), but its MPI, {_native.mpi_library()}, started it as a job "
            "of 1: that library does not read PMI-1's PMI_FD. Start the job with scaleoutrun or "
            "the MPI's own launcher"
        )
    error = _mpi_library.singleton_error(size, _native.mpi_library(), os.environ)
    if error:
        _binding.shutdown()
        raise MPIMismatchError(error)


def shutdown() -> None:
    """Stops scaleout on this rank; pending operations fail with ShutDownError. Idempotent;
    init() may be called again afterwards."""
    global _topology
    with _state_lock:
        if _topology is not None and os.environ.get("SCALEOUT_STATS", "0") not in ("", "0"):
            print(stats_line(), file=sys.stderr, flush=True)
        _binding.shutdown()
        _topology = None


def stats_line() -> str:
    """One line of this rank's traffic (what SCALEOUT_STATS=1, scaleoutrun --stats, prints at
    shutdown): per collective kind that ran, calls, bytes submitted, written to shared memory,
    handed to MPI, and the time reducing and waiting."""

    def size(n: float) -> str:
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= scale:
                return f"{n / scale:.1f} {unit}"
        return f"{int(n)} B"

    parts = [
        f"{kind} {c['calls']} calls, {size(c['bytes'])} submitted, {size(c['shm_bytes'])} "
        f"to shared memory, {size(c['mpi_bytes'])} to MPI, reduce {c['reduce_seconds']:.3f} "
        f"s, wait {c['wait_seconds']:.3f} s"
        for kind, c in traffic().items()
        if c["calls"]
    ]
    return f"scaleout stats, rank {rank()}: " + ("; ".join(parts) or "no collectives")


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing the timeline (a Chrome trace, see SCALEOUT_TIMELINE) to `file_path` on
    rank 0, as Horovod's start_timeline; a timeline being written is closed first. Call it on
    every rank (only rank 0 writes). `mark_cycles`: mark each coordinator step that executed
    collectives. Unlike Horovod, SCALEOUT_TIMELINE=DYNAMIC (HOROVOD_TIMELINE=DYNAMIC) is not
    required beforehand; it is accepted and means "no timeline until start_timeline()"."""
    if not isinstance(file_path, (str, bytes)) or not file_path:
        raise InvalidArgumentError(
            f"start_timeline: file_path must be a non-empty path, not {file_path!r}"
        )
    _topo()
    path = file_path.decode() if isinstance(file_path, bytes) else str(file_path)
    _binding.timeline(path, bool(mark_cycles))


def stop_timeline() -> None:
    """Stops the timeline started by start_timeline (or SCALEOUT_TIMELINE) and closes its file,
    which is then complete JSON. Returns when the file is closed; does nothing if none is open."""
    _topo()
    _binding.timeline(None, False)


# Counters of the layers above (local SGD's rounds, ...): stats()[name] is source().
_stats_sources: Dict[str, Callable[[], dict]] = {}


def add_stats(name: str, source: Callable[[], dict]) -> None:
    """Reports `source()` in stats() under `name` (for the modules above this one)."""
    _stats_sources[name] = source


def stats() -> dict:
    """This rank's bookkeeping: ``handles`` (issued by the core and not yet released: a handle
    is released when its result is taken) and ``names_in_flight`` (collectives submitted and
    not complete), both 0 when nothing is pending; and ``collectives``: per kind
    (``"allreduce"``, ...), since init, ``calls``, ``bytes`` (of the tensors this rank
    submitted), ``shm_bytes`` (written into its shared-memory staging areas for the other
    ranks), ``mpi_bytes`` (handed to MPI to send), ``reduce_seconds`` (in scaleout's own
    reduction kernels) and ``wait_seconds`` (waiting for other ranks). And ``local_sgd``: the
    model-averaging rounds of every LocalSGDOptimizer of this process since it started, by
    scope (``"all"``: over the whole process set; ``"host"``: inside this machine), each with
    ``rounds``, ``bytes`` (of the parameters and buffers this rank averaged) and ``waits``
    (rounds a rank waited for, with bounded staleness)."""
    _topo()
    handles, names = _binding.stats()
    out = {"handles": handles, "names_in_flight": names, "collectives": traffic()}
    for name, source in _stats_sources.items():
        out[name] = source()
    return out


def traffic() -> dict:
    """stats()["collectives"] (Note [Traffic] in the core)."""
    rows = _binding.traffic()
    out = {}
    for collective, code in _binding.COLLECTIVES:
        if collective in ("barrier", "join"):
            continue
        counters = {}
        for field, index in _binding.TRAFFIC:
            value = rows[code][index]
            if field.endswith("_ns"):
                counters[field[:-3] + "_seconds"] = value / 1e9
            else:
                counters[field] = value
        out[collective] = counters
    return out


def is_initialized() -> bool:
    return _binding.is_initialized()


def _topo() -> tuple:
    topo = _topology
    if topo is None:
        raise NotInitializedError("scaleout is not initialized: call scaleout.init() first")
    return topo


def rank() -> int:
    return _topo()[0]


def size() -> int:
    return _topo()[1]


def local_rank() -> int:
    return _topo()[2]


def local_size() -> int:
    return _topo()[3]


def cross_rank() -> int:
    return _topo()[4]


def cross_size() -> int:
    return _topo()[5]


def mpi_built() -> bool:
    return True


def mpi_enabled() -> bool:
    """The job runs over MPI (always, for scaleout)."""
    return True


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def gloo_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks (Horovod's definition)."""
    return size() == local_size() * cross_size()


def cuda_built() -> bool:
    """GPU tensors are not supported yet."""
    return False


def rocm_built() -> bool:
    return False


def mpi_threads_supported() -> bool:
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def config() -> dict:
    """The core's effective configuration, as it read it at init: for every setting,
    ``config()["SCALEOUT_X"]`` is its value and ``config()["SCALEOUT_X.source"]`` the variable
    that value came from: ``SCALEOUT_X``, its Horovod twin (``HOROVOD_X``, read when
    ``SCALEOUT_X`` is not set), or ``default``."""
    _topo()
    text = _binding.config_string()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def placement() -> dict:
    """Where this rank runs: the CPUs it computes on (from the operating system), the CPUs its
    endpoint servers are pinned to, how many servers there are, and the compute threads."""
    import os

    cfg = config()
    ep_cores = [int(c) for c in cfg.get("SCALEOUT_EP_CORES", "").split(",") if c]
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("SCALEOUT_COMPUTE_THREADS")
    return {
        "rank": rank(),
        "local_rank": local_rank(),
        "compute_cores": sorted(os.sched_getaffinity(0)),
        "endpoint_servers": int(cfg.get("SCALEOUT_EP_SERVERS", "1")),
        "endpoint_cores": ep_cores,
        "threads": int(threads) if threads else None,
    }
