"""Run by tests/test_torch.py::test_horovod_torch_semantics.

scaleout.torch behaves as Horovod 0.28.1's horovod.torch where the two used to differ: the
checks a Horovod user's script relies on, on every rank (any world size)."""

import warnings

import torch
import torch.nn as nn
from _harness import check, check_close, expect_error, main_tests

import scaleout.torch as hvd


def test_alltoall_async_synchronizes_to_output_and_received_splits(r, n):
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out, received = hvd.synchronize(hvd.alltoall_async(x, name="a2a.nosplits"))
    check(
        received.dtype == torch.int32 and received.tolist() == [2] * n,
        f"received splits without splits given: {received}",
    )
    want = torch.cat(
        [torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q for q in range(n)]
    )
    check(torch.equal(out, want), f"alltoall rows {out} want {want}")
    splits = torch.tensor([1] * n, dtype=torch.int32)
    out, received = hvd.synchronize(hvd.alltoall_async(x[:n], splits=splits, name="a2a.splits"))
    check(out.shape == (n,) and received.tolist() == [1] * n, "alltoall_async with splits")
    check(torch.is_tensor(hvd.alltoall(x, name="a2a.sync")), "alltoall without splits: a tensor")


def test_reducescatter_positional_order_and_compression(r, n):
    x = torch.full((2 * n, 3), float(r + 1))
    # Horovod's order: (tensor, name, compression, op)
    out = hvd.reducescatter(x, "rs.fp16", hvd.Compression.fp16, hvd.Sum)
    check(
        out.dtype == torch.float32 and out.shape == (2, 3), f"dtype/shape {out.dtype} {out.shape}"
    )
    check_close(out.numpy(), torch.full((2, 3), n * (n + 1) / 2).numpy(), "fp16 reducescatter")
    h = hvd.reducescatter_async(x, "rs.async", hvd.Average)
    check_close(
        hvd.synchronize(h).numpy(),
        torch.full((2, 3), (n + 1) / 2).numpy(),
        "reducescatter_async positional op",
    )


def test_grouped_allgather_and_reducescatter(r, n):
    a, b = torch.full((r + 1, 2), float(r)), torch.full((1,), float(r), dtype=torch.float64)
    ga, gb = hvd.grouped_allgather([a, b], name="gag")
    check(
        ga.shape == (n * (n + 1) // 2, 2) and gb.tolist() == [float(q) for q in range(n)],
        "grouped_allgather",
    )
    ha = hvd.synchronize(hvd.grouped_allgather_async([b, b.clone()], name="gag.async"))
    check(
        len(ha) == 2 and ha[1].tolist() == [float(q) for q in range(n)], "grouped_allgather_async"
    )
    xs = [torch.ones(n, 2) * (r + 1), torch.ones(2 * n) * (r + 1)]
    outs = hvd.grouped_reducescatter(xs, name="grs", op=hvd.Sum)
    check([tuple(o.shape) for o in outs] == [(1, 2), (2,)], "grouped_reducescatter shapes")
    check_close(outs[1].numpy(), torch.full((2,), n * (n + 1) / 2).numpy(), "grouped sum")
    outs = hvd.synchronize(hvd.grouped_reducescatter_async(xs, name="grs.async"))
    check_close(outs[0].numpy(), torch.full((1, 2), (n + 1) / 2).numpy(), "grouped average")
    # differentiable, as allgather is
    w = torch.ones(2, 3, requires_grad=True)
    (g1,) = hvd.grouped_allgather([w * (r + 1)], name="gag.grad")
    g1.sum().backward()
    check_close(w.grad.numpy(), torch.full((2, 3), float(r + 1)).numpy(), "grouped_allgather grad")


def test_sparse_allreduce_async_gathers_indices_and_values(r, n):
    dense = torch.zeros(5, 3)
    dense[r % 5] = r + 1.0
    dense[4] = 1.0
    wait = hvd.sparse_allreduce_async(dense.to_sparse(), "sparse.avg", hvd.Average)
    got = wait()
    check(got.is_sparse, "the result is sparse")
    want = sum(torch.zeros(5, 3).index_fill_(0, torch.tensor([q % 5]), q + 1.0) for q in range(n))
    want[4] += n
    check_close(got.to_dense().numpy(), (want / n).numpy(), "sparse Average")


def test_broadcast_parameters_takes_lists(r, n):
    torch.manual_seed(r)
    model = nn.Linear(3, 2)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    root_w = hvd.broadcast(model.weight.detach(), 0, name="check.w")
    check(torch.equal(model.weight.detach(), root_w), "list of tensors")
    torch.manual_seed(10 + r)
    other = nn.Linear(3, 2)
    hvd.broadcast_parameters(list(other.named_parameters()), n - 1)
    root_b = hvd.broadcast(other.bias.detach(), n - 1, name="check.b")
    check(torch.equal(other.bias.detach(), root_b), "list of (name, tensor) pairs")
    expect_error(
        ValueError,
        lambda: hvd.broadcast_parameters(42, 0),
        "int",
        what="broadcast_parameters of an int",
    )


def _flat_state(opt):
    """The optimizer's state_dict as {path: value}, tensors as lists (comparable by value)."""
    flat = {}

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k in sorted(obj, key=str):
                walk(f"{prefix}/{k}", obj[k])
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}/{i}", v)
        elif torch.is_tensor(obj):
            flat[prefix] = (
                str(obj.dtype),
                obj.detach().to_dense().tolist()
                if obj.layout != torch.strided or obj.dim()
                else obj.item(),
            )
        else:
            flat[prefix] = obj

    walk("", opt.state_dict())
    return flat


