"""scaleout on Ray, with Horovod's `RayExecutor`: `from scaleout.ray import RayExecutor`.

    ray.init()
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train_fn)   # train_fn calls hvd.init(), as under scaleoutrun
    executor.shutdown()

Each worker is a Ray actor. start() places them (a placement group: `num_workers` packed onto
as few machines as fit, or `num_hosts` machines of `num_workers_per_host` each), orders them by
machine, and joins them into one MPI job before any user code runs, through a key-value store
that a Ray actor of the executor serves (Note [PMI bootstrap]: rank 0's worker serves PMI to the
others; the MPI library must be MPICH's or Intel MPI's). `hvd.init()` or
`dist.init_process_group("scaleout")` in a function given to run() or execute() then starts the
core on that job. For Ray Train, use its TorchTrainer with `TorchConfig(backend="scaleout")`
instead (docs/ray.md).

As Horovod's: `create_settings`, `start(executable_cls, executable_args, executable_kwargs,
extra_env_vars)`, `run`, `run_remote`, `execute`, `execute_single`, `shutdown`, and the
attributes `num_workers` and `cpus_per_worker`. Not here: GPUs (`use_gpu=True`), elastic
executors (`min_workers`, ...), and `callbacks` (each refused, saying so).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import (
    get_current_placement_group,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from scaleout import _pmi_bootstrap

__all__ = ["RayExecutor"]


@dataclass
class Settings:
    """What `RayExecutor.create_settings` makes. `timeout_s`: how long the workers wait for
    each other to join; `placement_group_timeout_s`: for Ray to place them."""

    timeout_s: int = 30
    placement_group_timeout_s: int = 100
    ssh_identity_file: Optional[str] = None
    nics: Optional[set] = None


@ray.remote(num_cpus=0)
class _Store:
    """The job's key-value store while its workers join (set, a get that waits, delete)."""

    def __init__(self):
        self._values: Dict[str, bytes] = {}
        self._set: Dict[str, asyncio.Event] = {}

    def _event(self, key: str) -> asyncio.Event:
        return self._set.setdefault(key, asyncio.Event())

    async def set(self, key: str, value: bytes) -> None:
        self._values[key] = value
        self._event(key).set()

    async def get(self, key: str, timeout: float) -> Optional[bytes]:
        try:
            await asyncio.wait_for(self._event(key).wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return self._values[key]

    async def delete_key(self, key: str) -> None:
        self._values.pop(key, None)
        self._set.pop(key, None)


class _StoreClient:
    """torch's Store methods that the bootstrap calls, over the executor's _Store actor."""

    def __init__(self, store, timeout: float):
        self._store, self._timeout = store, timeout

    def set(self, key: str, value: str) -> None:
        ray.get(self._store.set.remote(key, value.encode()))

    def get(self, key: str) -> bytes:
        value = ray.get(self._store.get.remote(key, self._timeout))
        if value is None:
            raise TimeoutError(
                f"scaleout.ray: a worker waited {self._timeout} s for '{key}' from the others "
                "while joining the job (RayExecutor.create_settings(timeout_s=...))"
            )
        return value

    def delete_key(self, key: str) -> None:
        ray.get(self._store.delete_key.remote(key))


@ray.remote
class _Worker:
    """One rank: joins the job, then runs what the executor sends it."""

    def __init__(self, env: Dict[str, str]):
        os.environ.update(env)
        self.executable = None

    def node(self) -> tuple:
        """This worker's Ray node and its address there."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def join(self, store, rank: int, size: int, env: Dict[str, str], timeout: float) -> None:
        os.environ.update(env)
        _pmi_bootstrap.bootstrap(_StoreClient(store, timeout), rank, size)

    def start_executable(self, cls: Optional[type], args: List, kwargs: Dict) -> None:
        if cls is not None:
            self.executable = cls(*args, **kwargs)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.executable)


class RayExecutor:
    """A job of `num_workers` scaleout ranks on Ray actors (Horovod's RayExecutor)."""

    @classmethod
    def create_settings(
        cls,
        timeout_s: int = 30,
        ssh_identity_file: Optional[str] = None,
        ssh_str: Optional[str] = None,
        placement_group_timeout_s: int = 100,
        nics: Optional[set] = None,
    ) -> Settings:
        """The executor's settings. SSH is not used (Ray starts the workers), so the ssh
        arguments are accepted and ignored; `nics` likewise (MPI picks the interface)."""
        return Settings(
            timeout_s=timeout_s,
            placement_group_timeout_s=placement_group_timeout_s,
            ssh_identity_file=ssh_identity_file,
            nics=nics,
        )

    def __init__(
        self,
        settings: Optional[Settings] = None,
        num_workers: Optional[int] = None,
        num_hosts: Optional[int] = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: int = 1,
        use_gpu: bool = False,
        gpus_per_worker: Optional[int] = None,
        use_current_placement_group: bool = True,
        min_workers: Optional[int] = None,
        max_workers: Optional[int] = None,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[List[int]] = None,
        elastic_timeout: int = 600,
        override_discovery: bool = True,
    ):
        if use_gpu or gpus_per_worker:
            raise ValueError(
                "scaleout.ray.RayExecutor: use_gpu/gpus_per_worker: scaleout runs on CPU "
                "tensors only (GPUs are not supported yet)"
            )
        if min_workers is not None or max_workers is not None:
            raise NotImplementedError(
                "scaleout.ray.RayExecutor: elastic executors (min_workers, max_workers) are "
                "not supported; give num_workers, or use scaleoutrun's elastic mode"
            )
        if num_workers is not None and num_hosts is not None:
            raise ValueError("RayExecutor: give num_workers or num_hosts, not both")
        if num_workers is None and num_hosts is None:
            raise ValueError(
                "RayExecutor: give num_workers (or num_hosts and num_workers_per_host)"
            )
        for name, value in (
            ("num_workers", num_workers),
            ("num_hosts", num_hosts),
            ("num_workers_per_host", num_workers_per_host),
            ("cpus_per_worker", cpus_per_worker),
        ):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"RayExecutor: {name} must be a positive integer, not {value!r}")
        self.settings = settings or Settings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = (
            num_workers if num_workers is not None else num_hosts * num_workers_per_host
        )
        self.cpus_per_worker = cpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.workers: List[Any] = []
        self._store = None
        self._group = None
        self._own_group = False

    def start(
        self,
        executable_cls: Optional[type] = None,
        executable_args: Optional[List] = None,
        executable_kwargs: Optional[Dict] = None,
        extra_env_vars: Optional[Dict] = None,
    ) -> None:
        """Places the workers, joins them into one job (each then has rank, size and the
        machine's ranks as under scaleoutrun), and makes `executable_cls(*args, **kwargs)` on
        each, which execute() passes to its function."""
        if self.workers:
            raise RuntimeError("RayExecutor.start: started already; shutdown() first")
        if self.num_hosts is not None:
            bundles = [{"CPU": self.cpus_per_worker * self.num_workers_per_host}] * self.num_hosts
            strategy = "STRICT_SPREAD"
        else:
            bundles = [{"CPU": self.cpus_per_worker}] * self.num_workers
            strategy = "PACK"
        current = get_current_placement_group() if self.use_current_placement_group else None
        # Inside a placement group (a Ray Tune trial's, say), the workers take its bundles.
        self._own_group = current is None
        self._group = current or placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self._group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            self.shutdown()
            raise TimeoutError(
                f"RayExecutor.start: Ray could not place {self.num_workers} workers of "
                f"{self.cpus_per_worker} CPU(s) ({strategy} over {len(bundles)} bundle(s)) in "
                f"{self.settings.placement_group_timeout_s} s: the cluster lacks the resources"
            )
        env = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        workers = []
        for i in range(self.num_workers):
            bundle = i // self.num_workers_per_host if self.num_hosts is not None else i
            workers.append(
                _Worker.options(
                    num_cpus=self.cpus_per_worker,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._group, placement_group_bundle_index=bundle
                    ),
                ).remote(env)
            )
        # Ranks in order of machine, so that a machine's ranks are consecutive.
        nodes = ray.get([w.node.remote() for w in workers])
        first_seen: Dict[str, int] = {}
        for i, (node, _) in enumerate(nodes):
            first_seen.setdefault(node, i)
        order = sorted(range(len(workers)), key=lambda i: (first_seen[nodes[i][0]], i))
        self.workers = [workers[i] for i in order]
        self._store = _Store.remote()
        size = len(self.workers)
        local: Dict[str, List[int]] = {}
        for rank, i in enumerate(order):
            local.setdefault(nodes[i][0], []).append(rank)
        master = nodes[order[0]][1]  # rank 0's address
        joins = []
        for rank, i in enumerate(order):
            mine = local[nodes[i][0]]
            rank_env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(size),
                "LOCAL_RANK": str(mine.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(mine)),
                "MASTER_ADDR": master,
            }
            joins.append(
                self.workers[rank].join.remote(
                    self._store, rank, size, rank_env, float(self.settings.timeout_s)
                )
            )
        try:
            ray.get(joins)
            ray.get(
                [
                    w.start_executable.remote(
                        executable_cls, executable_args or [], executable_kwargs or {}
                    )
                    for w in self.workers
                ]
            )
        except Exception:
            self.shutdown()
            raise

    def _started(self, what: str) -> None:
        if not self.workers:
            raise RuntimeError(f"RayExecutor.{what}: call start() first")

    @staticmethod
    def _no_callbacks(callbacks) -> None:
        if callbacks:
            raise NotImplementedError(
                "scaleout.ray.RayExecutor: callbacks are not supported; return values from "
                "the function instead"
            )

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List] = None) -> List[Any]:
        """fn(executable) on every worker (the object start() made, or None): the results in
        rank order."""
        self._started("execute")
        self._no_callbacks(callbacks)
        return ray.get([w.execute.remote(fn) for w in self.workers])

    def run(
        self,
        fn: Callable[..., Any],
        args: Optional[List] = None,
        kwargs: Optional[Dict] = None,
        callbacks: Optional[List] = None,
    ) -> List[Any]:
        """fn(*args, **kwargs) on every worker: the results in rank order."""
        self._no_callbacks(callbacks)
        return ray.get(self.run_remote(fn, args, kwargs))

    def run_remote(
        self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None
    ) -> List[Any]:
        """As run(), without waiting: Ray object references to the results, in rank order."""
        self._started("run")
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.execute.remote(lambda _: fn(*args, **kwargs)) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0's worker alone."""
        self._started("execute_single")
        return ray.get(self.workers[0].execute.remote(fn))

    def shutdown(self) -> None:
        """Ends the workers (their processes, so MPI with them) and frees their placement."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._store is not None:
            ray.kill(self._store)
            self._store = None
        if self._group is not None and self._own_group:
            remove_placement_group(self._group)
        self._group = None
