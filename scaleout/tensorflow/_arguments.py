"""The arguments of a TensorFlow collective, checked and converted while the op is built (on
every rank, before anything is submitted): tensors, devices, the process set, the op's name.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from scaleout._errors import InvalidArgumentError
from scaleout._native import COLLECTIVE_CODES, DTYPE_CODES, auto_name
from scaleout._process_sets import process_set_id

__all__ = [
    "check_device",
    "as_tensor",
    "op_name",
    "set_id",
    "check_devices",
    "compressed",
    "is_variable",
    "variable_label",
]

# The dtypes the core reduces, from its table.
_SUPPORTED_DTYPES = tuple(tf.as_dtype(name) for name in DTYPE_CODES)


def check_device(device: str, what: str = "scaleout") -> None:
    """Raises for tensors placed on an accelerator: only host (CPU) tensors are supported."""
    if not device:
        return
    try:
        kind = (tf.DeviceSpec.from_string(device).device_type or "").upper()
    except (ValueError, TypeError):
        return
    if kind in ("", "CPU"):
        return
    if kind == "GPU":
        raise InvalidArgumentError(
            f"{what}: GPU tensors are not supported yet (got a tensor on '{device}'). scaleout "
            "reduces host tensors: place the tensor on the CPU (with tf.device('/CPU:0'): "
            "tf.identity(t))."
        )
    raise InvalidArgumentError(
        f"{what}: tensors on device '{device}' are not supported; scaleout works on CPU tensors"
    )


def as_tensor(value, what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in _SUPPORTED_DTYPES:
        raise InvalidArgumentError(
            f"{what}: dtype {tensor.dtype.name} is not supported; scaleout handles "
            f"{', '.join(d.name for d in _SUPPORTED_DTYPES)}"
        )
    check_device(tensor.device, what)
    return tensor


# Note [Graph names]
# Ordering and names: inside tf.function, TensorFlow's automatic control
# dependencies run stateful ops (ours are stateful) in program order, so the ops of one function run
# one after another, as they were written, on every rank. An op without an explicit name is named
# at trace time after its place in the graph (`graph.unique_name`, which includes the name scope),
# so the same call site has the same name on every rank and in every step; repeated steps then hit
# the core's response cache. Eager calls without a name use the numpy API's per-kind counter, so
# they must be made in the same order on every rank (as with Horovod).


def op_name(
    kind: str, name: Optional[str], ignore_name_scope: bool = False, process_set: int = 0
) -> str:
    """The collective's name: the given one, else one from the call site (Note [Graph names]).
    In a graph a given name is prefixed with the current name scope unless
    `ignore_name_scope`, as Horovod's op names are. Generated names are counted per process set
    (names are scoped per set in the core), so that building ops on a set that only some ranks
    use does not shift the names of the other sets' ops."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, not {name!r}")
        if tf.executing_eagerly() or ignore_name_scope:
            return name
        scope = tf.compat.v1.get_default_graph().get_name_scope()
        return f"{scope}/{name}" if scope else name
    if tf.executing_eagerly():
        return auto_name(COLLECTIVE_CODES[kind], None, process_set)
    graph = tf.compat.v1.get_default_graph()
    base = f"scaleout_{kind}" if process_set == 0 else f"scaleout_{kind}_set{process_set}"
    if ignore_name_scope:
        with graph.name_scope(None):
            return graph.unique_name(base)
    return graph.unique_name(base)


def set_id(process_set, what: str) -> int:
    """The core's id of a `process_set=` argument (a ProcessSet; None or global_process_set: 0),
    read when the op is built, as Horovod's ops take it as an attribute. Not a ProcessSet, or
    not registered: InvalidArgumentError. Ranks outside the set are refused by the core when the
    collective is submitted."""
    return process_set_id(process_set, what)


def check_devices(what: str, *devices: str) -> None:
    for device in devices:
        if device:
            check_device(device, what)


def compressed(tensors, compression, what: str):
    wires, ctxs = [], []
    for t in tensors:
        wire, ctx = compression.compress(as_tensor(t, what))
        wires.append(wire)
        ctxs.append(ctx)
    return wires, ctxs


def is_variable(v) -> bool:
    return isinstance(v, tf.Variable) or hasattr(v, "assign") and hasattr(v, "dtype")


def variable_label(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", "") or ""