def _optimizers():
    for name in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer
        ):
            yield name, cls


def test_broadcast_optimizer_state_every_torch_optimizer(r, n):
    root = n - 1
    for name, cls in _optimizers():
        torch.manual_seed(0)
        sparse = cls is torch.optim.SparseAdam
        model = nn.Embedding(6, 3, sparse=True) if sparse else nn.Linear(3, 4, bias=False)
        kwargs = (
            {"lr": torch.tensor(0.01 * (r + 1))}
            if cls is torch.optim.Adam
            else {"lr": 0.01 * (r + 1)}
        )
        try:
            opt = cls(model.parameters(), **kwargs)
        except (TypeError, ValueError) as exc:  # an optimizer that needs other arguments
            check(False, f"{name}: could not be made: {exc}")
            continue
        if r == root:  # only root has trained: its state is not empty
            for _ in range(2):

                def closure():
                    opt.zero_grad()
                    x = torch.tensor([[1, 2, 3]]) if sparse else torch.randn(2, 3)
                    loss = model(x).pow(2).sum()
                    loss.backward()
                    return loss

                opt.step(closure) if cls is torch.optim.LBFGS else (closure(), opt.step())
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        mine = _flat_state(opt)
        theirs = hvd.broadcast_object(mine, root_rank=root, name=f"state.{name}")
        check(
            mine == theirs,
            f"{name}: state after broadcast equals root's ({len(mine)} vs {len(theirs)} entries)",
        )


def test_distributed_optimizer_attributes_and_groups(r, n):
    def train(**kwargs):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
        groups = kwargs.pop("groups", None)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            groups=groups(model) if groups else None,
            **kwargs,
        )
        for step in range(2):
            opt.zero_grad()
            torch.manual_seed(100 * r + step)
            model(torch.randn(3, 4)).pow(2).sum().backward()
            opt.step()
        return opt, [p.detach().clone() for p in model.parameters()]

    opt, plain = train()
    check(
        opt.op == hvd.Average
        and opt.backward_passes_per_step == 1
        and opt.process_set is hvd.global_process_set,
        "Horovod's attributes",
    )
    check(
        sorted(opt._parameter_names.values()) == ["0.bias", "0.weight", "2.bias", "2.weight"],
        f"_parameter_names {opt._parameter_names}",
    )
    for label, kw in (
        ("num_groups=2", {"num_groups": 2}),
        ("groups=lists", {"groups": lambda m: [[m[0].weight, m[2].weight], [m[0].bias]]}),
        ("groups=int", {"groups": lambda m: 3}),
    ):
        _, got = train(**kw)
        check(all(torch.allclose(a, b) for a, b in zip(plain, got)), f"{label}: same training")
    # op=Adasum: tests/mp/torch_adasum.py; as Horovod, no predivide factor with it.
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1),
            op=hvd.Adasum,
            gradient_predivide_factor=2.0,
        ),
        "gradient_predivide_factor",
        what="Adasum predivide",
    )


def test_sparse_gradients_are_allgathered_by_default(r, n):
    torch.manual_seed(0)
    emb = nn.Embedding(8, 2, sparse=True)
    start = emb.weight.detach().clone()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=1.0), named_parameters=emb.named_parameters()
    )
    opt.zero_grad()
    emb(torch.tensor([r % 8, 7])).sum().backward()
    opt.step()
    want = start.clone()
    for q in range(n):  # each rank's rows get 1/n of a unit gradient
        want[q % 8] -= 1.0 / n
        want[7] -= 1.0 / n
    check_close(emb.weight.detach().numpy(), want.numpy(), "sparse embedding step")


