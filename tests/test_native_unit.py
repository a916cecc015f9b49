"""Builds the native unit tests (native/tests/*.cc, linked with the core) and runs them, one
pytest test per native/tests/test_*.cc file (`native_tests --file test_x.cc`).

The binary is kept in pytest's cache directory under a digest of the native sources, so it is
rebuilt only when something under native/ changed. The core and its tests need no MPI (Note [One
core, a shim per MPI ABI]): skipped only where no C++ compiler exists; a build that fails is a
test failure.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"
if str(NATIVE) not in sys.path:
    sys.path.insert(0, str(NATIVE))

import build_native  # noqa: E402

SUMMARY = re.compile(r"(\d+) passed, (\d+) failed")


def _source_digest(cxx: str) -> str:
    """Changes whenever a source, header, the build script or the compiler changes."""
    digest = hashlib.sha256(cxx.encode())
    for path in sorted(NATIVE.rglob("*")):
        if path.is_file() and path.suffix in (".cc", ".h", ".py"):
            digest.update(str(path.relative_to(NATIVE)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _unity_sources(sources: list[Path], work: Path) -> list[Path]:
    """The test files compiled as one translation unit per core: most of a file's compile time
    is the core's headers, parsed once per unit (here 13 s instead of 35 s for 24 files). Each
    unit starts with its files' digest, so that a build cache (SCALEOUT_BUILD_CACHE), which
    keys an object by its source's bytes and the headers', never reuses a stale one."""
    units = max(1, min(len(sources), os.cpu_count() or 2))
    by_size = sorted(sources, key=lambda p: (-p.stat().st_size, p.name))
    paths = []
    for i in range(units):
        members = by_size[i::units]
        digest = hashlib.sha256(b"".join(p.read_bytes() + b"\0" for p in members)).hexdigest()
        unit = work / f"native_tests_unit{i}.cc"
        unit.write_text(f"// {digest}\n" + "".join(f'#include "{p}"\n' for p in members))
        paths.append(unit)
    return paths


@pytest.fixture(scope="session")
def native_tests_binary(request, tmp_path_factory) -> Path:
    try:
        cxx = build_native.find_cxx()
    except build_native.BuildError as e:
        pytest.skip(f"cannot build the native unit tests: {e}")
    cache = getattr(request.config, "cache", None)  # absent with -p no:cacheprovider
    if cache is not None:
        root = cache.mkdir("native-unit-tests")
    else:
        root = tmp_path_factory.mktemp("native-unit-tests")
    key = _source_digest(cxx)
    binary = root / key / "native_tests"
    if binary.exists():
        return binary
    for stale in root.iterdir():
        if stale.is_dir() and stale.name != key:
            shutil.rmtree(stale, ignore_errors=True)
    (root / key).mkdir(parents=True, exist_ok=True)
    # Built aside and moved into place, so a concurrent session never runs a half-written file.
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root / key))
    try:
        build_native.build(
            work / "native_tests",
            work / "obj",
            shared=False,
            extra_sources=_unity_sources(build_native.test_sources(), work),
            # The tests' own files at -O1 (the core keeps its -O3).
            extra_flags=["-O1"],
        )
        os.replace(work / "native_tests", binary)
    except build_native.BuildError as e:
        pytest.fail(f"building the native unit tests failed:\n{e}", pytrace=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary


# The native engineer splits and adds files; globbing them means each is its own pytest id
# and a file that loses its tests (a split that drops them) fails instead of passing quietly.
NATIVE_TEST_FILES = sorted(
    path.name for path in (NATIVE / "tests").glob("test_*.cc") if path.name != "test_main.cc"
)


def test_every_native_test_is_in_a_test_file(native_tests_binary: Path):
    # A test registered elsewhere (a header, a file not named test_*.cc) would run under no id.
    proc = subprocess.run(
        [str(native_tests_binary), "--list"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {line.split(" ", 1)[0] for line in proc.stdout.splitlines()}
    assert files, "the native test binary lists no test"
    outside = sorted(files - set(NATIVE_TEST_FILES))
    assert not outside, f"native tests registered outside native/tests/test_*.cc: {outside}"


@pytest.mark.parametrize("test_file", NATIVE_TEST_FILES)
def test_native_unit_tests_pass(native_tests_binary: Path, test_file: str):
    try:
        proc = subprocess.run(
            [str(native_tests_binary), "--file", test_file],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        pytest.fail(
            f"the native unit tests of {test_file} did not finish in 240 s (a hang?)\n{out}",
            pytrace=False,
        )
    output = proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    summary = SUMMARY.fullmatch(lines[-1].strip()) if lines else None
    assert summary is not None, (
        f"no `N passed, M failed` line at the end (exit code {proc.returncode}):\n{output}"
    )
    passed, failed = int(summary.group(1)), int(summary.group(2))
    assert proc.returncode == 0 and failed == 0 and passed > 0, (
        f"native unit tests of {test_file}: {passed} passed, {failed} failed, "
        f"exit {proc.returncode}\n{output}"
    )


def test_a_core_linked_with_a_static_cpp_runtime_keeps_that_runtime_to_itself(
    tmp_path, monkeypatch
):
    # Note [Static libstdc++]: a compiler that links libstdc++ into the core statically (a `c++`
    # wrapper adding -static-libstdc++) must not leave the runtime's symbols exported, where the
    # process's shared libstdc++ would take over some of the core's calls to it (rank 0 crashed
    # in init() so on a machine whose shared libstdc++ is another version than the static one).
    try:
        cxx = build_native.find_cxx()
    except build_native.BuildError as e:
        pytest.skip(f"no C++ compiler: {e}")
    archive = subprocess.run(
        [cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip(f"{cxx} has no static libstdc++ (libstdc++.a) to link")
    # The same compiler under its own name (its objects come from the build cache, keyed by the
    # compiler's name and version), -static-libstdc++ at the link.
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / Path(cxx).name
    wrapper.write_text(
        f'#!/bin/sh\ncase " $* " in *" -c "*) exec {cxx} "$@";; esac\n'
        f'exec {cxx} "$@" -static-libstdc++\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    core = build_native.build(tmp_path / "core.so", tmp_path / "obj", shared=True)
    needed = subprocess.run(["readelf", "-d", str(core)], capture_output=True, text=True).stdout
    assert "libstdc++" not in needed, "the wrapper did not link libstdc++ statically"
    symbols = subprocess.run(
        ["nm", "--defined-only", str(core)], capture_output=True, text=True
    ).stdout
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(core)], capture_output=True, text=True
    ).stdout
    classic = "_ZNSt6locale7classicEv"  # std::locale::classic(), defined by libstdc++ alone
    assert classic in symbols, "libstdc++ is not inside the core"
    assert classic not in exported, "the core exports the C++ runtime it holds"
    assert "so_init" in exported  # the C ABI stays exported
