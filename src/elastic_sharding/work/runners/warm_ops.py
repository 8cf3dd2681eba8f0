"""Warm operators: actor-mode Data-Juicer operators whose instances live as long as the runtime.

Data-Juicer runs an actor-mode operator (every GPU operator, unless the recipe says
`ray_execution_mode: task`) through `Dataset.map_batches(op_class, compute=ActorPoolStrategy)`,
and Ray Data kills that pool when the shard's dataset finishes: every shard pays actor start-up
plus a model load. Inside the warm runtime that call is intercepted. The operator's instances
are long-lived Ray actors, one pool per (operator class, arguments, resources), created on the
first shard that needs them and reused by every later one; a model is loaded once per instance.

The driver routes work to the instances itself, so no helper task or actor sits in the data
path: each upstream block (or a row range of it, when there are fewer blocks than instances) is
sent by reference to the least-loaded instance, which cuts it into batches of the operator's
`batch_size` in pyarrow format, as Ray Data hands them to an actor (here a batch never spans two
blocks, which a row-wise operator cannot tell), calls the operator object as Ray
Data's actor would (`op(batch)`: Data-Juicer's `process` / `compute_stats` wrappers), and builds
the output block with Ray Data's own block builder. Several shards may feed one pool at once, so
the next shard's batches queue behind the current shard's tail (no bubble at shard boundaries).

Failures stay per attempt: an exception of the operator fails the attempts whose batch raised
it; an instance that dies (kill -9, OOM, a CUDA error that kills its process) fails the
attempts that had rows in it and is replaced; an instance that stops answering its health
ping for `hang_secs` is killed, and then counts as dead. Each instance reports when each call
began and ended, from which the pool reports the time every instance was busy at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray.data import ActorPoolStrategy, Dataset

from elastic_sharding.work.runners.actor_pool import AttemptCancelled, Call, OperatorFailed, OperatorInstance, Pool

log = logging.getLogger(__name__)


class WarmOperators:
    """The pools of one warm runtime, and the interception of Data-Juicer's actor-mode calls."""

    def __init__(self, hang_secs: float, on_feeding: Callable[[str], None] = lambda attempt: None):
        self.hang_secs = hang_secs
        self.on_feeding = on_feeding  # called once per attempt, when its first rows reach a pool
        self._lock = threading.Lock()
        self._pools: dict[str, Pool] = {}
        self._cancelled: set[str] = set()
        self._local = threading.local()
        self._original = Dataset.map_batches

    # -- per shard thread -------------------------------------------------------------------

    def begin_attempt(self, attempt: str) -> None:
        self._local.attempt = attempt

    def end_attempt(self) -> None:
        attempt = getattr(self._local, "attempt", None)
        self._local.attempt = None
        with self._lock:
            self._cancelled.discard(attempt)

    def cancel(self, attempt: str) -> None:
        with self._lock:
            self._cancelled.add(attempt)

    def is_cancelled(self, attempt: str) -> bool:
        return attempt in self._cancelled

    # -- interception -----------------------------------------------------------------------

    def install(self) -> None:
        warm = self
        original = self._original

        def map_batches(dataset: Dataset, fn: Any, *args: Any, **kwargs: Any) -> Dataset:
            attempt = getattr(warm._local, "attempt", None)
            if attempt is None or args or not warm.takes(fn, kwargs):
                return original(dataset, fn, *args, **kwargs)
            return warm.run(dataset, fn, kwargs, attempt)

        Dataset.map_batches = map_batches

    @staticmethod
    def takes(fn: Any, kwargs: dict[str, Any]) -> bool:
        """A Data-Juicer operator class on an actor pool, called the way `_run_single_op` calls it."""
        from data_juicer.ops.base_op import OP

        return (
            isinstance(fn, type)
            and issubclass(fn, OP)
            and isinstance(kwargs.get("compute"), ActorPoolStrategy)
            and kwargs.get("batch_format") == "pyarrow"
            and not kwargs.get("fn_args")
            and not kwargs.get("fn_kwargs")
        )

    def pool_for(self, fn: type, kwargs: dict[str, Any]) -> Pool:
        args = tuple(kwargs.get("fn_constructor_args") or ())
        init = dict(kwargs.get("fn_constructor_kwargs") or {})
        # Data-Juicer puts each run's work_dir into every operator's arguments; only the global
        # deduplicators use it, and a sharded job refuses those, so it does not split pools.
        keyed = {k: v for k, v in init.items() if k != "work_dir"}
        compute: ActorPoolStrategy = kwargs["compute"]
        size = compute.min_size or compute.max_size or 1
        num_cpus = kwargs.get("num_cpus")
        num_gpus = kwargs.get("num_gpus")
        runtime_env = kwargs.get("runtime_env")
        key = hashlib.sha256(
            ray.cloudpickle.dumps(
                (fn.__module__, fn.__qualname__, args, sorted(keyed.items()), num_cpus, num_gpus, runtime_env, size)
            )
        ).hexdigest()
        with self._lock:
            pool = self._pools.get(key)
            if pool is not None:
                return pool
            name = getattr(fn, "_name", None) or fn.__name__
            for old_key, old in list(self._pools.items()):
                if old.name == name and old.users == 0:
                    log.info("dropping the idle instances of %s: a shard needs them with other arguments", name)
                    old.close()
                    del self._pools[old_key]
            cpus = self._cpus_per_instance(num_cpus, size)
            options: dict[str, Any] = {"num_cpus": cpus, "max_restarts": 0}
            if num_gpus:
                options["num_gpus"] = num_gpus
            if runtime_env:
                options["runtime_env"] = runtime_env

            def make() -> Any:
                return OperatorInstance.options(**options).remote(fn, args, init)

            log.info("starting %d warm instance(s) of %s (%s)", size, name, options)
            pool = self._pools[key] = Pool(name, make, size, cpus, self.hang_secs)
            return pool

    def _cpus_per_instance(self, num_cpus: float | None, size: int) -> float:
        """As requested (Ray Data's default: 1), but the pools never hold the node's last CPU:
        the shards' reads and task-mode operators need one, and Ray Data's own pool would release
        its CPUs when the shard ends, which a warm pool never does."""
        wanted = 1.0 if num_cpus is None else float(num_cpus)
        total = float(ray.cluster_resources().get("CPU", 1))
        held = sum(p.size * p.cpus for p in self._pools.values())
        free = max(0.0, total - 1.0 - held)
        cpus = min(wanted, free / size) if size else wanted
        return max(0.0, round(cpus, 4))

    def run(self, dataset: Dataset, fn: type, kwargs: dict[str, Any], attempt: str) -> Dataset:
        """Run `dataset` through the warm pool of `fn`; returns the result as a new dataset."""
        pool = self.pool_for(fn, kwargs)
        batch_size = kwargs.get("batch_size") or 1
        if not isinstance(batch_size, int):
            batch_size = 1
        with self._lock:
            pool.users += 1
        calls: list[Call] = []
        cancelled = lambda: self.is_cancelled(attempt)  # noqa: E731
        bundles = dataset.iter_internal_ref_bundles()
        try:
            for bundle in bundles:
                for index, entry in enumerate(bundle.blocks):
                    rows = entry.metadata.num_rows
                    piece = bundle.slices[index] if bundle.slices else None
                    first, end = (piece.start_offset, piece.end_offset) if piece is not None else (0, rows)
                    for lo, hi in _units(first, end, batch_size, pool.size):
                        whole = piece is None and lo == 0 and hi == rows
                        calls.append(
                            pool.submit(attempt, entry.ref, None if whole else lo, None if whole else hi, batch_size, cancelled)
                        )
                        if len(calls) == 1:
                            self.on_feeding(attempt)
                    self._raise_failed(calls)
            for call in calls:
                while not call.done.wait(0.2):
                    if cancelled():
                        raise AttemptCancelled(attempt)
            self._raise_failed(calls)
        finally:
            with contextlib.suppress(Exception):  # stop the upstream execution of a failed shard
                getattr(bundles, "close", lambda: None)()
            with self._lock:
                pool.users -= 1
        if not calls:
            return dataset
        return ray.data.from_arrow_refs([call.out_ref for call in calls])

    @staticmethod
    def _raise_failed(calls: list[Call]) -> None:
        for call in calls:
            if call.done.is_set() and call.error is not None:
                raise OperatorFailed(call.error)

    def stats(self) -> list[dict[str, Any]]:
        """Each pool's figures as the JSON the worker records (`records.OperatorStats`)."""
        with self._lock:
            return [dataclasses.asdict(pool.stats()) for pool in self._pools.values()]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        Dataset.map_batches = self._original


def _units(first: int, end: int, batch_size: int, instances: int) -> list[tuple[int, int]]:
    """Row ranges of one block to send to instances: the whole block when one instance serves
    the pool, else pieces of whole batches, about two per instance, so all of them get work
    even from a shard of one block. A piece is whole batches, so no batch is cut short by it."""
    rows = end - first
    if rows <= 0:
        return []
    if instances <= 1:
        return [(first, end)]
    batches = -(-rows // batch_size)
    per_unit = max(1, -(-batches // (2 * instances))) * batch_size
    return [(lo, min(lo + per_unit, end)) for lo in range(first, end, per_unit)]
