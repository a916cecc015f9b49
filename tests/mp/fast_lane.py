"""Run by tests/test_fast_lane.py::test_the_lane_gives_what_negotiation_gives.

Note [Fast lane]: small synchronous allreduces that every rank has negotiated before run with no
negotiation. The results are the negotiated path's whatever else happens around them: other
work still in negotiation, a late rank, collectives of other kinds between, two threads
submitting at once, ops and dtypes, and a rank whose tensor no longer matches the others' gets
the mismatch error it always got. Argument: "on" (the default lane) or "off"
(SCALEOUT_FAST_LANE=0). Prints "all checks passed" when every check holds."""

import sys
import threading
import time

import numpy as np
from _harness import check, check_close, expect_error, finish

import scaleout as so

so.init()
r, n = so.rank(), so.size()
lane_on = sys.argv[1] == "on"
rng = np.random.default_rng(7)  # the same draws on every rank

OPS = {
    "sum": (so.Sum, lambda xs: np.sum(xs, axis=0)),
    "average": (so.Average, lambda xs: np.mean(xs, axis=0)),
    "min": (so.Min, lambda xs: np.min(xs, axis=0)),
    "max": (so.Max, lambda xs: np.max(xs, axis=0)),
    "product": (so.Product, lambda xs: np.prod(xs, axis=0)),
}
DTYPES = (np.float32, np.float64, np.int32, np.int64)
SHAPES = ((4,), (1024,), (16, 8), (3, 5, 7))


def rank_input(rank: int, step: int, dtype, shape) -> np.ndarray:
    # Small integers: every op's result is exact in every dtype.
    size = int(np.prod(shape))
    return ((np.arange(size) + rank + step) % 3 + 1).astype(dtype).reshape(shape)


def lane_calls() -> int:
    return so.stats()["collectives"]["allreduce"]["lane_calls"]


pending = None
for step in range(400):
    op_name = list(OPS)[rng.integers(len(OPS))]
    dtype = DTYPES[rng.integers(len(DTYPES))]
    shape = SHAPES[rng.integers(len(SHAPES))]
    op, reduce = OPS[op_name]
    name = f"lane.{op_name}.{np.dtype(dtype).name}.{len(shape)}"
    if step % 7 == 3:  # other work in negotiation while the small one is submitted
        pending = so.allreduce_async_(np.ones(1 << 16, np.float32), name="lane.other", op=so.Sum)
    if step % 11 == 5 and r == step % n:  # a late rank: the others give up waiting on the lane
        time.sleep(0.002)
    x = rank_input(r, step, dtype, shape)
    so.allreduce_(x, name=name, op=op)
    want = reduce([rank_input(k, step, dtype, shape) for k in range(n)])
    if op_name == "average" and np.issubdtype(dtype, np.integer):
        want = (np.sum([rank_input(k, step, dtype, shape) for k in range(n)], axis=0) // n).astype(
            dtype
        )
    check_close(x, want, f"step {step}: {name} {shape}", rtol=0, atol=0)
    if pending is not None:
        got = so.synchronize(pending)
        check_close(got, np.full(1 << 16, n, np.float32), f"step {step}: the other allreduce")
        pending = None
    if step % 13 == 6:
        so.barrier()
        b = so.broadcast(np.full(5, step + r, np.int64), step % n, name="lane.bcast")
        check_close(b, np.full(5, step + step % n), f"step {step}: broadcast between")

# Two threads at once, each its own names in the same order on every rank.
errors = []


def worker(t: int) -> None:
    try:
        for i in range(100):
            x = np.full(256, r + 1 + t, np.float32)
            so.allreduce_(x, name=f"lane.thread{t}", op=so.Sum)
            want = sum(k + 1 + t for k in range(n))
            if not np.all(x == want):
                errors.append(f"thread {t} call {i}: {x[:4]}, want {want}")
    except Exception as e:  # noqa: BLE001
        errors.append(f"thread {t}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(not errors, f"threads: {errors[:3]}")

# A tensor that no longer matches the others' is a mismatch on every rank, lane or no lane.
for _ in range(3):
    so.allreduce_(np.ones(4, np.float32), name="lane.mismatch", op=so.Sum)
shape = (2, 2) if r == n - 1 else (4,)
expect_error(
    so.MismatchError,
    lambda: so.allreduce_(np.ones(shape, np.float32), name="lane.mismatch", op=so.Sum),
    "lane.mismatch",
    "shape",
    what="a changed shape on one rank",
)

# Back to back, nothing between the calls: the lane's own case. How many of the loop above took
# it depends on timing (ranks that outnumber the cores are often more than the lane's give-up
# time apart, and then negotiate); here nearly all do, and none would mean it never agrees.
before = lane_calls()
x = np.ones(64, np.float32)
for i in range(300):
    x[:] = r + 1
    so.allreduce_(x, name="lane.loop", op=so.Sum)
    if not np.all(x == n * (n + 1) / 2):
        check(False, f"back to back, call {i}: {x[:4]}")
        break
ran = lane_calls()
print(f"rank {r}: {ran} allreduces on the lane, {ran - before} of 300 back to back", flush=True)
if lane_on:
    check(ran - before > 0, "back-to-back small synchronous allreduces ran on the lane")
else:
    check(ran == 0, f"SCALEOUT_FAST_LANE=0: nothing ran on the lane, got {ran}")
# Calls run on the lane at once hold only their name while they run: nothing is left behind.
left = so.stats()
check(
    (left["handles"], left["names_in_flight"]) == (0, 0),
    f"handles and names in flight after the loop: {left['handles']}, {left['names_in_flight']}",
)
so.shutdown()
finish()
