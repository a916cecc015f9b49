"""Run by tests/test_endpoint_servers.py::test_results_identical_for_any_number_of_endpoint_servers.

Endpoint servers: large allreduces split across K servers give exactly the K=1 results."""

import json
import sys

import numpy as np
from _harness import check, check_close, main

import scaleout as so


def run():
    r, n = so.rank(), so.size()
    k = int(sys.argv[1])
    p = so.placement()
    check(
        p["endpoint_servers"] == k, f"placement reports {p['endpoint_servers']} servers, want {k}"
    )
    rng = np.random.default_rng(7 + r)
    # Integer-valued floats: every sum is exact, so any wrong part shows.
    big = rng.integers(-1000, 1000, size=(1 << 20) + 13).astype(np.float64)
    got = so.allreduce(big, op=so.Sum, name="big")
    want = sum(
        np.random.default_rng(7 + q).integers(-1000, 1000, size=(1 << 20) + 13) for q in range(n)
    ).astype(np.float64)
    check(np.array_equal(got, want), f"split allreduce exact with K={k}")
    fused = [
        so.allreduce_async(np.full(70000, float(r + i), np.float32), op=so.Sum, name=f"f{i}")
        for i in range(12)
    ]
    for i, h in enumerate(fused):
        check_close(
            so.synchronize(h),
            np.full(70000, float(sum(q + i for q in range(n)))),
            f"fused split tensor {i}",
        )
    half = so.allreduce(np.full(600000, 0.5 * (r + 1), np.float16), name="h")
    check_close(half, np.full(600000, 0.5 * (n + 1) / 2), f"float16 average K={k}", rtol=1e-3)
    if r == 0:
        print("DIGEST", json.dumps(float(np.sum(got[::97]))))


if __name__ == "__main__":
    main(run)
