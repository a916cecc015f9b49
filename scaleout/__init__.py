"""scaleout: data-parallel distributed training over MPI, with Horovod's API.

    import scaleout as hvd
    hvd.init()
    total = hvd.allreduce(np.ones(4), op=hvd.Sum)

Framework shims live in scaleout.torch and scaleout.tensorflow; the launcher is `scaleoutrun`.
Importing scaleout does not load MPI: that happens in init().

The names below are loaded at their first use (PEP 562), so that what imports only a part of the
package (the launcher, torch's backend entry point, a submodule) does not pay for numpy and the
rest of the front end: `import scaleout` itself costs nearly nothing.
"""

import importlib

__version__ = "0.1.0"

# The tensor collectives (scaleout._ops); every other public name is scaleout._frontend_api's.
_OPS = (
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "barrier",
    "join",
    "poll",
    "synchronize",
)


def _frontend_names() -> list:
    return importlib.import_module("scaleout._frontend_api").__all__


def __getattr__(name: str):
    if name == "__all__":
        value = _frontend_names() + list(_OPS)
    elif name in _OPS:
        value = getattr(importlib.import_module("scaleout._ops"), name)
    elif not name.startswith("_") and name in _frontend_names():
        value = getattr(importlib.import_module("scaleout._frontend_api"), name)
    else:
        raise AttributeError(f"module 'scaleout' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__getattr__("__all__")))
