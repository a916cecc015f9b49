"""The one way from Python into the native library: loading it, the tables of codes, and the
submit API that every front end (numpy in scaleout._ops, scaleout.torch, scaleout.tensorflow) uses.

Rule: the framework shims use only public names (no leading underscore) of this module, of
scaleout._arrays and of scaleout._ops; tests/test_one_path.py reads their sources and checks it.
A new argument of every collective (a process set, say) is added here once: `submit` is the one
function in the package that calls the binding's submit.

A front end turns its tensor into (dtype code, shape, address, the object that owns the memory)
and calls `submit` with the collective, name, op, root, scale factors and where the result goes,
as keyword arguments (one request record); it gets back a `Handle`, and `synchronize` (or
`wait_all`) completes it the same way for every front end: wait without the GIL, raise the error
of the collective on every rank, allocate and fill core-owned results, apply the front end's
`finish`. Codes and names come from the C header's tables through the binding
(native/python/binding.c), so they cannot disagree with the core.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from scaleout import _binding, _errors, _mpi_library
from scaleout._errors import InvalidArgumentError, MPINotFoundError, ScaleoutError

__all__ = [
    "DTYPE_CODES",
    "OP_NAMES",
    "COLLECTIVE_CODES",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "ALLREDUCE",
    "ALLGATHER",
    "BROADCAST",
    "ALLTOALL",
    "REDUCESCATTER",
    "BARRIER",
    "JOIN",
    "Handle",
    "submit",
    "synchronize",
    "poll",
    "wait_all",
    "group",
    "auto_name",
    "resolve_op",
    "register_tensor_type",
    "ensure_loaded",
    "library_path",
    "build_info",
    "mpi_library",
    "mpi_shims",
]

# ---- the tables (from native/c_api/scaleout.h) ----

DTYPE_CODES = {name: code for name, code, _ in _binding.DTYPES}  # "float32" -> 7
_OPS = dict(_binding.REDUCE_OPS)  # "Average" -> 0
OP_NAMES = {code: name for name, code in _OPS.items()}
Average, Sum, Min, Max, Product, Adasum = (
    _OPS[k] for k in ("Average", "Sum", "Min", "Max", "Product", "Adasum")
)
COLLECTIVE_CODES = dict(_binding.COLLECTIVES)  # "allreduce" -> 0
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = (
    COLLECTIVE_CODES[k]
    for k in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join")
)

# Every error the binding raises is made by one factory (scaleout._errors.from_core).
_binding.register_errors(_errors.from_core)

# ---- loading ----

_load_lock = threading.Lock()
_loaded = False


def library_path() -> Path:
    here = Path(__file__).resolve().parent
    found = sorted(glob.glob(str(here / "_scaleout_core*.so")))
    if not found:
        raise ScaleoutError(
            f"scaleout's native core is not built (no _scaleout_core*.so in {here}). "
            "Install scaleout with `pip install .` (or `pip install -e .`) from its source tree."
        )
    return Path(found[0])


def mpi_shims() -> dict[str, Path]:
    """{ABI: shim} of the MPI shims this installation has (Note [One core, a shim per MPI
    ABI] in native/mpi/so_mpi.h)."""
    here = Path(__file__).resolve().parent
    shims = {}
    for abi in _mpi_library.ABIS:
        found = sorted(glob.glob(str(here / f"_scaleout_mpi_{abi}*.so")))
        if found:
            shims[abi] = Path(found[0])
    return shims


_mpi: Optional[_mpi_library.MpiLibrary] = None
_shim_built_with = ""


def mpi_library() -> _mpi_library.MpiLibrary:
    """The MPI library this process uses (loads it, with mpi4py, when nothing has yet)."""
    ensure_loaded()
    assert _mpi is not None
    return _mpi


def _shim_for(library: _mpi_library.MpiLibrary) -> Path:
    shims = mpi_shims()
    if library.abi in shims and library.abi_supported:
        return shims[library.abi]
    have = (
        ", ".join(f"{abi} ({_mpi_library.ABI_LIBRARIES[abi]})" for abi in shims)
        or "none (the installation is broken: reinstall scaleout)"
    )
    raise MPINotFoundError(
        f"mpi4py loaded {library}, an MPI of the {library.abi_description} ABI, and this scaleout "
        f"installation has shims for: {have}. {_mpi_library.SUPPORTED}. Use an MPI of a "
        "supported ABI (make mpi4py load it: MPI4PY_LIBMPI or your cluster's MPI module), or "
        "build scaleout from source against this one (SCALEOUT_MPICXX=/path/to/its/mpicxx pip "
        "install --no-build-isolation .)."
    )


def set_mpi_environment() -> None:
    """Sets, unless the user did, what the MPI library reads at MPI_Init and scaleout's liveness
    needs (Notes [Intel MPI and dead peers], [Open MPI under srun], [MPICH under srun]). Called
    before scaleout imports mpi4py.MPI; a program that imports it first (tests/mp/_harness.py)
    calls it itself."""
    # Note [Intel MPI and dead peers]
    # Intel MPI 2021 moves large messages between the ranks of a machine by cross-memory
    # attach (process_vm_readv); when the peer has died (Note [Liveness]) the survivor's
    # MPI_Test fails an internal assertion (cma_read_nbytes == size) and aborts the process,
    # instead of letting scaleout name the dead rank. Without CMA it copies through shared
    # memory and the survivor stays (tests/test_liveness.py passes on Intel MPI only so).
    # scaleout's own shared-memory collectives carry a machine's traffic, so the cost is
    # small; the variable is read at MPI_Init, set here unless the user set it (scaleoutrun
    # sets it for every rank, for programs that import mpi4py.MPI first).
    os.environ.setdefault("I_MPI_SHM_CMA", "0")
    os.environ.update(_mpi_library.open_mpi_environment(os.environ, sys.prefix))
    os.environ.update(_mpi_library.mpich_environment(os.environ, sys.prefix))


def ensure_loaded() -> None:
    """Loads the core once per process, with the MPI shim for the library mpi4py loaded, so
    both use the same MPI."""
    global _loaded, _mpi, _shim_built_with
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        set_mpi_environment()
        try:
            from mpi4py import MPI  # noqa: F401  (loads and initialises libmpi)
        except ImportError as exc:
            raise MPINotFoundError(
                f"scaleout needs an MPI and mpi4py, and importing mpi4py.MPI failed: {exc}. "
                "Install them with `pip install mpich mpi4py` (no system MPI needed), or load "
                "your cluster's MPI module and `pip install --no-binary mpi4py mpi4py`."
            ) from exc
        where = _mpi_library.loaded()
        if where is None:
            raise MPINotFoundError(
                "mpi4py.MPI is imported, but no MPI library (libmpi*.so) is mapped in this "
                "process: scaleout cannot tell which MPI to use"
            )
        library = _mpi_library.describe(where)
        shim = _shim_for(library)
        path = library_path()
        try:
            _binding.load(str(path))
            _, _shim_built_with = _binding.load_mpi(str(shim))
        except OSError as exc:
            raise MPINotFoundError(
                f"could not load scaleout's native core for {library}: {exc}. Reinstall "
                "scaleout, or rebuild it against your MPI with "
                "SCALEOUT_MPICXX=/path/to/mpicxx pip install --no-build-isolation ."
            ) from exc
        _mpi = library
        _loaded = True


def build_info() -> dict:
    """What --check-build prints: the core's version and compiler, the MPI library in use and
    the shims installed."""
    library = mpi_library()
    shims = mpi_shims()
    return {
        "version": _binding.version(),
        "build": _binding.build_info(),
        "library": str(library_path()),
        "mpi": str(library),
        "mpi_abi": library.abi,
        "mpi_shim": f"{shims[library.abi].name} (built with {_shim_built_with})",
        "mpi_shims": sorted(shims),
    }


# ---- submitting and completing ----

# A pending collective: pass it to poll() or synchronize().
Handle = _binding.Handle


# submit(collective, *, name, data=None, address=None, dtype=None, shape=None, output=None,
#        out_address=None, op=Average, root_rank=0, prescale_factor=1.0, postscale_factor=1.0,
#        splits=None, finish=None, process_set=0) -> Handle
# Submits one collective (a request record: every field by name) and returns its Handle.
#
# - data owns the input memory and is kept alive until completion. With address None it is
#   read as a registered tensor type or through the buffer protocol (dtype and shape then come
#   from it; BufferError when the core cannot take it as it is), else address, dtype (a
#   DTYPE_CODES value) and shape (a tuple) describe it.
# - output: allreduce/broadcast: the result object (data itself for in place), at out_address
#   or, with None, at a registered tensor's data_ptr() or through its buffer;
#   allgather/alltoall/reducescatter: alloc(shape, buffer) -> object, called at completion;
#   None for barrier and join.
# - splits: alltoall's rows per rank, a C-contiguous int64 buffer, or None.
# - finish(result) -> what synchronize returns, or None. alltoall's result is (received,
#   received_splits list); join's is the last rank to join.
# - name None generates "<kind>.noname.<n>" (see auto_name).
# - process_set: the core's id of the set (0: the global set).
# The binding checks the values as given (a float root rank is an error, not truncated). This is
# the binding's own function, with every field passed by keyword (Note [Request record]): no
# Python frame in between, since this is every collective's path.
submit: Callable[..., Handle] = _binding.submit


# register_tensor_type(cls, {dtype object: DTYPE_CODES value}, strided_layout): submit then
# reads an instance of cls given with address None itself (dtype, is_cpu, layout,
# is_contiguous(), data_ptr(), shape), and raises BufferError when the core cannot take it as it
# is. For a framework whose tensors have no buffer protocol (torch), on its hot path.
register_tensor_type: Callable[[type, dict, Any], None] = _binding.register_tensor_type

# allreduce_now(tensor, average, name, op, prescale_factor, postscale_factor, process_set) ->
# allreduce_'s result, or NotImplemented where the general path must run (Note [Synchronous
# allreduce_]); allreduce_async_now, the same arguments -> allreduce_async_'s Handle, or
# NotImplemented; set_fast_path(array type, global process set, op codes) says what they take.
allreduce_now: Callable[..., Any] = _binding.allreduce_now
allreduce_async_now: Callable[..., Any] = _binding.allreduce_async_now
set_fast_path: Callable[[type, Any, Any], None] = _binding.set_fast_path

# synchronize(handle) -> result: waits (without the GIL; Ctrl-C interrupts and leaves the handle
# pending), raises the collective's error on every rank, returns the result.
synchronize: Callable[[Handle], Any] = _binding.synchronize
# poll(handle) -> True when the collective has completed.
poll: Callable[[Handle], bool] = _binding.poll
# wait_all(handles) -> results: waits for every handle, then raises the first error, if any.
wait_all: Callable[[Sequence[Handle]], list] = _binding.wait_all
# group(handles, name) -> Handle whose result is the list of the members' results.
group: Callable[[Sequence[Handle], str], Handle] = _binding.group


def auto_name(collective: int, name: Optional[str], process_set: int = 0) -> str:
    """The given name (checked), or the next generated one for this kind of collective on this
    process set: ranks that call unnamed collectives in the same order agree on their names (as
    with Horovod)."""
    return _binding.auto_name(collective, name, process_set)


def resolve_op(op: Optional[int], average: Optional[bool] = None) -> int:
    """The reduce op from Horovod's `op=` and its deprecated `average=` (default Average)."""
    if average is not None:
        if op is not None:
            raise InvalidArgumentError("pass either op or the deprecated average, not both")
        return Average if average else Sum
    if op is None:
        return Average
    if op not in OP_NAMES:
        raise InvalidArgumentError(
            f"unknown reduce op {op!r}; use scaleout.Average, Sum, Min, Max, Product or Adasum"
        )
    return int(op)
