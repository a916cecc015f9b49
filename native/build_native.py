"""Compiles the native core with the MPI's C++ compiler wrapper.

Used by setup.py (the shared library) and by the native unit tests (a test executable). Kept
free of setuptools so both can call it.

Which MPI: SCALEOUT_MPICXX (a compiler wrapper such as Open MPI's or Intel MPI's mpicxx) or
MPICXX when set; otherwise the first of mpicxx, mpic++, mpiCC on PATH, which is the `mpich`
wheel's wrapper in a virtual environment that has it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent
CXXFLAGS = [
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-fvisibility=hidden",
    "-pthread",
]


class BuildError(RuntimeError):
    pass


def find_mpicxx() -> str:
    for var in ("SCALEOUT_MPICXX", "MPICXX"):
        value = os.environ.get(var)
        if value:
            found = shutil.which(value)
            if not found:
                raise BuildError(f"{var}={value!r} is not an executable compiler wrapper")
            return found
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    for name in ("mpicxx", "mpic++", "mpiCC"):
        found = shutil.which(name, path=search)
        if found:
            return found
    raise BuildError(
        "no MPI C++ compiler wrapper found (looked for mpicxx, mpic++, mpiCC on PATH and beside "
        f"{sys.executable}). Install the MPICH wheel with `pip install mpich`, or point "
        "SCALEOUT_MPICXX at your MPI's wrapper (e.g. SCALEOUT_MPICXX=/opt/openmpi/bin/mpicxx)."
    )


def mpi_description(mpicxx: str) -> str:
    """One line naming the MPI behind the wrapper, for so_build_info()."""
    for probe in (["-show"], ["--showme"], ["-showme"]):
        try:
            out = subprocess.run([mpicxx, *probe], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip():
            break
    prefix = Path(mpicxx).resolve().parent.parent
    version = ""
    mpichversion = prefix / "bin" / "mpichversion"
    if mpichversion.exists():
        res = subprocess.run([str(mpichversion), "-v"], capture_output=True, text=True)
        version = " ".join(res.stdout.split()).replace("MPICH Version:", "MPICH")
    ompi_info = prefix / "bin" / "ompi_info"
    if not version and ompi_info.exists():
        res = subprocess.run([str(ompi_info), "--version"], capture_output=True, text=True)
        version = res.stdout.strip().splitlines()[0] if res.stdout.strip() else "Open MPI"
    return f"{version or 'MPI'} via {mpicxx}"


def core_sources() -> list[Path]:
    """Every .cc of the core except the unit tests."""
    return sorted(
        p for p in NATIVE_DIR.rglob("*.cc") if "tests" not in p.relative_to(NATIVE_DIR).parts
    )


def test_sources() -> list[Path]:
    return sorted((NATIVE_DIR / "tests").glob("*.cc"))


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"command failed: {shlex.join(cmd)}\n{res.stdout}{res.stderr}")


def build(
    output: Path,
    build_dir: Path,
    *,
    shared: bool,
    extra_sources: list[Path] = (),
    defines: dict[str, str] | None = None,
    jobs: int | None = None,
) -> Path:
    """Compiles the core (plus extra_sources) into a shared library or an executable."""
    mpicxx = find_mpicxx()
    build_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    defines = dict(defines or {})
    defines.setdefault("SCALEOUT_BUILD_INFO", mpi_description(mpicxx))
    flags = CXXFLAGS + [f"-I{NATIVE_DIR}"]
    flags += [f"-D{k}={_c_string(v)}" for k, v in defines.items()]
    sources = core_sources() + list(extra_sources)
    objects = []
    commands = []
    for src in sources:
        rel = src.relative_to(NATIVE_DIR) if src.is_relative_to(NATIVE_DIR) else Path(src.name)
        obj = build_dir / (str(rel).replace(os.sep, "__") + ".o")
        objects.append(obj)
        commands.append([mpicxx, *flags, "-c", str(src), "-o", str(obj)])
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        for _ in pool.map(_run, commands):
            pass
    # $ORIGIN/../../.. is <prefix>/lib for a package in <prefix>/lib/pythonX.Y/site-packages/,
    # where the mpich wheel puts libmpi.so.12.
    link = [
        mpicxx,
        "-pthread",
        *map(str, objects),
        "-o",
        str(output),
        "-Wl,-rpath,$ORIGIN/../../..",
        "-Wl,--disable-new-dtags",
    ]
    if shared:
        link[1:1] = ["-shared"]
    _run(link)
    return output


def _c_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


if __name__ == "__main__":
    # python native/build_native.py OUT.so : a quick manual build
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "build/libscaleout_core.so")
    print(build(target, Path("build/native-obj"), shared=True))
