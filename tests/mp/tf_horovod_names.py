"""Run by tests/test_timeline.py::test_tensorflow_tensors_have_horovods_names.

The names TensorFlow's collectives show in the timeline, against the node names Horovod 0.28.1's
ops get when the same code is traced. `Horovod` below builds what Horovod's TensorFlow module
builds around its ops (the size cast before an allreduce's compression, the name scope and the
tf.cond of each gradient's reduction, the tf.function eager gradients are reduced in), with an
Identity op in place of each Horovod op, named as Horovod names it; TensorFlow then names that
node, and the name it gets is what Horovod's op would have used. Each case runs on scaleout with
a timeline of its own, and rank 0 compares the timeline's tensors with the names the same case
got from `Horovod`: in tf.function, for every collective (named, unnamed, in name scopes, twice,
with ignore_name_scope, compressed, grouped, sparse), and for DistributedGradientTape in
tf.function and eagerly (compression, sparse_as_dense, groups, use_generic_names).

argv[1]: a directory for the timelines.
"""

import os
import re
import sys

import tensorflow as tf
from _timeline import read

import scaleout.tensorflow as hvd

hvd.init()
out_dir = sys.argv[1]
rank, size = hvd.rank(), hvd.size()


class Horovod:
    """The graph Horovod's collectives build, with a named Identity for each of its ops."""

    def __init__(self):
        self.names = []
        self.Compression = hvd.Compression

    def _op(self, tensor, name, ignore_name_scope):
        out = tf.raw_ops.Identity(input=tensor, name=name)
        node = out.op.name
        self.names.append(node.rsplit("/", 1)[-1] if ignore_name_scope else node)
        return out

    @staticmethod
    def _normalized(name):
        return re.sub("[^a-zA-Z0-9_]", "_", name)

    def _default(self, kind, tensors, grouped):
        if grouped:
            return self._normalized(f"HorovodGrouped{kind}_{tensors[0].name}_{tensors[-1].name}")
        return f"Horovod{kind}_{self._normalized(tensors[0].name)}"

    def _single(self, kind, tensor, name, ignore_name_scope):
        name = name or self._default(kind, [tensor], False)
        return self._op(tensor, name, ignore_name_scope)

    def _grouped(self, kind, tensors, name, ignore_name_scope):
        name = name or self._default(kind, tensors, True)
        out = tf.raw_ops.IdentityN(input=tensors, name=name)
        node = out[0].op.name
        node = node.rsplit("/", 1)[-1] if ignore_name_scope else node
        self.names += [f"{node}_{i + 1}of{len(tensors)}" for i in range(len(tensors))]
        return list(out)

    def allreduce(
        self, tensor, compression=hvd.Compression.none, name=None, ignore_name_scope=False
    ):
        if isinstance(tensor, tf.IndexedSlices):
            tf.cast(size, tensor.values.dtype)
            values = self.allgather(tensor.values, ignore_name_scope=ignore_name_scope)
            indices = self.allgather(tensor.indices, ignore_name_scope=ignore_name_scope)
            return tf.IndexedSlices(values / size, indices, tensor.dense_shape)
        tf.cast(size, tensor.dtype)
        wire, ctx = compression.compress(tensor)
        return compression.decompress(self._single("Allreduce", wire, name, ignore_name_scope), ctx)

    def grouped_allreduce(
        self, tensors, compression=hvd.Compression.none, name=None, ignore_name_scope=False
    ):
        out = list(tensors)
        sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        dense = [i for i in range(len(tensors)) if i not in sparse]
        if sparse:
            values = self.grouped_allgather(
                [tensors[i].values for i in sparse], ignore_name_scope=ignore_name_scope
            )
            indices = self.grouped_allgather(
                [tensors[i].indices for i in sparse], ignore_name_scope=ignore_name_scope
            )
            for i, v, x in zip(sparse, values, indices):
                out[i] = tf.IndexedSlices(v / size, x, tensors[i].dense_shape)
        if dense:
            wires, ctxs = zip(*[compression.compress(tensors[i]) for i in dense])
            reduced = self._grouped("Allreduce", list(wires), name, ignore_name_scope)
            for i, r, c in zip(dense, reduced, ctxs):
                out[i] = compression.decompress(r, c)
        return out

    def allgather(self, tensor, name=None, ignore_name_scope=False):
        return self._single("Allgather", tensor, name, ignore_name_scope)

    def grouped_allgather(self, tensors, name=None, ignore_name_scope=False):
        return self._grouped("Allgather", tensors, name, ignore_name_scope)

    def broadcast(self, tensor, root_rank, name=None, ignore_name_scope=False):
        return self._single("Broadcast", tensor, name, ignore_name_scope)

    def alltoall(self, tensor, name=None, ignore_name_scope=False):
        return self._single("Alltoall", tensor, name, ignore_name_scope)

    def reducescatter(self, tensor, name=None, ignore_name_scope=False):
        return self._single("Reducescatter", tensor, name, ignore_name_scope)

    def grouped_reducescatter(self, tensors, name=None, ignore_name_scope=False):
        return self._grouped("Reducescatter", tensors, name, ignore_name_scope)

    def reduce_gradients(
        self, name, grads, variables, generic, compression, sparse_as_dense, groups
    ):
        """Horovod's gradient reduction: its name scope, a tf.cond per gradient (or group), and
        eagerly all of it in a tf.function of `grads`."""

        def allreduce_grads(grads, vars=None, use_generic_names=False):
            with tf.name_scope(name + "_Allreduce"):
                if sparse_as_dense:
                    grads = [
                        tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                        for g in grads
                    ]
                if groups is not None:
                    present = [(i, g) for i, g in enumerate(grads) if g is not None]
                    if isinstance(groups, list):
                        by_var = {id(vars[i]): (i, g) for i, g in present}
                        split = [[by_var.pop(id(v)) for v in group] for group in groups]
                        split += [[pair] for pair in by_var.values()]
                    else:
                        d, r = divmod(len(present), groups)
                        split = [
                            present[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)]
                            for i in range(groups)
                        ]
                    out = [None] * len(grads)
                    for k, group in enumerate(split):
                        index, members = [list(t) for t in zip(*group)]
                        reduced = tf.cond(
                            tf.convert_to_tensor(True),
                            lambda: self.grouped_allreduce(
                                members,
                                compression,
                                name=f"grad_{k}" if use_generic_names else None,
                                ignore_name_scope=use_generic_names,
                            ),
                            lambda: members,
                        )
                        for i, r in zip(index, reduced):
                            out[i] = r
                    return out
                return [
                    None
                    if g is None
                    else tf.cond(
                        tf.convert_to_tensor(True),
                        lambda: self.allreduce(
                            g,
                            compression,
                            name=f"grad_{i}" if use_generic_names else None,
                            ignore_name_scope=use_generic_names,
                        ),
                        lambda: g,
                    )
                    for i, g in enumerate(grads)
                ]

        if tf.executing_eagerly():
            return tf.function(allreduce_grads)(grads, variables, generic)
        return allreduce_grads(grads, variables, generic)


