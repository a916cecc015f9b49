"""Run by tests/test_adasum.py::test_adasum_matches_horovods_rule.

op=Adasum (Note [Adasum]) against a numpy evaluation of Horovod's rule: a binary tree over
the ranks, (0, 1), (2, 3), ... first, each pair (a, b) per tensor into
(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b. numpy, torch and TensorFlow front ends; the same
bits on every rank; the errors Horovod gives (3 ranks, process sets, integer tensors)."""

import importlib
import os

import numpy as np
from _harness import check, check_close, expect_error, finish

import scaleout as so

so.init(process_sets="dynamic")
r, n = so.rank(), so.size()
power_of_two = n & (n - 1) == 0


def pair(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, na, nb = a @ b, a @ a, b @ b
    ca = 1 - dot / (2 * na) if na >= np.sqrt(np.finfo(np.float64).tiny) else 1.0
    cb = 1 - dot / (2 * nb) if nb >= np.sqrt(np.finfo(np.float64).tiny) else 1.0
    return ca * a + cb * b


def tree(vectors):
    while len(vectors) > 1:
        vectors = [pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def contribution(q, count, seed):
    rng = np.random.default_rng(seed * 100 + q)
    return rng.standard_normal(count)


if power_of_two:
    # One tensor, several dtypes; the result is every rank's alike, and close to the reference
    # (each level rounds to the dtype).
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 2e-2)):
        x = contribution(r, 1001, 1).astype(dtype)
        got = so.allreduce(x, op=so.Adasum, name=f"ada.{np.dtype(dtype).name}")
        want = tree([contribution(q, 1001, 1).astype(dtype) for q in range(n)])
        check(got.dtype == dtype, f"Adasum keeps {np.dtype(dtype).name}")
        check_close(
            got.astype(np.float64), want, f"Adasum {np.dtype(dtype).name}", rtol=tol, atol=tol
        )
        digests = so.allgather_object(got.tobytes())
        check(all(d == digests[0] for d in digests), f"same bits everywhere ({dtype})")
    # Known cases: equal vectors give themselves (their average), orthogonal ones their sum.
    same = so.allreduce(np.full(8, 3.0), op=so.Adasum, name="ada.same")
    check_close(same, np.full(8, 3.0), "Adasum of equal vectors is the vector")
    basis = np.zeros(n)
    basis[r] = 1.0
    check_close(
        so.allreduce(basis, op=so.Adasum, name="ada.orth"),
        np.ones(n),
        "Adasum of orthogonal vectors is their sum",
    )
    # Fused tensors: each tensor has its own coefficients, as if reduced alone.
    handles = [
        so.allreduce_async(
            contribution(r, 10 + 7 * k, 2 + k) * (k + 1), op=so.Adasum, name=f"ada.fused.{k}"
        )
        for k in range(6)
    ]
    for k, h in enumerate(handles):
        want = tree([contribution(q, 10 + 7 * k, 2 + k) * (k + 1) for q in range(n)])
        check_close(so.synchronize(h), want, f"fused Adasum tensor {k}", rtol=1e-12, atol=1e-12)
    # Scale factors apply before and after; no averaging is implied.
    got = so.allreduce(
        contribution(r, 50, 9),
        op=so.Adasum,
        prescale_factor=2.0,
        postscale_factor=0.25,
        name="ada.scaled",
    )
    check_close(
        got,
        0.25 * tree([2.0 * contribution(q, 50, 9) for q in range(n)]),
        "Adasum with scale factors",
        rtol=1e-12,
        atol=1e-12,
    )
    # torch and TensorFlow reach the same core (TensorFlow where the test asks: importing it
    # costs a rank 6.5 s of CPU, and the data path under both front ends is the same).
    for framework, tensor_of, seed in (("torch", "tensor", 11), ("tensorflow", "constant", 12)):
        if framework == "tensorflow" and os.environ.get("ADASUM_TENSORFLOW") != "1":
            continue
        try:
            lib = importlib.import_module(framework)
            hvd = importlib.import_module(f"scaleout.{framework}")
        except ImportError:
            continue
        t = hvd.allreduce(
            getattr(lib, tensor_of)(contribution(r, 64, seed)),
            op=hvd.Adasum,
            name=f"ada.{framework}",
        )
        check_close(
            t.numpy(),
            tree([contribution(q, 64, seed) for q in range(n)]),
            f"{framework} Adasum",
            rtol=1e-12,
            atol=1e-12,
        )
    # Errors: integer tensors; reducescatter; a process set.
    expect_error(
        so.InvalidArgumentError,
        lambda: so.allreduce(np.ones(4, np.int32), op=so.Adasum, name="ada.int"),
        "Adasum reduces float16, bfloat16, float32 and float64 tensors, not int32",
    )
    expect_error(
        so.InvalidArgumentError,
        lambda: so.reducescatter(np.ones(4 * n), op=so.Adasum, name="ada.rs"),
        "Adasum is an allreduce op",
    )
    ps = so.add_process_set([0, 1] if n > 2 else [0])  # not every rank: that is the global set
    if ps.included():
        expect_error(
            NotImplementedError,
            lambda: so.allreduce(np.ones(4), op=so.Adasum, process_set=ps, name="ada.ps"),
            "Adasum does not support non-global process sets yet",
        )
    so.remove_process_set(ps)
else:
    # As Horovod: NotImplementedError on every rank, at the call.
    expect_error(
        NotImplementedError,
        lambda: so.allreduce(np.ones(4), op=so.Adasum, name="ada.three"),
        "running Adasum with non-power of 2 ranks is not supported yet",
        f"this job has {n}",
    )
    expect_error(
        so.NotYetImplementedError, lambda: so.allreduce(np.ones(4), op=so.Adasum, name="ada.three2")
    )
so.barrier()
finish()
