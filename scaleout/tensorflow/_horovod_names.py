"""The names of TensorFlow's collectives in a graph, as Horovod's (Note [Graph names]).

Horovod keys a TensorFlow collective by the node name TensorFlow gives its op, and the timeline
and the errors show that name. scaleout's ops are numpy_functions, named otherwise, so the names
are made here by the same rules, in the graph the op is built in: the default name is made from
the input tensor's name, the graph makes it unique in the current name scope, and
`ignore_name_scope` keeps what follows the last '/'. A gradient reduction names each gradient as
Horovod's, inside the name scope and the tf.cond its gradient code builds (eagerly, inside the
tf.function it traces: gradient_names).
"""

from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from scaleout._naming import grouped_member, grouped_members

__all__ = ["default_name", "node_name", "reserve", "gradient_names", "GradientPlan"]

# Horovod's op type per collective; the others (barrier, join) have no Horovod TensorFlow op.
_OPS = {
    "allreduce": "Allreduce",
    "allgather": "Allgather",
    "broadcast": "Broadcast",
    "alltoall": "Alltoall",
    "reducescatter": "Reducescatter",
}


def _normalized(name: str) -> str:
    """A tensor name as an op name: every character other than a letter, digit or '_' is '_'."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def default_name(kind: str, inputs: Sequence[tf.Tensor], grouped: bool, process_set: int) -> str:
    """The name an unnamed op of `kind` gets in a graph: Horovod's from its input tensors'
    names (`HorovodAllreduce_<input>`, `HorovodGroupedAllreduce_<first>_<last>`); a kind
    Horovod's TensorFlow module lacks (barrier) is `scaleout_<kind>`, per process set."""
    if kind not in _OPS:
        return f"scaleout_{kind}" if process_set == 0 else f"scaleout_{kind}_set{process_set}"
    if grouped:
        return _normalized(f"HorovodGrouped{_OPS[kind]}_{inputs[0].name}_{inputs[-1].name}")
    return f"Horovod{_OPS[kind]}_{_normalized(inputs[0].name)}"


def node_name(name: str, ignore_name_scope: bool = False) -> str:
    """The node name an op named `name` gets in the current graph and name scope (unique: a
    second `x` is `x_1`); with `ignore_name_scope` what follows its last '/'."""
    node = tf.compat.v1.get_default_graph().unique_name(name)
    return node.rsplit("/", 1)[-1] if ignore_name_scope else node


def reserve(name: str) -> None:
    """Takes `name` in the current name scope as an op of Horovod's would (so that the ops made
    after it are numbered as they are beside Horovod's)."""
    tf.compat.v1.get_default_graph().unique_name(name)


def _split_list(items: list, n: int) -> List[list]:
    """`items` in n chunks of nearly equal sizes, the first ones longer (Horovod's split)."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)] for i in range(n)]


# What gradient_names gives each gradient: None for a None gradient; ("dense", wire, ctx, name)
# or ("sparse", values name, indices name).
GradientPlan = Optional[Tuple[Any, ...]]


def _batches(grads: Sequence[Any], sources: Sequence[Any], groups) -> Tuple[List[List[int]], bool]:
    """The positions of the gradients Horovod reduces together (one tf.cond each), and whether
    they are grouped ops: each gradient alone without `groups`; a number splits them in that many
    batches; lists of variables make a batch each, and every other gradient one of its own."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if groups is None:
        return [[i] for i in present], False
    if not isinstance(groups, list):
        return _split_list(present, groups), True
    # Horovod matches the variables by name; by identity here, as Keras 3's names are not unique
    by_id = {id(sources[i]): i for i in present}
    batches = []
    for group in groups:
        batches.append([by_id.pop(id(v)) for v in group if id(v) in by_id])
    return batches + [[i] for i in by_id.values()], True


def gradient_names(
    grads: Sequence[Any],
    sources: Sequence[Any],
    compress: Callable[[tf.Tensor], Tuple[tf.Tensor, Any]],
    generic: bool,
    groups,
) -> List[GradientPlan]:
    """Names each gradient's reduction as Horovod's gradient code does, in the current graph,
    inside the name scope of the tape or optimizer (`<name>_Allreduce`): each batch of
    _batches in a tf.cond of its own (`cond`, `cond_1`, ...), where a dense gradient is
    compressed (compress makes its ops there, so their names are Horovod's) and named after
    the compressed tensor, `HorovodAllreduce_<tensor>` (`HorovodGroupedAllreduce_<first>_<last>`
    and `_<i>of<n>` in a group), and a sparse one is two allgathers named after its values and
    its indices. `generic` (use_generic_names): `grad_<i>` (i: the gradient's, or the batch's,
    position), without the name scope."""
    batches, grouped = _batches(grads, sources, groups)
    plan: List[GradientPlan] = [None] * len(grads)
    graph = tf.compat.v1.get_default_graph()
    for b, batch in enumerate(batches):
        if not batch:
            continue
        cond = graph.unique_name("cond")
        with graph.name_scope(cond + "/"):
            sparse = [i for i in batch if isinstance(grads[i], tf.IndexedSlices)]
            dense = [i for i in batch if i not in sparse]
            if sparse:
                values = [grads[i].values for i in sparse]
                indices = [grads[i].indices for i in sparse]
                # (one gradient per batch unless grouped)
                v = node_name(default_name("allgather", values, grouped, 0), generic)
                x = node_name(default_name("allgather", indices, grouped, 0), generic)
                vs = grouped_members(v, len(sparse)) if grouped else [v]
                xs = grouped_members(x, len(sparse)) if grouped else [x]
                for i, v_name, x_name in zip(sparse, vs, xs):
                    plan[i] = ("sparse", v_name, x_name)
            if not dense:
                continue
            if not grouped:
                reserve("Cast")  # Horovod's allreduce casts the set's size first
            wires = [compress(grads[i]) for i in dense]
            if generic:
                name = node_name(f"grad_{b if grouped else dense[0]}", True)
            else:
                name = node_name(default_name("allreduce", [w for w, _ in wires], grouped, 0))
            for k, (i, (wire, ctx)) in enumerate(zip(dense, wires)):
                member = grouped_member(name, k, len(dense)) if grouped else name
                plan[i] = ("dense", wire, ctx, member)
    return plan
