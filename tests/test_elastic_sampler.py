"""ElasticSampler resumes an epoch at another world size (groundwork of issue 14)."""

import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402


@pytest.mark.parametrize("first, second", [(3, 2), (2, 3), (4, 4)])
def test_the_epoch_goes_on_at_another_size(tmp_path, first, second):
    path = str(tmp_path / "sampler.json")
    for phase, np_ in (("first", first), ("second", second)):
        proc = run_mpi("torch_elastic_sampler.py", np_, phase, path)
        assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr
