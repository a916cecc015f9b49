"""Run by tests/test_fuzz.py::test_torch_collectives_return_numpys_answer_or_refuse_on_every_rank.

Property-based tests of the torch front end's collectives' argument handling, on real ranks:
as tests/mp/fuzz_collectives.py (whose helpers it uses) for numpy, with torch tensors of every
dtype the front end takes (bfloat16 and bool included), synchronous and asynchronous forms, in
place and not. A valid call (by fuzz_collectives.py's rules, the same for torch) returns what
numpy computes from every rank's data; an invalid one raises InvalidArgumentError on every rank,
for a reason it has; never a valid call refused, another exception, a crash or a hang.

argv[1]: the number of examples per collective."""

import numpy as np
import torch
from _harness import main_tests
from fuzz_collectives import (
    SETTINGS,
    name_refusal,
    names,
    root_refusal,
    run,
    scales,
    shapes,
    splits_refusal,
)
from hypothesis import given
from hypothesis import strategies as st

import scaleout.torch as hvd

DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def data(rank: int, shape, dtype, salt: int) -> torch.Tensor:
    """Small integers: every reduction is exact in every dtype (bfloat16 too)."""
    rng = np.random.default_rng(1000 * salt + rank)
    return torch.from_numpy(rng.integers(0, 3, size=shape)).to(dtype)


def as_numpy(t):
    t = t[0] if isinstance(t, tuple) else t
    return t.to(torch.float64).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def checked(call, dtype):
    """The call's result as numpy (bfloat16 widened), or a note that fails the comparison when
    the result is not a tensor of `dtype`."""

    def wrapped():
        got = call()
        got = got[0] if isinstance(got, tuple) else got
        if not isinstance(got, torch.Tensor) or got.dtype != dtype:
            return np.array(
                [f"not a {dtype} tensor: {type(got).__name__} {getattr(got, 'dtype', '')}"]
            )
        return as_numpy(got)

    return wrapped


def approx_values(got, want):
    if got.dtype.kind == "U":
        return False
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_allreduce(r, n):
    @SETTINGS
    @given(
        st.sampled_from(DTYPES),
        shapes,
        st.sampled_from(OPS),
        scales,
        scales,
        st.sampled_from(["sync", "inplace", "async", "async_inplace"]),
        names,
        st.integers(0, 10**6),
    )
    def prop(dtype, shape, op, pre, post, form, name, salt):
        every = [data(k, shape, dtype, salt) for k in range(n)]
        mine = every[r].clone()

        def expected():
            integer = not dtype.is_floating_point
            cut = np.trunc if integer else (lambda v: v)
            stacked = np.stack([cut(as_numpy(e).astype(np.float64) * pre) for e in every])
            reduced = {
                hvd.Sum: stacked.sum(0),
                hvd.Average: stacked.sum(0),
                hvd.Min: stacked.min(0),
                hvd.Max: stacked.max(0),
                hvd.Product: stacked.prod(0),
            }[op]
            factor = post / n if op == hvd.Average else post
            return cut(reduced * factor)

        kwargs = dict(op=op, name=name, prescale_factor=pre, postscale_factor=post)
        call = {
            "sync": lambda: hvd.allreduce(mine, **kwargs),
            "inplace": lambda: (hvd.allreduce_(mine, **kwargs), mine)[1],
            "async": lambda: hvd.synchronize(hvd.allreduce_async(mine, **kwargs)),
            "async_inplace": lambda: (hvd.synchronize(hvd.allreduce_async_(mine, **kwargs)), mine)[
                1
            ],
        }[form]
        run(
            checked(call, dtype),
            expected,
            f"torch allreduce {dtype} {shape} op {op} pre {pre} post {post} {form} name {name!r}",
            approx_values,
            name_refusal(name),
        )

    prop()


def test_allgather_broadcast_alltoall_reducescatter(r, n):
    @SETTINGS
    @given(
        st.sampled_from(DTYPES + [torch.bool]),
        st.integers(0, 6),
        st.integers(0, 3),
        st.integers(-1, 4),
        st.one_of(st.none(), st.lists(st.integers(-1, 4), min_size=0, max_size=4)),
        st.booleans(),
        names,
        st.integers(0, 10**6),
    )
    def prop(dtype, rows, width, root, splits, as_tensor, name, salt):
        shape = (rows, width)
        every = [data(k, shape, dtype, salt) for k in range(n)]
        grown = [data(k, (rows + k % 2, width), dtype, salt) for k in range(n)]
        run(
            checked(lambda: hvd.allgather(grown[r], name=name), dtype),
            lambda: np.concatenate([as_numpy(e) for e in grown]),
            f"torch allgather {dtype} {shape} name {name!r}",
            approx_values,
            name_refusal(name),
        )
        mine = every[r].clone()
        b_name = None if name is None else name + ".b"
        run(
            checked(lambda: (hvd.broadcast_(mine, root, name=b_name), mine)[1], dtype),
            lambda: as_numpy(every[root]),
            f"torch broadcast_ {dtype} root {root} name {b_name!r}",
            approx_values,
            name_refusal(b_name) + root_refusal(root, n),
        )
        split_arg = (
            torch.tensor(splits, dtype=torch.int64) if as_tensor and splits is not None else splits
        )

        def expected_alltoall():
            counts = splits if splits is not None else [rows // n] * n
            starts = np.cumsum([0] + list(counts))
            return np.concatenate(
                [as_numpy(every[k])[starts[r] : starts[r] + counts[r]] for k in range(n)]
            )

        run(
            checked(lambda: hvd.alltoall(every[r], splits=split_arg), dtype),
            expected_alltoall,
            f"torch alltoall {dtype} {shape} splits {splits}",
            approx_values,
            splits_refusal(rows, splits, n),
        )
        if dtype == torch.bool:
            return

        def expected_reducescatter():
            total = np.stack([as_numpy(e).astype(np.float64) for e in every]).sum(0) / n
            counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
            part = total[sum(counts[:r]) : sum(counts[:r]) + counts[r]]
            return np.trunc(part) if not dtype.is_floating_point else part

        run(
            checked(lambda: hvd.reducescatter(every[r], op=hvd.Average), dtype),
            expected_reducescatter,
            f"torch reducescatter {dtype} {shape}",
            approx_values,
        )

    prop()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main_tests(globals())
