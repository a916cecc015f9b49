"""Property-based tests of every collective's argument handling on real ranks, numpy level
(tests/mp/fuzz_collectives.py) and torch front end (tests/mp/fuzz_torch.py): each call returns
numpy's answer or raises InvalidArgumentError on every rank, never anything else, never a hang
(the subprocess timeout)."""

import pytest

pytest.importorskip("hypothesis")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("nranks,examples", [(2, 150), (3, 40)], ids=["np2", "np3"])
def test_collectives_return_numpys_answer_or_refuse_on_every_rank(nranks, examples):
    proc = run_mpi("fuzz_collectives.py", nranks, str(examples), timeout=240)
    assert proc.stdout.count("all checks passed") == nranks


@pytest.mark.parametrize("nranks,examples", [(2, 80), (3, 25)], ids=["np2", "np3"])
def test_torch_collectives_return_numpys_answer_or_refuse_on_every_rank(nranks, examples):
    pytest.importorskip("torch")
    proc = run_mpi("fuzz_torch.py", nranks, str(examples), timeout=300)
    assert proc.stdout.count("all checks passed") == nranks
