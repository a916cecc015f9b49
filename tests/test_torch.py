"""scaleout.torch: collectives, autograd, DistributedOptimizer, broadcasts, SyncBatchNorm, join,
and the proof that synchronous data-parallel training equals one big batch."""

import pytest

torch = pytest.importorskip("torch")

from conftest import one_size, run_mpi, run_python  # noqa: E402


def passed(proc, n):
    return proc.stdout.count("all checks passed") == n


def test_tensor_collectives_errors_and_gradients(nranks):
    assert passed(run_mpi("torch_ops.py", nranks), nranks)


@one_size(3)
def test_distributed_optimizer_broadcasts_and_join(nranks):
    assert passed(run_mpi("torch_optimizer.py", nranks), nranks)


@pytest.mark.parametrize("np_", [2], ids=lambda n: f"np{n}")  # (conftest.one_size)
def test_n_ranks_with_batch_b_train_like_one_process_with_batch_nb(np_):
    # SGD+momentum and Adam, backward_passes_per_step 1 and 2, float64 and float32,
    # SyncBatchNorm against BatchNorm on the global batch.
    assert passed(run_mpi("torch_equivalence.py", np_), np_)


@one_size(3)
def test_priority_executes_highest_first_in_rounds(nranks, tmp_path):
    # Note [Priority]: six reductions made ready together (a gate tensor holds them, with a long
    # cycle time) run one per round, highest priority first, in rank 0's timeline; tensors
    # larger than a round are reduced in parts, to the right sums.
    env = {"SCALEOUT_CYCLE_TIME": "60000", "SCALEOUT_PRIORITY_BYTES": "256"}
    proc = run_mpi("torch_priority.py", nranks, "order", str(tmp_path / "t.json"), env=env)
    assert passed(proc, nranks)


@one_size(2)
def test_overlap_forward_trains_bit_for_bit_like_step(nranks):
    # Note [Forward overlap]: SGD and Adam with an LR scheduler, zero_grad both ways, the
    # model's state_dict in between; the deferred update, priority orders; bad arguments.
    env = {"SCALEOUT_FUSION_THRESHOLD": "0"}  # the same sums whatever the fused layout
    assert passed(run_mpi("torch_priority.py", nranks, "train", env=env), nranks)


# ---- pure pieces, in this process (no ranks) ----


def test_gpu_tensors_get_a_clear_error():
    from scaleout import InvalidArgumentError
    from scaleout.torch._tensors import check_device

    check_device(torch.device("cpu"))
    with pytest.raises(InvalidArgumentError, match="GPU tensors are not supported yet"):
        check_device(torch.device("cuda", 0))


def test_compression_casts_floats_and_restores_them():
    from scaleout.torch import Compression

    x = torch.tensor([1.0, 2.5, -3.0], dtype=torch.float64)
    for comp, wire in ((Compression.fp16, torch.float16), (Compression.bf16, torch.bfloat16)):
        sent, ctx = comp.compress(x)
        assert sent.dtype == wire
        back = comp.decompress(sent, ctx)
        assert back.dtype == torch.float64 and torch.equal(back, x)
        ints = torch.arange(3)
        assert comp.compress(ints)[0] is ints
    sent, ctx = Compression.none.compress(x)
    assert sent is x and Compression.none.decompress(sent, ctx) is x
    half = torch.ones(2, dtype=torch.float16)
    assert Compression.fp16.compress(half)[0] is half


def test_named_parameters_are_checked():
    from scaleout import InvalidArgumentError
    from scaleout.torch._optimizer import _check_names

    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(2))
    assert _check_names(iter([("a", a), ("b", b)])) == {a: "a", b: "b"}
    with pytest.raises(InvalidArgumentError, match=r"duplicate names: \['a'\]"):
        _check_names([("a", a), ("a", b)])
    with pytest.raises(InvalidArgumentError, match="pairs"):
        _check_names([a, b])


@pytest.mark.parametrize("np_", [2, 3], ids=lambda n: f"np{n}")
def test_horovod_torch_semantics(np_):
    # alltoall_async's (output, splits), reducescatter's order and compression, grouped
    # allgather/reducescatter, sparse reduction, broadcast helpers with lists and every
    # torch.optim optimizer, DistributedOptimizer attributes and groups, uint16, exceptions.
    assert passed(run_mpi("torch_horovod_compat.py", np_, timeout=240), np_)


def test_queries_before_init_raise_valueerror_as_horovod():
    code = (
        "import scaleout.torch as hvd\n"
        "try:\n    hvd.rank()\nexcept ValueError as e:\n    print('ValueError:', e)\n"
    )
    out = run_python(code, timeout=120).stdout
    assert "ValueError:" in out and "init" in out, out