def test_sparse_as_dense_leaves_a_sparse_gradient_for_sparse_adam(r, n):
    # Horovod reduces the densified gradient and puts the result back into the sparse one
    # (grad.zero_().add_(result.to_sparse()): every dimension sparse, exact zeros dropped), so an
    # optimizer that takes sparse gradients only (SparseAdam) still steps, and elements whose
    # gradient is exactly 0 (the second column at the second step) keep their moments.
    torch.manual_seed(0)
    emb = nn.Embedding(8, 2, sparse=True)
    reference = nn.Embedding(8, 2, sparse=True)
    reference.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(emb.parameters(), lr=0.1),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=True,
    )
    ref_opt = torch.optim.SparseAdam(reference.parameters(), lr=0.1)
    for step, weight in enumerate((torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]))):
        opt.zero_grad()
        (emb(torch.tensor([r % 8, 7])) * weight).sum().backward()
        before = emb.weight.grad
        opt.step()
        grad = emb.weight.grad
        check(
            grad is before and grad.is_sparse and grad.sparse_dim() == 2,
            f"step {step}: the gradient after the step, in place and element-sparse: {grad}",
        )
        # The same step on one process, from every rank's rows at once, averaged, then
        # Horovod's conversion.
        ref_opt.zero_grad()
        rows = torch.tensor([q % 8 for q in range(n)] + [7] * n)
        ((reference(rows) * weight).sum() / n).backward()
        g = reference.weight.grad
        reduced = g.to_dense()
        g.zero_().add_(reduced.to_sparse())
        ref_opt.step()
        check_close(grad.to_dense().numpy(), g.to_dense().numpy(), f"step {step}: gradient")
        check_close(
            emb.weight.detach().numpy(),
            reference.weight.detach().numpy(),
            f"step {step}: SparseAdam",
        )


def test_uint16_in_every_collective(r, n):
    x = torch.tensor([1, 2, 3], dtype=torch.uint16)
    check(hvd.allreduce(x, op=hvd.Sum).tolist() == [n, 2 * n, 3 * n], "uint16 allreduce")
    check(hvd.allgather(x).shape == (3 * n,), "uint16 allgather")
    y = torch.tensor([r], dtype=torch.uint16)
    check(hvd.broadcast(y, n - 1).tolist() == [n - 1], "uint16 broadcast")
    check(
        hvd.reducescatter(torch.ones(n, dtype=torch.uint16), op=hvd.Sum).tolist() == [n],
        "uint16 reducescatter",
    )


def test_process_sets_adasum_and_elastic_names(r, n):
    expect_error(
        ValueError,
        lambda: hvd.allreduce(torch.ones(1), process_set=object()),
        "process_set must be a ProcessSet",
        what="process_set= not a set",
    )
    unregistered = hvd.ProcessSet([0])
    check(
        unregistered.process_set_id is None and unregistered.ranks == [0],
        "ProcessSet([0]) is made, not registered",
    )
    expect_error(
        ValueError,
        lambda: hvd.allreduce(torch.ones(1), process_set=unregistered),
        "is not registered",
        what="process_set= not registered",
    )
    check(
        all(
            hasattr(hvd.elastic, name)
            for name in (
                "run",
                "TorchState",
                "ElasticSampler",
                "ObjectState",
                "State",
                "HostsUpdatedInterrupt",
            )
        ),
        "hvd.elastic has Horovod's names",
    )
    check(hvd.elastic.HorovodInternalError is hvd.HorovodInternalError, "one HorovodInternalError")
    if n & (n - 1) == 0:  # Adasum of equal vectors is the vector (tests/mp/adasum.py: more)
        check(torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Adasum), torch.ones(3)), "op=Adasum")
    else:  # as Horovod
        expect_error(
            NotImplementedError,
            lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum),
            "non-power of 2",
            what="op=Adasum on a non-power-of-two job",
        )
    hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)
    check(
        hvd.global_process_set.size() == n and hvd.global_process_set.included(),
        "global_process_set",
    )


def test_exceptions_are_horovods_classes(r, n):
    def mismatch():
        hvd.allreduce(torch.ones(r + 1), name="mismatched.shape")

    msg = expect_error(RuntimeError, mismatch, "mismatched.shape", what="mismatch: RuntimeError")
    check("shape" in msg, f"mismatch names the shape: {msg}")
    # Each rank's own name stays in flight until every rank has submitted every name, which they
    # do only after the barrier, so the second submission is a duplicate on every rank.
    h = hvd.allreduce_async(torch.ones(1), name=f"dup.{r}")
    expect_error(
        ValueError,
        lambda: hvd.allreduce_async(torch.ones(1), name=f"dup.{r}"),
        "dup",
        what="duplicate name in flight: ValueError",
    )
    hvd.barrier()
    others = [hvd.allreduce_async(torch.ones(1), name=f"dup.{k}") for k in range(n) if k != r]
    for handle in [h, *others]:
        hvd.synchronize(handle)
    try:
        mismatch()
    except torch.FatalError as e:  # what scripts written for early Horovod releases catch
        check(isinstance(e, hvd.MismatchError), f"torch.FatalError is the MismatchError: {e!r}")
    except Exception as e:  # noqa: BLE001
        check(False, f"a mismatch is also a torch.FatalError: {type(e).__mro__}")
    expect_error(
        ValueError, lambda: hvd.allreduce(torch.ones(1), op=77), "op", what="bad op: ValueError"
    )
    check(
        issubclass(hvd.ShutDownError, hvd.HorovodInternalError)
        and issubclass(hvd.HorovodInternalError, RuntimeError),
        "HorovodInternalError",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.barrier()


main_tests(globals())
