"""The Python package's layers, checked on the sources: each module of scaleout/ imports only
from layers below its own, at the top of the file.

Read LAYERS bottom to top to walk the package: a collective goes down it, from a framework shim
to the numpy-level API to `_native.submit` to the binding. Modules of one layer do not import
each other. An import inside a function is allowed only of what must load late (torch,
tensorflow, keras, mpi4py: importing scaleout must not load MPI), never of a scaleout module
(but for LATE): a module that needs one from above belongs in a higher layer. (The launcher's
rules are tests/test_launcher_layers.py's.)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "scaleout"

LAYERS: List[Set[str]] = [
    # the C extension, and pure protocols: the names ranks match, the elastic driver's channel,
    # what a rank reports to scaleoutrun (these import nothing of scaleout's)
    {"_binding", "_naming", "_elastic_protocol", "_rank_report", "_mpi_library", "_pmi_server"},
    {"_errors"},  # the exception classes
    {
        "_native",  # loading the library, the code tables, Handle, the one submit
        "_commit_store",  # a host's commit files (no native code: the launcher uses it)
        "_pmi_bootstrap",
    },  # joining ranks no MPI launcher started, through torch's store (Note [PMI bootstrap])
    {"_runtime"},  # start/shutdown, rank layout, config(), stats, timeline
    {
        "_process_sets",  # looking a process set up: what every collective needs
        "_arrays",
    },  # array helpers and the array submit (submit_into, submit_owned)
    {
        "_ops",  # the numpy collectives API
        "_gradient_rules",
    },  # what each collective's gradient is, over a front end's primitives
    {"_objects"},  # collectives on Python objects
    {"_host_sets"},  # the process sets of the job's machines (Note [Host sets])
    {
        "_process_set_registry",  # registering process sets (collectives), so the public init()
        "_topk",  # top-k sparsification
        "_commit_protocol",
    },  # writing and finding commits on every host (collectives)
    {
        "_compression",  # Compression.none/fp16/bf16/topk
        "_local_sgd",  # local SGD's schedule (Note [Local SGD])
        "_elastic_state",
    },  # elastic State objects
    {"_elastic_run"},  # hvd.elastic.run
    {"_frontend_api"},  # the names every front end exports alike
    {"scaleout", "elastic"},  # the package's own namespace, scaleout.elastic
    {"torch", "tensorflow"},  # the framework shims (each a package with its own modules)
    {
        "_torch_plugin",  # torch's entry point: the backend's name, scaleout.torch loaded late
        "ray",
    },  # scaleout.ray: Horovod's RayExecutor (Note [PMI bootstrap] through a Ray actor)
]
# Imports inside a function allowed of a scaleout module: `import torch` calls the plugin, and
# must not pay for importing scaleout.torch until a group of the backend is made.
LATE = {("scaleout._torch_plugin", "scaleout.torch._process_group")}
SHIMS = {"torch", "tensorflow"}
EXTENSIONS = {"scaleout._binding"}  # compiled modules: no .py file to find


def _layer_key(module: str) -> str:
    """scaleout._ops -> _ops; scaleout.torch._optimizer -> torch; scaleout -> scaleout."""
    parts = module.split(".")
    return "scaleout" if len(parts) == 1 else parts[1]


def _modules() -> Dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["scaleout", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> Iterator[Tuple[str, int, bool]]:
    """(imported scaleout module, line, at the top of the file) for each import of one."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = {
        id(n)
        for stmt in tree.body
        if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        for n in ast.walk(stmt)
    }
    known = set(_modules()) | EXTENSIONS
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            # `from scaleout import _runtime` imports a module; `from scaleout import size` a name
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "scaleout" or target.startswith("scaleout."):
                yield target, node.lineno, id(node) in top


def _layer_of() -> Dict[str, int]:
    return {key: i for i, layer in enumerate(LAYERS) for key in layer}


def test_every_module_has_a_layer():
    layer_of = _layer_of()
    missing = sorted(m for m in _modules() if _layer_key(m) not in layer_of)
    assert not missing, f"add these modules to a layer of LAYERS: {missing}"


def test_scaleout_modules_are_imported_at_the_top_of_the_file():
    late = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for module, path in _modules().items()
        for target, line, at_top in _imports(module, path)
        if not at_top and (module, target) not in LATE
    ]
    assert not late, (
        "an import of a scaleout module inside a function hides a layer "
        f"violation or a cycle; move it to the top: {late}"
    )


def test_each_module_imports_only_from_layers_below():
    layer_of = _layer_of()
    upward = []
    for module, path in _modules().items():
        mine = _layer_key(module)
        for target, line, _ in _imports(module, path):
            theirs = _layer_key(target)
            if mine == theirs and mine in SHIMS:
                continue  # a shim's own modules (their order is the shim's)
            if layer_of.get(theirs, len(LAYERS)) >= layer_of[mine]:
                upward.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line} ({mine}, layer "
                    f"{layer_of[mine]}) imports {target} ({theirs}, layer "
                    f"{layer_of.get(theirs)})"
                )
    assert not upward, f"imports that do not point down the layers: {upward}"


def test_no_import_cycle():
    # Follows from the layers between them; inside a shim it is checked here.
    graph: Dict[str, Set[str]] = {m: set() for m in _modules()}
    for module, path in _modules().items():
        graph[module] |= {t for t, _, _ in _imports(module, path) if t in graph and t != module}
    state: Dict[str, int] = {}

    def visit(node: str, trail: List[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(trail + [node, nxt])}"
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
