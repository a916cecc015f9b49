"""The repository's own style settings hold: ruff (lint and format, pyproject.toml) over the
Python, clang-format (.clang-format) over native/. The tools come with the `test` extra, pinned,
since another version lays code out differently."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' brings it)")
    return found


def check(*command: str) -> None:
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(command)}:\n{proc.stdout}{proc.stderr}"


def test_ruff_lint():
    check(tool("ruff"), "check", ".")


def test_ruff_format():
    check(tool("ruff"), "format", "--check", ".")


def test_clang_format():
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "native").rglob("*")
        if p.suffix in (".c", ".cc", ".h")
    )
    assert files, "no native sources found"
    check(tool("clang-format"), "--dry-run", "-Werror", *files)
