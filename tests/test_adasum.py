"""op=Adasum (Note [Adasum]): Horovod's rule against numpy at 2 and 4 ranks through every front
end, the same bits everywhere, and Horovod's errors (3 ranks, process sets, integer tensors);
torch's DistributedOptimizer(op=Adasum) combining parameter changes (Note [Adasum
optimizer])."""

import pytest
from conftest import one_size, run_mpi


# Both data paths where Adasum runs in levels (4 ranks); 3 ranks is Horovod's refusal, which
# comes before any data moves. TensorFlow's front end at 2 ranks (the levels under it are the
# core's, which the numpy and torch front ends take at 4).
@pytest.mark.parametrize(
    "np_,path",
    [(2, "shm"), (3, "shm"), (4, "shm"), (4, "mpi")],
    ids=["shm-np2", "shm-np3", "shm-np4", "mpi-np4"],
)
def test_adasum_matches_horovods_rule(np_, path):
    env = {} if path == "shm" else {"SCALEOUT_SHM": "0"}
    if np_ == 2:
        env["ADASUM_TENSORFLOW"] = "1"
    proc = run_mpi("adasum.py", np_, env=env, timeout=180)
    assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


@pytest.mark.parametrize("np_", [2, 3, 4], ids=lambda n: f"np{n}")
def test_torch_distributed_optimizer_combines_parameter_changes(np_):
    pytest.importorskip("torch")
    proc = run_mpi("torch_adasum.py", np_, timeout=180)
    assert proc.stdout.count("all checks passed") == np_, proc.stdout + proc.stderr


@one_size(2)
def test_tensorflow_v1_optimizer_combines_variable_changes(nranks):
    pytest.importorskip("tensorflow")
    proc = run_mpi("tf_adasum.py", nranks, timeout=240)
    assert proc.stdout.count("all checks passed") == nranks, proc.stdout + proc.stderr
