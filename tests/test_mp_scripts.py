"""Every multi-process script under tests/mp says which tests run it, and is run by them.

A script's module docstring opens with "Run by tests/test_x.py::test_name[, ...]." so that a
reader of a failing rank's output can find the test, and the test can be run alone. Checked here
on the sources: each test named exists, and its file names the script. Helpers (imported by other
scripts, named by no test file) are exempt.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MP = TESTS / "mp"
SCRIPTS = sorted(path.name for path in MP.glob("*.py"))
REFERENCE = re.compile(r"tests/(test_\w+\.py)::(\w+)")


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@lru_cache(maxsize=None)
def _named_in(path: Path) -> frozenset:
    """The tests/mp scripts a test file names in a string (run_mpi("x.py"), MP / "x.py")."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= {s for s in SCRIPTS if node.value == s or node.value.endswith("/" + s)}
    return frozenset(names)


def _imported_by_scripts() -> set:
    modules = set()
    for name in SCRIPTS:
        for node in ast.walk(_tree(MP / name)):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules |= {alias.name for alias in node.names}
    return {f"{module}.py" for module in modules}


# Not this file, which names the helpers below.
TEST_FILES = sorted(p for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)
NAMED = {name for path in TEST_FILES for name in _named_in(path)}
HELPERS = sorted((_imported_by_scripts() & set(SCRIPTS)) - NAMED)


def _defines(path: Path, function: str) -> bool:
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return True
    return False


def test_helpers_are_only_the_shared_modules():
    # A script that only another script imports is a helper; a new one should be deliberate.
    assert HELPERS == ["_harness.py", "_timeline.py", "tf_common.py", "torch_common.py"]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in HELPERS])
def test_script_names_the_tests_that_run_it(script):
    assert script in NAMED, f"tests/mp/{script} is named by no tests/test_*.py: nothing runs it"
    docstring = ast.get_docstring(_tree(MP / script), clean=False) or ""
    opening = docstring.split("\n\n", 1)[0]
    assert re.match(r"Run by\s", opening), (
        f"tests/mp/{script}: the docstring must open with 'Run by tests/test_x.py::test_y.'"
    )
    references = REFERENCE.findall(opening)
    assert references, f"tests/mp/{script}: no tests/test_x.py::test_y in {opening!r}"
    for test_file, function in references:
        path = TESTS / test_file
        assert path.is_file(), f"tests/mp/{script} names tests/{test_file}, which does not exist"
        assert _defines(path, function), (
            f"tests/mp/{script} names {test_file}::{function}, which is not defined there"
        )
        assert script in _named_in(path), (
            f"tests/mp/{script} says {test_file}::{function} runs it, but {test_file} never "
            "names it"
        )
