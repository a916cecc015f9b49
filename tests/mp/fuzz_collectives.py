"""Run by tests/test_fuzz.py::test_collectives_return_numpys_answer_or_refuse_on_every_rank.

Property-based tests of every numpy-level collective's argument handling, on real ranks.

Every rank draws the same examples (hypothesis, derandomized) with its own data: random dtypes,
shapes, ops, scale factors, roots, splits, names, in place or not. The oracle knows from the
example alone whether the API takes it (name_refusal, root_refusal, splits_refusal: the rules
the API documents). A valid call must return what numpy computes from every rank's data; an
invalid one must raise InvalidArgumentError on every rank, for one of the reasons the example
has. Never a valid call refused, an invalid one accepted, another exception, a crash, a hang
(the subprocess timeout), or a different outcome per rank. After each example the ranks compare
outcomes, so they stay in lockstep.

argv[1]: the number of examples per collective."""

import sys

import numpy as np
from _harness import check, main_tests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import scaleout as so

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 40
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)

DTYPES = [
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
]
OPS = [so.Sum, so.Average, so.Min, so.Max, so.Product]
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
names = st.one_of(st.none(), st.text(max_size=10))
scales = st.sampled_from([1.0, 0.5, 2.0])


def data(rank: int, shape, dtype, salt: int) -> np.ndarray:
    """Rank `rank`'s input: small integers, so that every reduction is exact in every dtype."""
    rng = np.random.default_rng(1000 * salt + rank)
    return rng.integers(0, 3, size=shape).astype(dtype)


def agree(outcome: str, ok: bool, what: str) -> None:
    """Every rank had the same outcome, and each found its result right."""
    everyone = so.allgather_object((outcome, ok), name="fuzz.verdict")
    check(len({o for o, _ in everyone}) == 1, f"{what}: outcomes differ by rank: {everyone}")
    check(all(k for _, k in everyone), f"{what}: a wrong result: {everyone}")
    if len({o for o, _ in everyone}) != 1 or not all(k for _, k in everyone):
        raise AssertionError(what)  # stops hypothesis on every rank alike


# What the API refuses, from the arguments alone. Each returns the reasons an argument is
# invalid, as a word the InvalidArgumentError's message carries, so that a refusal for some
# other reason fails too; an empty list: valid.


def name_refusal(name) -> list:
    """A name is None (one is generated) or a non-empty string the core can compare whole:
    UTF-8 without NUL (a NUL would cut it short)."""
    if name is None:
        return []
    if not isinstance(name, str) or name == "" or "\0" in name:
        return ["name"]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return ["name"]
    return []


def root_refusal(root: int, n: int) -> list:
    """broadcast's root_rank is a rank of the job: 0 <= root < size."""
    return [] if 0 <= root < n else ["root rank"]


def splits_refusal(rows: int, splits, n: int) -> list:
    """alltoall without splits sends equal parts, so the first dimension must divide by the
    size; with splits, one non-negative count per rank, adding up to the first dimension."""
    if splits is None:
        return [] if rows % n == 0 else ["divisible"]
    splits = [int(s) for s in splits]
    reasons = []
    if len(splits) != n:
        reasons.append("entries")
    if any(s < 0 for s in splits):
        reasons.append("negative")
    if sum(splits) != rows:
        reasons.append("add up")
    return reasons


def run(call, expected, what: str, close=np.array_equal, refused_for=()):
    """Runs one example's call on every rank. refused_for: the reasons its arguments are invalid
    (empty: valid), each a word the refusal's message must carry one of."""
    try:
        got = call()
    except so.InvalidArgumentError as e:
        if not refused_for:
            agree("InvalidArgumentError", False, f"{what}: a valid call was refused: {e}")
        else:
            agree(
                "InvalidArgumentError",
                any(word in str(e) for word in refused_for),
                f"{what}: refused, but not for {list(refused_for)}: {e}",
            )
        return
    except Exception as e:  # noqa: BLE001
        agree(type(e).__name__, False, f"{what}: {type(e).__name__}: {e}")
        return
    if refused_for:
        agree("ok", False, f"{what}: accepted, though invalid ({list(refused_for)})")
        return
    want = expected()
    ok = close(got, want)
    agree(
        "ok", ok, f"{what}: got {np.asarray(got).ravel()[:6]}, want {np.asarray(want).ravel()[:6]}"
    )


