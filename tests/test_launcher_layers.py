"""The launcher's import rules (launcher/__init__.py): the rank wrapper's modules import nothing
from scaleout, the others only scaleout's pure modules, and no launcher module imports another
that imports it back."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import run_job, run_python

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"
# scaleout's modules that load neither MPI nor the native core.
PURE = {
    "scaleout._elastic_protocol",
    "scaleout._rank_report",
    "scaleout._commit_store",
    "scaleout._mpi_library",
}


def _imports(path: Path, top_level_only: bool) -> tuple[set[str], set[str]]:
    """(launcher modules, scaleout modules) that `path` imports."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # also those under a top-level if/try
        nodes = [
            n
            for top in tree.body
            for n in ast.walk(top)
            if not isinstance(top, (ast.FunctionDef, ast.ClassDef))
        ]
    ours, theirs = set(), set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.module:
                ours.add(node.module.split(".")[0])
            else:
                ours.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scaleout"):
            if node.module == "scaleout":
                theirs.update(f"scaleout.{alias.name}" for alias in node.names)
            else:
                theirs.add(node.module)
        elif isinstance(node, ast.Import):
            theirs.update(a.name for a in node.names if a.name.startswith("scaleout"))
    return ours, theirs


def _modules() -> dict[str, Path]:
    return {path.stem: path for path in LAUNCHER.glob("*.py") if path.stem != "__init__"}


def test_the_rank_wrapper_imports_nothing_from_scaleout():
    modules = _modules()
    seen, frontier = set(), ["rank_exec"]
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        ours, theirs = _imports(modules[name], top_level_only=False)
        assert not theirs, f"launcher/{name}.py (run by the rank wrapper) imports {theirs}"
        frontier += sorted(ours)
    assert {"rank_exec", "exit_report", "output", "placement", "rank_env"} <= seen


def test_the_launcher_imports_only_scaleouts_pure_modules():
    for name, path in _modules().items():
        _, theirs = _imports(path, top_level_only=True)
        assert theirs <= PURE, f"launcher/{name}.py imports {theirs - PURE}"


def test_the_pure_modules_load_no_native_code():
    # Imported under a bare scaleout package: its __init__, which imports the binding, is not run.
    code = (
        "import sys, types\n"
        "package = types.ModuleType('scaleout')\n"
        "package.__path__ = [sys.argv[1]]\n"
        "sys.modules['scaleout'] = package\n"
        f"import {', '.join(sorted(PURE))}\n"
        "print(' '.join(sorted(name for name in sys.modules if name.startswith("
        "('scaleout.', 'mpi4py', 'torch', 'tensorflow')))))\n"
    )
    done = run_python(code, str(LAUNCHER.parent / "scaleout"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) <= PURE | {"scaleout._errors"}, done.stdout


def test_no_import_cycle_among_the_launchers_modules():
    modules = _modules()
    graph = {
        name: _imports(path, top_level_only=False)[0] & modules.keys()
        for name, path in modules.items()
    }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and not seen.add(nxt) and reaches(nxt, goal, seen)):
                return True
        return False

    cyclic = sorted(name for name in graph if reaches(name, name, set()))
    assert not cyclic, f"launcher modules in an import cycle: {cyclic}"


def test_the_rank_wrapper_runs_by_path_without_scaleout():
    # -S -I: no site-packages, so an import of scaleout would fail.
    done = run_job(
        [
            sys.executable,
            "-I",
            "-S",
            str(LAUNCHER / "rank_exec.py"),
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            "print('hello')",
        ],
        "the rank wrapper",
        60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("] hello\n")