class Scaleout:
    """The same calls on scaleout."""

    Compression = hvd.Compression

    def allreduce(
        self, tensor, compression=hvd.Compression.none, name=None, ignore_name_scope=False
    ):
        return hvd.allreduce(
            tensor, compression=compression, name=name, ignore_name_scope=ignore_name_scope
        )

    def grouped_allreduce(
        self, tensors, compression=hvd.Compression.none, name=None, ignore_name_scope=False
    ):
        return hvd.grouped_allreduce(
            tensors, compression=compression, name=name, ignore_name_scope=ignore_name_scope
        )

    def allgather(self, tensor, name=None, ignore_name_scope=False):
        return hvd.allgather(tensor, name=name, ignore_name_scope=ignore_name_scope)

    def grouped_allgather(self, tensors, name=None, ignore_name_scope=False):
        return hvd.grouped_allgather(tensors, name=name, ignore_name_scope=ignore_name_scope)

    def broadcast(self, tensor, root_rank, name=None, ignore_name_scope=False):
        return hvd.broadcast(tensor, root_rank, name=name, ignore_name_scope=ignore_name_scope)

    def alltoall(self, tensor, name=None, ignore_name_scope=False):
        return hvd.alltoall(tensor, name=name, ignore_name_scope=ignore_name_scope)

    def reducescatter(self, tensor, name=None, ignore_name_scope=False):
        return hvd.reducescatter(tensor, name=name, ignore_name_scope=ignore_name_scope)

    def grouped_reducescatter(self, tensors, name=None, ignore_name_scope=False):
        return hvd.grouped_reducescatter(tensors, name=name, ignore_name_scope=ignore_name_scope)


