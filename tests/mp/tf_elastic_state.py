"""Run by
tests/test_tensorflow_elastic.py::test_states_commit_restore_sync_and_resume_at_another_size.

TensorFlow's elastic states on real ranks (Note [Keras elastic state]).

phase 'first': KerasState's commit/restore/sync of the model, Adam's slots and attributes (also
of a state saved before the optimizer's first step), per-rank variables (top-k residuals, seed
states, a partial aggregation window), TensorFlowState eagerly and in a TF1 session,
ObjectState in both call styles; then durable commits, and rank 0 writes what a resumed job must
find, and the weights one more step on data every rank shares must give.
phase 'second' (another number of ranks, fresh objects): resumes from the newest commit, takes
that step, then the Keras callbacks in fit (commits, state.batch and state.epoch, the shortened
epoch).

argv: phase, a directory for the stores (one per host) and the expected values."""

import socket
import sys
from pathlib import Path

import cloudpickle
import keras
import numpy as np
from _harness import check, check_close, expect_error, finish
from tf_common import tf

import scaleout.tensorflow as tfhvd
import scaleout.tensorflow.keras as hvd
from scaleout._commit_store import CommitStore

hvd.init()
r, n = hvd.rank(), hvd.size()
phase, directory = sys.argv[1], Path(sys.argv[2])
FEATURES, B = 5, 4
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model(seed, dropout=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh")]
    if dropout:
        layers.append(keras.layers.Dropout(0.3))
    layers += [keras.layers.BatchNormalization(), keras.layers.Dense(3)]
    return keras.Sequential(layers)


def compiled(model, optimizer, **options):
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer, **options), loss=LOSS)
    return model


def batch(seed, rows=B):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(rows, FEATURES)).astype(np.float32),
        rng.integers(0, 3, rows).astype(np.int32),
    )


def values(variables):
    return [np.array(v.numpy()) for v in variables]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def everywhere_alike(arrays, what):
    """The same values on every rank."""
    rows = hvd.allgather_object(arrays, name=what)
    check(all(same(rows[0], row) for row in rows), f"{what}: rank 0's on every rank")


def per_rank(variables):
    return [v for v in variables if getattr(v, "_scaleout_per_rank", False)]


def store():
    return CommitStore(directory / socket.gethostname()) if hvd.local_rank() == 0 else None


def construction():
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    expect_error(
        ValueError,
        lambda: hvd.elastic.KerasState(unbuilt),
        "Model must be built first",
        what="an unbuilt model",
    )
    expect_error(
        ValueError,
        lambda: hvd.elastic.KerasState(make_model(0)),
        "optimizer",
        what="a model without an optimizer",
    )


def keras_state():
    """Returns the state of an Adam model, synced and committed, for the durable part."""
    model = compiled(make_model(seed=r), keras.optimizers.Adam(0.01 * (r + 1)))
    optimizer = model.optimizer
    # Made before the first step: Keras has not made Adam's slots yet.
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    state.sync()
    everywhere_alike(values(model.weights), "sync: the model")
    everywhere_alike(values(optimizer.variables), "sync: the optimizer (learning rate)")
    check_close(float(optimizer.learning_rate), 0.01, "sync: rank 0's learning rate")
    synced = values(model.weights)
    model.train_on_batch(*batch(r))
    state.restore()
    check(same(values(model.weights), synced), "restore to a save before the first step: model")
    check(
        int(optimizer.iterations) == 0
        and all(not np.any(v) for v in values(optimizer.variables[2:])),
        "restore to a save before the first step: no steps, Adam's slots zero",
    )

    for step in range(2):
        model.train_on_batch(*batch(10 * r + step))
    state.batch = 2
    state.commit()
    committed_model, committed_optimizer = values(model.weights), values(optimizer.variables)
    for step in range(2):
        model.train_on_batch(*batch(20 + r + step))
    state.batch, state.epoch = 5, 1
    check(not same(values(optimizer.variables), committed_optimizer), "the steps moved Adam")
    state.restore()
    check(same(values(model.weights), committed_model), "restore: the committed model")
    check(
        same(values(optimizer.variables), committed_optimizer),
        "restore: the committed Adam slots and iteration count",
    )
    check(state.batch == 2 and state.epoch == 0, "restore: the committed attributes")
    return state


