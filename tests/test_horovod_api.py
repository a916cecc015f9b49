"""Every public name of Horovod 0.28.1's front ends exists in scaleout's, read from the lists in
tests/horovod_api/ (one name per line). A name for a feature scaleout does not have yet must
still exist and raise NotImplementedError where it is used, never AttributeError."""

import importlib
from pathlib import Path

import pytest

LISTS = Path(__file__).resolve().parent / "horovod_api"

# (list file, scaleout module)
FRONT_ENDS = [
    ("torch.txt", "scaleout.torch"),
    ("tensorflow.txt", "scaleout.tensorflow"),
    ("keras.txt", "scaleout.tensorflow.keras"),
    ("keras_callbacks.txt", "scaleout.tensorflow.keras.callbacks"),
]

# Names that are not there yet, each with the reason; the test fails once one appears, so this
# list cannot go stale.
KNOWN_MISSING = {}

# Names whose feature is not implemented: looking them up raises NotImplementedError.
NOT_YET: set = set()


def horovod_names(list_file: str):
    lines = (LISTS / list_file).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("list_file,module", FRONT_ENDS, ids=[m for _, m in FRONT_ENDS])
def test_every_horovod_name_exists(list_file, module):
    pytest.importorskip(module.split(".")[1])
    mod = importlib.import_module(module)
    missing_known = KNOWN_MISSING.get(module, {})
    absent, unexpectedly_present = [], []
    for name in horovod_names(list_file):
        if name in NOT_YET:
            with pytest.raises(NotImplementedError, match="not implemented"):
                getattr(mod, name)
            continue
        present = hasattr(mod, name)
        if name in missing_known:
            if present:
                unexpectedly_present.append(name)
        elif not present:
            absent.append(name)
    assert not absent, f"{module} lacks Horovod's {absent}"
    assert not unexpectedly_present, (
        f"{unexpectedly_present} now exist in {module}: remove them from KNOWN_MISSING"
    )


def test_the_lists_are_not_empty():
    for list_file, _ in FRONT_ENDS:
        assert len(horovod_names(list_file)) >= (5 if "callbacks" in list_file else 30), list_file
