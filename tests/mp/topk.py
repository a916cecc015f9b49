"""Run by tests/test_topk.py::test_exchange_and_error_feedback.

Top-k sparsification with error feedback (Note [Top-k sparsification]) at the numpy level, the
one implementation every front end uses: the result against a numpy evaluation from every
rank's gradient, error feedback conserving the gradient sum over steps, dense warmup, momentum
correction with factor masking, Sum and scale factors."""

import numpy as np
from _harness import check, check_close, main_tests

import scaleout as so
from scaleout._native import Average, Sum
from scaleout._topk import Momentum, TopK, TopKExchange, topk_count


def everyone(x):
    """Every rank's array, in rank order."""
    return so.allgather(np.asarray(x)[None])


def top(x, k):
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def run(exchange, name, grad, residual, step, velocity=None, momentum=None):
    out = np.empty(grad.size, residual.dtype)
    pending = exchange.start(name, grad, residual, step, velocity, momentum, out)
    exchange.finish_all([(pending, out)])
    return out


def test_one_step_matches_numpy(r, n):
    for size in (1, 7, 1000, 100_000):  # both selection paths (direct and sampled)
        for density in (0.01, 0.3, 1.0):
            rng = np.random.default_rng(1000 * r + size)
            g = rng.standard_normal(size)
            residual = np.zeros(size)
            got = run(
                TopKExchange(TopK(density), Average, 1.0, 1.0),
                f"one.{size}.{density}",
                g,
                residual,
                0,
            )
            k = topk_count(size, density)
            sent = [top(x, k) for x in everyone(g)]
            check_close(got, sum(sent) / n, f"size {size} density {density}: mean of the top-k")
            check_close(
                residual, g - sent[r], f"size {size} density {density}: residual", rtol=0, atol=0
            )
            check(
                np.count_nonzero(residual == 0) >= k,
                f"size {size} density {density}: k entries cleared",
            )


def test_error_feedback_conserves_the_gradient_sum(r, n):
    """Over many steps, what was delivered plus what every rank still holds is everything the
    ranks put in: nothing is lost, only delayed."""
    size, steps = 5000, 40
    exchange = TopKExchange(TopK(0.01), Average, 1.0, 1.0)
    residual = np.zeros(size)
    delivered = np.zeros(size)
    put_in = np.zeros(size)
    rng = np.random.default_rng(r)
    for step in range(steps):
        g = rng.standard_normal(size) * (1 + step % 3)
        put_in += g
        delivered += run(exchange, "conserve", g, residual, step) * n  # Average: undo 1/n
    total_in = everyone(put_in).sum(0)
    held = everyone(residual).sum(0)
    check_close(
        delivered + held,
        total_in,
        "delivered + residuals == gradients put in",
        rtol=1e-9,
        atol=1e-9,
    )
    # and the residual is small next to what was put in (the big entries do go out)
    check(np.abs(residual).max() < np.abs(put_in).max(), "the residual does not grow unbounded")


def test_warmup_steps_are_dense(r, n):
    size = 300
    exchange = TopKExchange(TopK(0.01, warmup_steps=2), Average, 1.0, 1.0)
    residual = np.zeros(size)
    for step in range(3):
        g = np.random.default_rng(10 * r + step).standard_normal(size)
        got = run(exchange, "warm", g, residual, step)
        everyone_g = everyone(g)
        if step < 2:
            check_close(got, everyone_g.mean(0), f"step {step}: dense average", rtol=1e-12)
            check(not residual.any(), f"step {step}: nothing held back")
        else:
            check_close(got, sum(top(x, 3) for x in everyone_g) / n, "after warmup: top-k")


def test_sum_op_and_scale_factors(r, n):
    g = np.random.default_rng(r).standard_normal(2000)
    residual = np.zeros(2000)
    got = run(TopKExchange(TopK(0.05), Sum, 0.5, 3.0), "sum", g, residual, 0)
    check_close(got, sum(top(x, 100) for x in everyone(g)) * 1.5, "Sum with prescale*postscale")


def test_momentum_correction_and_factor_masking(r, n):
    """u = m u + g; v += u; send top-k of v; clear v and u where sent (DGC)."""
    size, m = 400, 0.9
    for nesterov in (False, True):
        exchange = TopKExchange(TopK(0.05), Average, 1.0, 1.0)
        v, u = np.zeros(size), np.zeros(size)
        ref_v, ref_u = np.zeros(size), np.zeros(size)
        for step in range(4):
            g = np.random.default_rng(100 * r + step).standard_normal(size)
            got = run(exchange, f"dgc.{nesterov}", g, v, step, u, Momentum(m, nesterov))
            ref_u = m * ref_u + g
            ref_v += g + m * ref_u if nesterov else ref_u
            idx = np.argsort(-np.abs(ref_v), kind="stable")[:20]
            sent = np.zeros(size)
            sent[idx] = ref_v[idx]
            ref_v[idx] = 0
            ref_u[idx] = 0
            check_close(got, everyone(sent).mean(0), f"nesterov={nesterov} step {step}: result")
            check_close(v, ref_v, f"nesterov={nesterov} step {step}: velocity residual")
            check_close(u, ref_u, f"nesterov={nesterov} step {step}: masked momentum")


main_tests(globals())
