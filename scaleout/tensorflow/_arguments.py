"""The arguments of a TensorFlow collective, checked and converted while the op is built (on
every rank, before anything is submitted): tensors, devices, the process set, the op's name.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from scaleout._errors import InvalidArgumentError
from scaleout._native import COLLECTIVE_CODES, DTYPE_CODES, auto_name
from scaleout._process_sets import process_set_id
from scaleout.tensorflow._horovod_names import default_name, node_name

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
# one after another, as they were written, on every rank. In a graph an op is named as Horovod's
# op would be (scaleout/tensorflow/_horovod_names.py): an unnamed one after its input tensor
# (`HorovodAllreduce_<input>`), made unique in the graph's current name scope (`graph.unique_name`,
# as TensorFlow names a node), so the same call site has the same name on every rank and in every
# step (repeated steps then hit the core's response cache) and the timeline shows Horovod's names.
# As with Horovod, that holds while every rank builds the same graph: a rank that builds more ops
# before a collective (on a process set of its own, say) shifts the names after them, and a
# `name=` keeps them apart. Eager calls without a name use the numpy API's per-kind counter, so
# they must be made in the same order on every rank (as with Horovod).


def op_name(
    kind: str,
    name: Optional[str],
    ignore_name_scope: bool = False,
    process_set: int = 0,
    inputs: Sequence[tf.Tensor] = (),
    grouped: bool = False,
) -> str:
    """The collective's name (Note [Graph names]): eagerly the given one, else the next of the
    kind's counter on the set; in a graph the node name Horovod's op gets, from the given name
    or else from `inputs` (the tensors it sends; `grouped`: a grouped op's), unique in the
    current name scope, and with `ignore_name_scope` only what follows its last '/'."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty string, not {name!r}")
    if tf.executing_eagerly():
        return name if name is not None else auto_name(COLLECTIVE_CODES[kind], None, process_set)
    if name is None:
        name = default_name(kind, inputs, grouped, process_set)
    return node_name(name, ignore_name_scope)


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
