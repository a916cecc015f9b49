"""scaleoutrun --check-build: what this installation can do, without starting a job."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional, TextIO

__all__ = ["framework_versions", "check_build"]

# Framework -> distributions that provide it (the first installed one gives the version).
FRAMEWORKS = {
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"),
    "keras": ("keras",),
}


def framework_versions() -> dict[str, Optional[str]]:
    """Each framework's version, or None when it cannot be imported. Nothing is imported:
    importing TensorFlow alone takes seconds and prints warnings."""
    from importlib import metadata  # noqa: PLC0415  (50 ms: here, not in every launch)

    found: dict[str, Optional[str]] = {}
    for module, distributions in FRAMEWORKS.items():
        try:
            importable = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            importable = False
        version = None
        if importable:
            version = "unknown version"
            for name in distributions:
                try:
                    version = metadata.version(name)
                    break
                except metadata.PackageNotFoundError:
                    continue
        found[module] = version
    return found


def _default_build_info() -> dict:
    from scaleout import _native  # noqa: PLC0415  (loads the core and MPI: only here)

    return _native.build_info()


def _mpi_library_version() -> str:
    try:
        from mpi4py import MPI  # noqa: PLC0415  (already loaded by the core)

        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # noqa: BLE001  (informational only)
        return "unknown"


def check_build(
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    build_info: Callable[[], dict] = _default_build_info,
    launcher: Optional[str] = None,
    launcher_problem: Optional[str] = None,
) -> int:
    """Prints the report; 0 when the core and its MPI load, 1 (with the reason) when not or
    when the launcher found belongs to another MPI (launcher_problem)."""
    try:
        info = build_info()
    except Exception as exc:  # noqa: BLE001  (ScaleoutError, MPINotFoundError, ImportError)
        print(f"scaleoutrun: the scaleout core cannot be loaded: {exc}", file=err)
        return 1
    print(f"scaleout core:   {info.get('version', 'unknown')}", file=out)
    print(f"built with:      {info.get('build', 'unknown')}", file=out)
    print(f"core library:    {info.get('library', 'unknown')}", file=out)
    print(f"MPI loaded:      {_mpi_library_version()}", file=out)
    shown = launcher or ("none that fits (see below)" if launcher_problem else "not found")
    print(f"MPI launcher:    {shown}", file=out)
    print(f"Python:          {sys.version.split()[0]} ({sys.executable})", file=out)
    print(f"CPUs available:  {len(os.sched_getaffinity(0))}", file=out)
    print("frameworks:", file=out)
    for name, version in framework_versions().items():
        print(f"  {name:<12} {version if version else 'not installed'}", file=out)
    if launcher_problem:
        print(f"scaleoutrun: {launcher_problem}", file=err)
        return 1
    return 0
