"""The "scaleout" torch.distributed backend by name, for code that only names it.

setup.py lists `register` under torch's "torch.backends" entry points, which `import torch` calls
in every process of an environment that has scaleout installed (TORCH_DEVICE_BACKEND_AUTOLOAD=0
turns that off). So `dist.init_process_group("scaleout")` works where nothing imported
scaleout.torch first: Ray Train's `TorchConfig(backend="scaleout")`, whose workers call
init_process_group themselves, and any framework that takes a backend's name. Only the name is
registered here: scaleout.torch, whose import costs more, loads when the first group is made.
(Under scaleoutrun, a program still imports scaleout.torch itself: that import gives torch the
job's RANK, WORLD_SIZE, MASTER_ADDR, ... first; Note [torch.distributed backend].)
"""

from __future__ import annotations

NAME = "scaleout"


def register() -> None:
    """Registers the backend's name, unless torch has no torch.distributed or has the name
    already (scaleout.torch imported first). Never raises: torch's own import calls it."""
    try:
        import torch.distributed as dist

        if dist.is_available() and NAME.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    except Exception:  # noqa: BLE001  (a broken plugin must not break `import torch`)
        return


def _create(options, backend_options):
    """torch's creator: scaleout.torch's, imported now (the first group)."""
    from scaleout.torch import _process_group

    return _process_group._create(options, backend_options)
