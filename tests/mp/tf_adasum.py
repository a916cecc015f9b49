"""Run by tests/test_adasum.py::test_tensorflow_v1_optimizer_combines_variable_changes.

DistributedOptimizer(tf1_optimizer, op=Adasum) (Note [TF1 Adasum optimizer]): the wrapped
optimizer steps locally, and every backward_passes_per_step-th call the variables' changes are
combined with Horovod's Adasum tree; checked against numpy eagerly and in a TF1 graph run by a
Session, with momentum and with two passes per step; Horovod's errors."""

import keras
import numpy as np
from _harness import check, check_close, expect_error, main
from tf_common import so, tf

import scaleout.tensorflow as hvd


def pair(a, b):
    dot, na, nb = a @ b, a @ a, b @ b
    return (1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b


def tree(vectors):
    while len(vectors) > 1:
        vectors = [pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def grads(q, step):
    rng = np.random.default_rng(100 * step + q)
    return [rng.standard_normal((3, 2)), rng.standard_normal(4)]


START = [np.arange(6.0).reshape(3, 2) / 10, np.ones(4)]


def expected(n, steps, passes, lr=0.1, momentum=0.0):
    """Every rank's local SGD (with momentum) from the same start, changes combined per tensor
    every `passes` calls. (TF1 optimizers hold their hyper-parameters as float32.)"""
    lr, momentum = float(np.float32(lr)), float(np.float32(momentum))
    values = [[w.copy() for w in START] for _ in range(n)]
    bufs = [[np.zeros_like(w) for w in START] for _ in range(n)]
    start = [w.copy() for w in START]
    for step in range(steps):
        for q in range(n):
            for i, g in enumerate(grads(q, step)):
                bufs[q][i] = momentum * bufs[q][i] + g
                values[q][i] = values[q][i] - lr * bufs[q][i]
        if step % passes == passes - 1:
            for i in range(len(START)):
                combined = tree([(values[q][i] - start[i]).ravel() for q in range(n)])
                start[i] = start[i] + combined.reshape(start[i].shape)
                for q in range(n):
                    values[q][i] = start[i].copy()
    return values


def run():
    r, n = so.rank(), so.size()
    if n & (n - 1):
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum
        )
        v = tf.Variable(np.ones(3))
        expect_error(
            NotImplementedError,
            lambda: opt.apply_gradients([(tf.ones(3, tf.float64), v)]),
            "power of",
            what="Adasum on a number of ranks not a power of two",
        )
        return
    # Eagerly: plain SGD, momentum, two passes per step.
    for momentum, passes in ((0.0, 1), (0.9, 1), (0.0, 2)):
        variables = [tf.Variable(w) for w in START]
        base = (
            tf.compat.v1.train.MomentumOptimizer(0.1, momentum)
            if momentum
            else tf.compat.v1.train.GradientDescentOptimizer(0.1)
        )
        opt = hvd.DistributedOptimizer(
            base, op=hvd.Adasum, backward_passes_per_step=passes, name=f"eager{momentum}{passes}"
        )
        check(opt.get_name().startswith("eager"), "the name given")
        for step in range(4):
            opt.apply_gradients([(tf.constant(g), v) for g, v in zip(grads(r, step), variables)])
        for v, want in zip(variables, expected(n, 4, passes, momentum=momentum)[r]):
            check_close(
                v.numpy(),
                want,
                f"eager momentum={momentum} passes={passes}",
                rtol=1e-10,
                atol=1e-12,
            )
    check(
        hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum
        ).get_name()
        == "DistributedDeltaGradientDescentOptimizer",
        "Horovod's default name",
    )
    # A TF1 graph run by a Session.
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.Variable(w) for w in START]
        fed = [tf.compat.v1.placeholder(tf.float64, w.shape) for w in START]
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum
        )
        train = opt.apply_gradients(list(zip(fed, variables)))
        init = [
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
        ]
        with tf.compat.v1.Session() as session:
            session.run(init)
            for step in range(3):
                session.run(train, dict(zip(fed, grads(r, step))))
            got = session.run(variables)
    for v, want in zip(got, expected(n, 3, 1)[r]):
        check_close(v, want, "TF1 graph", rtol=1e-10, atol=1e-12)
    # Horovod's errors.
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            op=hvd.Adasum,
            backward_passes_per_step=2,
            average_aggregated_gradients=True,
        ),
        "average_aggregated_gradients",
        what="Adasum with averaged aggregation",
    )
    expect_error(
        ValueError,
        lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum),
        "Adasum",
        what="Adasum with a Keras optimizer",
    )


main(run)