def collectives(h):
    """Every collective in a graph, unnamed and named, in name scopes, twice."""
    x = tf.range(2 * size, dtype=tf.float32) * 2.0
    h.allreduce(x)
    h.allreduce(x)  # the same input again: the graph makes the name unique
    with tf.name_scope("outer"):
        h.allreduce(x + 1.0)
        h.allreduce(x, name="given")
        h.allreduce(x, name="given")
        h.allreduce(x, name="kept", ignore_name_scope=True)
        h.allreduce(x, compression=h.Compression.fp16)
        h.allreduce(tf.IndexedSlices(x, tf.range(2 * size), [2 * size]))
    h.grouped_allreduce([x, x * 3.0])
    h.grouped_allreduce([x, tf.IndexedSlices(x, tf.range(2 * size), [2 * size])], name="mixed")
    h.allgather(tf.reshape(x, [size, 2]))
    h.grouped_allgather([x, x + 2.0], ignore_name_scope=True)
    h.broadcast(x, 0)
    h.alltoall(tf.reshape(x, [2 * size, 1]))
    h.reducescatter(x)
    h.grouped_reducescatter([x, x - 1.0])
    return tf.constant(0)


w = tf.Variable(tf.ones([3, 2]), name="w")
emb = tf.Variable(tf.ones([4, 2]), name="emb")
unused = tf.Variable(tf.ones([2]), name="unused")
b = tf.Variable(tf.zeros([2]), name="b")
x_in = tf.ones([5, 3])


def tape_step(h, generic=False, **options):
    """One step's gradients (dense, sparse, None) through the framework's gradient reduction."""
    variables = [w, emb, unused, b]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x_in, w) + b) + tf.reduce_sum(tf.gather(emb, [0, 2]))
    if isinstance(h, Horovod):
        grads = tape.gradient(loss, variables)
        return h.reduce_gradients(
            "DistributedGradientTape",
            grads,
            variables,
            generic,
            options.get("compression", hvd.Compression.none),
            options.get("sparse_as_dense", False),
            options.get("groups"),
        )
    tape = hvd.DistributedGradientTape(tape, **options)
    return tape.gradient(loss, variables, use_generic_names=generic)


CASES = {
    "collectives": (collectives, {}),
    "tape": (tape_step, {}),
    "tape fp16 generic": (tape_step, {"compression": hvd.Compression.fp16, "generic": True}),
    "tape sparse_as_dense": (tape_step, {"sparse_as_dense": True}),
    "tape 2 groups": (tape_step, {"groups": 2}),
    "tape group list generic": (tape_step, {"groups": [[w, emb]], "generic": True}),
}

failures = []
for mode in ("graph", "eager"):
    for label, (case, options) in CASES.items():
        if mode == "eager" and case is collectives:
            continue  # eager collectives keep scaleout's names (docs/horovod.md)
        oracle = Horovod()
        if mode == "graph":
            tf.function(lambda: case(oracle, **options)).get_concrete_function()
        else:
            case(oracle, **options)
        path = os.path.join(out_dir, f"{mode}-{label.replace(' ', '_')}.json")
        hvd.start_timeline(path)
        if mode == "graph":
            tf.function(lambda: case(Scaleout(), **options))()
        else:
            case(Scaleout(), **options)
        hvd.stop_timeline()
        if rank == 0:
            _, rows, _ = read(path)
            got, want = sorted(rows.values()), sorted(oracle.names)
            if got != want:
                failures.append(f"{mode} {label}:\n  scaleout {got}\n  horovod  {want}")
if failures:
    print("\n".join(failures), flush=True)
    sys.exit(1)
print(f"rank {rank}: all checks passed", flush=True)