def approx(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return (
        got.shape == want.shape
        and got.dtype == want.dtype
        and np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
    )


def test_allreduce(r, n):
    @SETTINGS
    @given(
        st.sampled_from(DTYPES),
        shapes,
        st.sampled_from(OPS),
        scales,
        scales,
        st.booleans(),
        names,
        st.integers(0, 10**6),
    )
    def prop(dtype, shape, op, pre, post, inplace, name, salt):
        every = [data(k, shape, dtype, salt) for k in range(n)]
        mine = every[r].copy()

        def expected():
            # As the core (and Horovod) scale integers: each scaled value is truncated, the
            # prescaled inputs before the reduction, the result after it; Average is a Sum
            # scaled by postscale / size.
            integer = np.issubdtype(dtype, np.integer)
            cut = np.trunc if integer else (lambda v: v)
            stacked = np.stack([cut(e.astype(np.float64) * pre) for e in every])
            reduced = {
                so.Sum: stacked.sum(0),
                so.Average: stacked.sum(0),
                so.Min: stacked.min(0),
                so.Max: stacked.max(0),
                so.Product: stacked.prod(0),
            }[op]
            factor = post / n if op == so.Average else post
            return cut(reduced * factor).astype(dtype)

        call = (
            (
                lambda: (
                    so.allreduce_(
                        mine, op=op, name=name, prescale_factor=pre, postscale_factor=post
                    ),
                    mine,
                )[1]
            )
            if inplace
            else (
                lambda: so.allreduce(
                    mine, op=op, name=name, prescale_factor=pre, postscale_factor=post
                )
            )
        )
        run(
            call,
            expected,
            f"allreduce {np.dtype(dtype).name} {shape} op {op} pre {pre} "
            f"post {post} inplace {inplace} name {name!r}",
            approx,
            name_refusal(name),
        )

    prop()


def test_allgather_and_broadcast(r, n):
    @SETTINGS
    @given(st.sampled_from(DTYPES), shapes, st.integers(-1, 4), names, st.integers(0, 10**6))
    def prop(dtype, shape, root, name, salt):
        rows = lambda k: (k % 2 + (shape[0] if shape else 0),) + tuple(shape[1:])  # noqa: E731
        every = [data(k, rows(k) if shape else (), dtype, salt) for k in range(n)]
        run(
            lambda: so.allgather(every[r], name=name),
            lambda: np.concatenate([np.atleast_1d(e) for e in every]),
            f"allgather {shape} name {name!r}",
            refused_for=name_refusal(name),
        )
        same = [data(k, shape, dtype, salt) for k in range(n)]
        b_name = None if name is None else name + ".b"
        run(
            lambda: so.broadcast(same[r], root, name=b_name),
            lambda: same[root],
            f"broadcast {shape} root {root} name {b_name!r}",
            refused_for=name_refusal(b_name) + root_refusal(root, n),
        )

    prop()


def test_alltoall_and_reducescatter(r, n):
    @SETTINGS
    @given(
        st.sampled_from(DTYPES),
        st.integers(0, 6),
        st.integers(0, 3),
        st.one_of(st.none(), st.lists(st.integers(-1, 4), min_size=0, max_size=4)),
        st.sampled_from([so.Sum, so.Average, so.Max]),
        st.integers(0, 10**6),
    )
    def prop(dtype, rows, width, splits, op, salt):
        shape = (rows, width)
        every = [data(k, shape, dtype, salt) for k in range(n)]

        def expected_alltoall():
            counts = splits if splits is not None else [rows // n] * n
            starts = np.cumsum([0] + list(counts))
            return np.concatenate([every[k][starts[r] : starts[r] + counts[r]] for k in range(n)])

        def call_alltoall():
            out = so.alltoall(every[r], splits=splits)
            return out[0] if splits is not None else out

        run(
            call_alltoall,
            expected_alltoall,
            f"alltoall {shape} splits {splits}",
            refused_for=splits_refusal(rows, splits, n),
        )

        def expected_reducescatter():
            stacked = np.stack([e.astype(np.float64) for e in every])
            total = {
                so.Sum: stacked.sum(0),
                so.Average: stacked.sum(0) / n,
                so.Max: stacked.max(0),
            }[op]
            counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
            start = sum(counts[:r])
            part = total[start : start + counts[r]]
            if np.issubdtype(dtype, np.integer):
                part = np.trunc(part)
            return part.astype(dtype)

        run(
            lambda: so.reducescatter(every[r], op=op),
            expected_reducescatter,
            f"reducescatter {shape} op {op}",
            approx,
        )

    prop()


if __name__ == "__main__":
    main_tests(globals())
