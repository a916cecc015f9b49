"""Loads the native core (a plain shared library, through ctypes) and declares its C ABI.

The core links against libmpi; mpi4py is imported first so that the MPI library it loaded is
the one the core binds to (one MPI instance per process).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path

from scaleout._errors import MPINotFoundError, ScaleoutError

EXPECTED_ABI_VERSION = 1

_lock = threading.Lock()
_lib = None

_c = ctypes
_SIGNATURES = {
    "so_abi_version": ([], _c.c_int),
    "so_version": ([], _c.c_char_p),
    "so_build_info": ([], _c.c_char_p),
    "so_status_name": ([_c.c_int], _c.c_char_p),
    "so_dtype_name": ([_c.c_int], _c.c_char_p),
    "so_last_error": ([], _c.c_char_p),
    "so_init": ([_c.c_int, _c.c_int64], _c.c_int),
    "so_shutdown": ([], _c.c_int),
    "so_is_initialized": ([], _c.c_int),
    "so_topology": ([_c.POINTER(_c.c_int32)], _c.c_int),
    "so_config_string": ([], _c.c_char_p),
    "so_enqueue": ([_c.c_char_p, _c.c_int, _c.c_int, _c.c_int, _c.c_void_p, _c.c_void_p,
                    _c.c_void_p, _c.c_int, _c.c_int, _c.c_double, _c.c_double, _c.c_void_p,
                    _c.c_int, _c.POINTER(_c.c_int64)], _c.c_int),
    "so_poll": ([_c.c_int64, _c.POINTER(_c.c_int)], _c.c_int),
    "so_wait": ([_c.c_int64, _c.c_double], _c.c_int),
    "so_result_shape": ([_c.c_int64, _c.POINTER(_c.c_int), _c.POINTER(_c.c_int64)], _c.c_int),
    "so_result_copy": ([_c.c_int64, _c.c_void_p, _c.c_int64], _c.c_int),
    "so_result_splits": ([_c.c_int64, _c.POINTER(_c.c_int64), _c.c_int], _c.c_int),
    "so_result_join_rank": ([_c.c_int64, _c.POINTER(_c.c_int32)], _c.c_int),
    "so_release": ([_c.c_int64], _c.c_int),
}


def library_path() -> Path:
    here = Path(__file__).resolve().parent
    found = sorted(glob.glob(str(here / "_scaleout_core*.so")))
    if not found:
        raise ScaleoutError(
            f"scaleout's native core is not built (no _scaleout_core*.so in {here}). "
            "Install scaleout with `pip install .` (or `pip install -e .`) from its source tree.")
    return Path(found[0])


def _import_mpi():
    try:
        from mpi4py import MPI  # noqa: F401  (loads and initialises libmpi)
    except ImportError as exc:
        raise MPINotFoundError(
            f"scaleout needs an MPI and mpi4py, and importing mpi4py.MPI failed: {exc}. "
            "Install them with `pip install mpich mpi4py` (no system MPI needed), or load your "
            "cluster's MPI module and `pip install --no-binary mpi4py mpi4py`.") from exc
    return MPI


def library():
    """The loaded core, with argument and result types declared. Loaded once per process."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        _import_mpi()
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise MPINotFoundError(
                f"could not load scaleout's native core {path.name}: {exc}. The core was built "
                "against an MPI library that this environment does not provide. Install the "
                "MPICH wheel (`pip install mpich`), or rebuild scaleout against your MPI with "
                "SCALEOUT_MPICXX=/path/to/mpicxx pip install --no-build-isolation .") from exc
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = restype
        abi = lib.so_abi_version()
        if abi != EXPECTED_ABI_VERSION:
            raise ScaleoutError(f"native core ABI {abi} does not match the Python package's "
                                f"{EXPECTED_ABI_VERSION}; reinstall scaleout")
        _lib = lib
        return lib


def text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def build_info() -> dict:
    """What --check-build prints: the core's version and the MPI it was built against."""
    lib = library()
    return {"version": text(lib.so_version()), "build": text(lib.so_build_info()),
            "library": str(library_path())}
