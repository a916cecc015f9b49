"""The cross-rank naming protocol, written once: how a collective's name makes the names of the
collectives it runs as.

Ranks match collectives by name, so these strings are a wire format between ranks: every rank
(and every front end, numpy, torch or TensorFlow) must build the same name for the same
collective. A grouped collective's members are "<base>.<i>" (TensorFlow's are Horovod's
"<base>_<i+1>of<n>", grouped_member: its graph names are Horovod's, Note [Graph names]); a
backward collective is named
after its forward one, "<name>.grad", so ranks match them whatever order autograd runs them in;
a collective that travels as several is "<name>.<part>" (a sparse tensor's ".indices" and
".values", an object's ".size" and ".data", ...); torch's DistributedOptimizer reduces a
parameter's gradient as "<parameter name>"; torch's names carry the collective's as a prefix
("allreduce.<name>", torch_name), as Horovod's torch front end's do.
"""

from __future__ import annotations

from typing import Any, List

__all__ = [
    "member",
    "members",
    "grouped_member",
    "grouped_members",
    "gradient",
    "part",
    "parameter_gradient",
    "parameter_delta",
    "INDICES",
    "VALUES",
    "SIZE",
    "DATA",
    "ROWS",
]

# Parts shared by more than one front end.
INDICES = "indices"  # a sparse tensor's indices (allgathered)
VALUES = "values"  # a sparse tensor's values (allgathered)
SIZE = "size"  # a byte payload's length (broadcast or allgathered before it)
DATA = "data"  # the byte payload itself
ROWS = "rows"  # an allgather gradient's row counts


def member(base: str, index: int) -> str:
    """The name of member `index` of the group (or list) named `base`."""
    return f"{base}.{index}"


def members(base: str, count: int) -> List[str]:
    """The names of the `count` members of the group named `base`."""
    return [member(base, i) for i in range(count)]


def grouped_member(base: str, index: int, count: int) -> str:
    """TensorFlow's name of member `index` of the `count` of a grouped op named `base`: Horovod's
    TensorFlow op names them `<base>_<index+1>of<count>`."""
    return f"{base}_{index + 1}of{count}"


def grouped_members(base: str, count: int) -> List[str]:
    """TensorFlow's names of the `count` members of the grouped op named `base`."""
    return [grouped_member(base, i, count) for i in range(count)]


def gradient(name: str) -> str:
    """The name of the backward collective of the forward collective `name`."""
    return f"{name}.grad"


def part(name: str, label: str) -> str:
    """The name of part `label` of a collective that travels as several."""
    return f"{name}.{label}"


def parameter_gradient(parameter: str) -> str:
    """The name of the reduction of the gradient of the parameter named `parameter` (torch's
    DistributedOptimizer: its named_parameters, or generated names); torch_name then makes it
    "allreduce.<parameter>", as Horovod's optimizer's."""
    return parameter


def torch_name(collective: str, name: Any) -> Any:
    """The name torch's collectives run under, as Horovod's torch front end makes it: a name
    "x" given to an allreduce is "allreduce.x" (the collective's name, a dot, the name), and
    what is made from it ("allreduce.x.grad", a group's members "allreduce.g.0" where Horovod
    writes "grouped_allreduce.g_1of2", a sparse tensor's "allgather.s.indices") too; a
    generated name ("allreduce.noname.3", and what is made from it) and None (the core generates
    one) stay. These are the names the timeline and the errors show."""
    if not isinstance(name, str) or not name or name.startswith(collective + ".noname."):
        return name  # None, and what is no name at all, as given: the core judges it
    return f"{collective}.{name}"


def parameter_delta(parameter: str) -> str:
    """The name of the Adasum combination of the change of the parameter named `parameter` over
    a step (torch's DistributedOptimizer with op=Adasum)."""
    return f"delta.{parameter}"
