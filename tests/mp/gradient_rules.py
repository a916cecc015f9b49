"""Run by tests/test_one_path.py::test_torch_and_tensorflow_gradients_follow_one_table.

The gradient of every differentiable collective, in torch and in TensorFlow (eager and inside
tf.function), against one set of expected values: Horovod's definitions, computed here in numpy.

Each rank's loss is sum(output * W_r) with W_r = weights(r, output shape), so the output gradient
on rank r is W_r and every expectation follows from the definition.
"""

import numpy as np
import tensorflow as tf
import torch
from _harness import check_close, expect_error, main_tests

import scaleout.tensorflow as htf
import scaleout.torch as hth


def weights(r, shape):
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.1 + r


def both(r, name, x, forward, out_shape):
    """Input gradients (torch, TF eager, TF in tf.function) of sum(forward(x) * W_r)."""
    xt = torch.tensor(x, requires_grad=True)
    yt = forward("torch", xt, f"{name}.torch")
    yt = yt[0] if isinstance(yt, tuple) else yt
    (yt * torch.tensor(weights(r, out_shape(yt.shape)))).sum().backward()
    got = {"torch": xt.grad.numpy()}

    def tf_grad(v, label):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = forward("tf", v, label)
            y = y[0] if isinstance(y, tuple) else y
            loss = tf.reduce_sum(y * tf.constant(weights(r, out_shape(tuple(y.shape)))))
        return tape.gradient(loss, v)

    got["tf eager"] = tf_grad(tf.constant(x), f"{name}.tf").numpy()
    got["tf.function"] = tf.function(lambda v: tf_grad(v, f"{name}.tff"))(tf.constant(x)).numpy()
    return got


def expect(got, want, what):
    for mode, g in got.items():
        check_close(g, want, f"{mode}: {what}")


def mod(framework):
    return hth if framework == "torch" else htf


def test_allreduce(r, n):
    for op, pre, post in [("Sum", 1.0, 1.0), ("Average", 1.0, 1.0), ("Sum", 2.0, 0.25)]:
        x = np.full((3, 2), float(r))
        got = both(
            r,
            f"ar.{op}.{pre}",
            x,
            lambda f, v, nm: mod(f).allreduce(
                v, op=getattr(mod(f), op), prescale_factor=pre, postscale_factor=post, name=nm
            ),
            lambda s: (3, 2),
        )
        ws = np.stack([weights(k, (3, 2)) for k in range(n)])
        want = (ws.sum(0) if op == "Sum" else ws.mean(0)) * pre * post
        expect(got, want, f"allreduce {op} pre {pre} post {post}")


def test_allgather(r, n):
    total = n * (n + 1) // 2
    got = both(
        r,
        "ag",
        np.ones((r + 1, 2)),
        lambda f, v, nm: mod(f).allgather(v, name=nm),
        lambda s: (total, 2),
    )
    off = r * (r + 1) // 2
    want = np.mean([weights(k, (total, 2)) for k in range(n)], 0)[off : off + r + 1]
    expect(got, want, "allgather: own rows of the Average of the output gradients")


def test_broadcast(r, n):
    root = n - 1
    got = both(
        r, "bc", np.ones(4), lambda f, v, nm: mod(f).broadcast(v, root, name=nm), lambda s: (4,)
    )
    want = np.mean([weights(k, (4,)) for k in range(n)], 0) if r == root else np.zeros(4)
    expect(got, want, "broadcast: Average on the root, zeros elsewhere")


def test_reducescatter(r, n):
    rows = lambda k: 2 if k == 0 else 1  # noqa: E731  (n + 1 rows: rank 0 gets two)
    for op in ("Sum", "Average"):
        got = both(
            r,
            f"rs.{op}",
            np.ones((n + 1, 2)),
            lambda f, v, nm: mod(f).reducescatter(v, op=getattr(mod(f), op), name=nm),
            lambda s: (rows(r), 2),
        )
        want = np.concatenate([weights(k, (rows(k), 2)) for k in range(n)])
        if op == "Sum":
            want = want * n
        expect(got, want, f"reducescatter {op}: allgather of the gradients (x size for Sum)")


def test_alltoall(r, n):
    splits = [j + 1 for j in range(n)]
    got = both(
        r,
        "a2a",
        np.ones((sum(splits), 2)),
        lambda f, v, nm: mod(f).alltoall(v, splits=splits, name=nm),
        lambda s: (n * (r + 1), 2),
    )
    want = np.concatenate(
        [weights(j, (n * (j + 1), 2))[r * (j + 1) : (r + 1) * (j + 1)] for j in range(n)]
    )
    expect(got, want, "alltoall: the gradients travel back")


def test_no_gradient_for_max(r, n):
    # one error class for both frameworks: torch users catch ValueError/RuntimeError, TensorFlow
    # code NotImplementedError
    for exc in (hth.InvalidArgumentError, NotImplementedError):
        x = torch.ones(2, requires_grad=True)
        y = hth.allreduce(x, op=hth.Max, name=f"max.torch.{exc.__name__}")
        expect_error(
            exc,
            lambda: y.sum().backward(),
            "Average and Sum",
            "Max",
            what="torch: no gradient for Max",
        )

        def tf_max():
            v = tf.ones(2)
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = tf.reduce_sum(htf.allreduce(v, op=htf.Max))
            return tape.gradient(loss, v)

        expect_error(exc, tf_max, "Average and Sum", "Max", what="TensorFlow: no gradient for Max")


if __name__ == "__main__":
    main_tests(globals())