def topk_and_seed_states():
    """Per-rank variables: kept by save/restore, left alone by sync."""
    model = compiled(
        make_model(seed=100 + r, dropout=True),
        keras.optimizers.SGD(0.1, momentum=0.9),
        compression=hvd.Compression.topk(0.25),
    )
    optimizer = model.optimizer
    state = hvd.elastic.KerasState(model)
    state.sync()
    model.train_on_batch(*batch(30 + r))
    residuals = per_rank(optimizer.variables)
    seeds = [v for v in model.variables if all(v is not w for w in model.weights)]
    check(len(residuals) > 1 and len(seeds) == 1, "top-k residuals and a seed state exist")
    if n > 1:
        gathered = hvd.allgather_object(values(residuals[1:]), name="residuals")
        check(not same(gathered[0], gathered[1]), "the residuals differ between ranks")
    state.commit()
    mine, my_seeds = values(residuals), values(seeds)
    model.train_on_batch(*batch(40 + r))
    state.restore()
    check(same(values(residuals), mine), "restore: this rank's own residuals")
    state.sync()
    check(same(values(residuals), mine), "sync: this rank's residuals, not rank 0's")
    check(same(values(seeds), my_seeds), "sync: this rank's seed state, not rank 0's")
    everywhere_alike(values(model.weights), "sync of a top-k model: the model")
    if n > 1:
        gathered = hvd.allgather_object(my_seeds, name="seeds")
        check(not same(gathered[0], gathered[1]), "the seed states differ between ranks")


def aggregation_window():
    """A commit in the middle of a backward_passes_per_step window rolls back exactly."""
    model = compiled(
        make_model(seed=200), keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2
    )
    state = hvd.elastic.KerasState(model)
    state.sync()
    model.train_on_batch(*batch(50 + r))  # the first half of a window: no update yet
    state.commit()
    model.train_on_batch(*batch(60 + r))  # the update
    after = values(model.weights)
    model.train_on_batch(*batch(70 + r))  # half of the next window
    state.restore()
    model.train_on_batch(*batch(60 + r))
    check(
        same(values(model.weights), after),
        "restore in a window: the same update again (the window's sums rolled back)",
    )


def tensorflow_states():
    a = tf.Variable(np.full(3, r, np.float32))
    b = tf.Variable(np.int64(10 * r))
    state = tfhvd.elastic.TensorFlowState([a, b], step=r)
    state.sync()
    check(
        np.array_equal(a.numpy(), np.zeros(3)) and int(b.numpy()) == 0 and state.step == 0,
        "TensorFlowState.sync: rank 0's variables and attributes",
    )
    a.assign_add(np.ones(3, np.float32))
    state.step = 1
    state.commit()
    a.assign(np.full(3, 9, np.float32))
    b.assign(7)
    state.step = 2
    state.restore()
    check(
        np.array_equal(a.numpy(), np.ones(3)) and int(b.numpy()) == 0 and state.step == 1,
        "TensorFlowState.restore: the committed variables and attributes",
    )

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(np.full(2, r + 1, np.float32), name="v")
        increment = v.assign_add(np.ones(2, np.float32))
        overwrite = v.assign(np.full(2, 9, np.float32))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            state = tfhvd.elastic.TensorFlowState(session=session, step=r)  # global variables
            state.sync()
            check(
                np.array_equal(session.run(v), np.ones(2)) and state.step == 0,
                "TF1 TensorFlowState.sync: rank 0's variable",
            )
            session.run(increment)
            state.commit()
            session.run(overwrite)
            state.restore()
            check(
                np.array_equal(session.run(v), np.full(2, 2)),
                "TF1 TensorFlowState.restore: the committed variable",
            )


def object_states():
    short = tfhvd.elastic.ObjectState(epoch=r)
    short.sync()
    check(short.epoch == 0, "ObjectState(epoch=...): synced")
    horovod = tfhvd.elastic.ObjectState(tfhvd.broadcast_object_fn(), tfhvd.rank, epoch=r)
    horovod.sync()
    horovod.epoch = 4
    horovod.commit()
    check(horovod.epoch == 4, "ObjectState(bcast_object, get_rank, ...): synced and committed")


COMMON = batch(99, rows=8)  # the same on every rank: its averaged gradient is the same at any size


if phase == "first":
    construction()
    state = keras_state()
    topk_and_seed_states()
    aggregation_window()
    tensorflow_states()
    object_states()
    state.attach_store(store())
    state.epoch, state.batch = 3, 2
    state.commit()
    state.commit()
    expected = {
        "model": values(state.model.weights),
        "optimizer": values(state.model.optimizer.variables),
    }
    state.model.train_on_batch(*COMMON)  # not committed
    expected["next"] = values(state.model.weights)
    if r == 0:
        (directory / "expected.pkl").write_bytes(cloudpickle.dumps(expected))
else:
    model = compiled(make_model(seed=300 + r), keras.optimizers.Adam(0.5))
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    state.attach_store(store())
    check(state.resume(), "a commit to resume from")
    expected = cloudpickle.loads((directory / "expected.pkl").read_bytes())
    check(same(values(model.weights), expected["model"]), "resumed: the committed model")
    check(
        same(values(model.optimizer.variables), expected["optimizer"]),
        "resumed: the committed Adam (iterations, learning rate, slots)",
    )
    check(state.epoch == 3 and state.batch == 2, "resumed: the attributes")
    model.train_on_batch(*COMMON)
    check_close(
        np.concatenate([w.ravel() for w in values(model.weights)]),
        np.concatenate([w.ravel() for w in expected["next"]]),
        "the resumed optimizer takes the step the committed one would",
        rtol=1e-5,
    )
finish()
