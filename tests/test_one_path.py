"""One path from the shims to the core: the rules of scaleout._native's header comment, checked
on the sources, and the tables and semantics every front end shares."""

import ast
import re
from pathlib import Path

import pytest
from conftest import one_size

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scaleout"
SHIMS = [p for sub in ("torch", "tensorflow") for p in sorted((PACKAGE / sub).rglob("*.py"))]


def _imports_from(path: Path, module: str):
    """(line, name) of every name imported from `module`, or used as `alias._name` when the
    module itself is imported."""
    tree = ast.parse(path.read_text(), str(path))
    found, aliases = [], set()
    package, _, leaf = module.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            aliases |= {a.asname or a.name for a in node.names if a.name == leaf}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == module and a.asname}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append((node.lineno, node.attr))
    return found


def test_the_shims_are_found():
    names = {p.name for p in SHIMS}
    assert {"_collectives.py", "_optimizer.py", "_gradients.py"} <= names


@pytest.mark.parametrize("module", ["scaleout._ops", "scaleout._native", "scaleout._arrays"])
def test_shims_use_no_private_name_of_the_core_modules(module):
    private = [
        f"{p.relative_to(ROOT)}:{line} {name}"
        for p in SHIMS
        for line, name in _imports_from(p, module)
        if name.startswith("_")
    ]
    assert not private, f"private names of {module} used by a shim: {private}"


def test_one_function_calls_the_bindings_submit():
    # One request record: every collective reaches the binding through scaleout._native.submit
    # (the binding's function itself, called with named fields): the one place to change when
    # the binding's does.
    uses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        uses += [
            (path.name, node.lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr == "submit"
            and isinstance(node.value, ast.Name)
            and node.value.id == "_binding"
        ]
    native = ast.parse((PACKAGE / "_native.py").read_text())
    submit = next(
        n
        for n in native.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "submit"
    )
    assert len(uses) == 1, f"_binding.submit used at {uses}"
    assert uses[0][0] == "_native.py" and uses[0][1] == submit.lineno


def test_the_c_abi_is_bound_once():
    # No ctypes in the package but to ask the MPI library itself its ABI and version
    # (scaleout/_mpi_library.py, which the launcher runs outside the package too), and one
    # binding includes the ABI header for Python.
    users = [p.relative_to(ROOT) for p in PACKAGE.rglob("*.py") if "ctypes" in p.read_text()]
    assert users == [Path("scaleout/_mpi_library.py")], f"ctypes used in {users}"
    assert "_scaleout_core" not in (PACKAGE / "_mpi_library.py").read_text()
    # The binding is one extension of several C files (native/python/*.c, each a source of
    # scaleout._binding in setup.py), which reach the header through python/binding.h alone.
    python = ROOT / "native" / "python"
    includers = [
        p.relative_to(ROOT)
        for p in sorted(python.glob("*.[ch]"))
        if '#include "c_api/scaleout.h"' in p.read_text()
    ]
    assert includers == [Path("native/python/binding.h")]
    setup = (ROOT / "setup.py").read_text()
    for source in python.glob("*.c"):
        assert '#include "python/binding.h"' in source.read_text(), source
        assert f'"{source.relative_to(ROOT)}"' in setup, f"{source} is not built into _binding"


def test_tables_come_from_the_header():
    from scaleout import _binding
    from scaleout._native import COLLECTIVE_CODES, DTYPE_CODES, OP_NAMES

    header = (ROOT / "native" / "c_api" / "scaleout.h").read_text()
    # The binding is compiled from the header; the rows it hands Python are the header's rows.
    dtype_rows = re.findall(r"X\((\w+), (\w+), (\d+), (\d+)\)", header)
    assert [(name, int(code), int(size)) for _, name, code, size in dtype_rows] == list(
        _binding.DTYPES
    )
    assert DTYPE_CODES["float32"] == 7 and DTYPE_CODES["bfloat16"] == 6
    assert OP_NAMES == {0: "Average", 1: "Sum", 2: "Min", 3: "Max", 4: "Product", 5: "Adasum"}
    assert list(COLLECTIVE_CODES) == [
        "allreduce",
        "allgather",
        "broadcast",
        "alltoall",
        "reducescatter",
        "barrier",
        "join",
    ]
    statuses = dict(_binding.STATUSES)
    from scaleout._errors import BY_STATUS_NAME

    assert set(statuses) - {"OK"} == set(BY_STATUS_NAME)


def test_every_front_end_exports_the_same_ops():
    import scaleout
    from scaleout import _native

    assert (
        scaleout.Average,
        scaleout.Sum,
        scaleout.Min,
        scaleout.Max,
        scaleout.Product,
        scaleout.Adasum,
    ) == (_native.Average, _native.Sum, _native.Min, _native.Max, _native.Product, _native.Adasum)


def test_the_gradient_rules_cover_every_differentiable_collective():
    from scaleout import _gradient_rules
    from scaleout._errors import InvalidArgumentError, NoGradientError
    from scaleout._native import Average, Max, Sum

    for name in ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall"):
        assert callable(_gradient_rules.gradient(name))
        assert _gradient_rules.COLLECTIVES[name].gradient
    for what in ("allreduce", "reducescatter"):
        _gradient_rules.check_gradient_op(what, Sum)
        _gradient_rules.check_gradient_op(what, Average)
        with pytest.raises(NoGradientError, match="Average and Sum ops only, not Max"):
            _gradient_rules.check_gradient_op(what, Max)
    # what torch users catch (RuntimeError/ValueError) and what TensorFlow code catches
    assert issubclass(NoGradientError, InvalidArgumentError)
    assert issubclass(NoGradientError, NotImplementedError)


def test_predivision():
    from scaleout._errors import InvalidArgumentError
    from scaleout._gradient_rules import predivided
    from scaleout._native import Average, Sum

    assert predivided(Average, 1.0, 4) == (Average, 1.0, 1.0)
    assert predivided(Sum, 1.0, 4) == (Sum, 1.0, 1.0)
    assert predivided(Average, 2.0, 4) == (Sum, 0.5, 0.5)
    with pytest.raises(InvalidArgumentError, match="needs op=Average"):
        predivided(Sum, 2.0, 4)
    with pytest.raises(InvalidArgumentError, match="positive"):
        predivided(Average, 0.0, 4)


def test_one_compression_factory_serves_both_frameworks():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    from scaleout.tensorflow import Compression as TFCompression
    from scaleout.torch import Compression as TorchCompression

    assert TorchCompression.none is TFCompression.none
    assert (
        TorchCompression.fp16.compress.__func__.__code__
        is TFCompression.fp16.compress.__func__.__code__
    )
    sent, ctx = TFCompression.bf16.compress(tf.constant([1.5], tf.float32))
    assert (
        sent.dtype == tf.bfloat16 and TFCompression.bf16.decompress(sent, ctx).dtype == tf.float32
    )
    sent, ctx = TorchCompression.bf16.compress(torch.tensor([1.5]))
    assert (
        sent.dtype == torch.bfloat16
        and TorchCompression.bf16.decompress(sent, ctx).dtype == torch.float32
    )


@one_size(3)
def test_torch_and_tensorflow_gradients_follow_one_table(nranks):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    from conftest import run_mpi

    proc = run_mpi("gradient_rules.py", nranks, timeout=240)
    assert proc.stdout.count("all checks passed") == nranks
