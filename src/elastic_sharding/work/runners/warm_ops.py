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
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.data import ActorPoolStrategy, Dataset

from elastic_sharding.records import OperatorStats

log = logging.getLogger(__name__)

# Calls queued per instance: one running, one waiting in its mailbox, so an instance never waits
# for the driver to send the next batch.
DEPTH = 2
PING_SECS = 1.0
# An instance still being constructed cannot answer a ping (its model may load in __init__).
STARTING_GRACE_SECS = 600.0
REAP_SECS = 0.05
CUDA_FAILURE_WORDS = ("CUDA error", "CUDA out of memory", "cudaError", "NCCL error")


class AttemptCancelled(Exception):
    """The attempt was cancelled (its claim was lost or the worker is leaving)."""


class OperatorFailed(Exception):
    """A call of a warm operator instance failed; the message says which instance and why."""


@ray.remote(concurrency_groups={"health": 1})
class OperatorInstance:
    """One long-lived instance of a Data-Juicer operator (built as Ray Data would build it)."""

    def __init__(self, op_class: type, args: tuple, kwargs: dict) -> None:
        self.op = op_class(*args, **kwargs)

    def call(self, block: Any, start: int | None, stop: int | None, batch_size: int) -> tuple[Any, tuple]:
        from ray.data._internal.delegating_block_builder import DelegatingBlockBuilder
        from ray.data.block import BlockAccessor

        began = time.time()
        table = BlockAccessor.for_block(block).to_arrow()
        if start is not None:
            table = table.slice(start, stop - start)
        builder = DelegatingBlockBuilder()
        rows = table.num_rows
        for offset in range(0, rows, batch_size):
            batch = table.slice(offset, batch_size)
            builder.add_batch(self.op(batch))
        out = builder.build() if rows else table
        return out, (began, time.time(), rows, BlockAccessor.for_block(out).num_rows())

    @ray.method(concurrency_group="health")
    def ping(self) -> int:
        return os.getpid()


def _unpack(method: Any) -> Any:
    """`call` returns the block and its timing as two objects, so the driver fetches only the timing."""
    return method.options(num_returns=2)


@dataclass
class _Slot:
    """One instance position in a pool; a dead instance is replaced in the same slot."""

    index: int
    handle: Any = None
    generation: int = 0
    outstanding: int = 0
    pid: int | None = None
    ping_ref: Any = None
    ping_sent: float = 0.0
    answered: bool = False


@dataclass
class _Call:
    attempt: str
    slot: _Slot
    generation: int
    out_ref: Any
    info_ref: Any
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    replace_instance: bool = False


class BusyTracker:
    """Busy intervals per slot; the time every slot was busy at once, settled as time moves on."""

    def __init__(self, slots: int):
        self.intervals: list[list[tuple[float, float]]] = [[] for _ in range(slots)]
        self.first: float | None = None
        self.last: float | None = None
        self.busy_secs = 0.0
        self.all_busy_secs = 0.0
        self._settled = float("-inf")

    def add(self, slot: int, began: float, ended: float) -> None:
        if ended <= began:
            return
        self.first = began if self.first is None else min(self.first, began)
        self.last = ended if self.last is None else max(self.last, ended)
        self.busy_secs += ended - began
        self.intervals[slot].append((max(began, self._settled), ended))
        self._settle()

    def _settle(self) -> None:
        """Count the all-busy time up to the earliest slot's latest end; forget what lies before it."""
        if any(not spans for spans in self.intervals):
            return
        frontier = min(spans[-1][1] for spans in self.intervals)
        common = [(self._settled, frontier)]
        for spans in self.intervals:
            merged = []
            for a0, a1 in common:
                for b0, b1 in spans:
                    lo, hi = max(a0, b0), min(a1, b1)
                    if lo < hi:
                        merged.append((lo, hi))
            common = merged
        self.all_busy_secs += sum(hi - lo for lo, hi in common)
        self._settled = frontier
        self.intervals = [[(max(s, frontier), e) for s, e in spans if e > frontier] for spans in self.intervals]

    def window_secs(self) -> float:
        return 0.0 if self.first is None or self.last is None else self.last - self.first


class Pool:
    """The long-lived instances of one operator configuration, and the calls in flight to them."""

    def __init__(self, name: str, make: Callable[[], Any], size: int, cpus: float, hang_secs: float):
        self.name = name
        self.size = size
        self.cpus = cpus
        self.hang_secs = hang_secs
        self._make = make
        self._cv = threading.Condition()
        self._calls: dict[Any, _Call] = {}
        self.slots = [_Slot(i) for i in range(size)]
        self.started = 0
        self.deaths = 0
        self.calls = 0
        self.rows = 0
        self.users = 0
        self.busy = BusyTracker(size)
        self.closed = False
        for slot in self.slots:
            self._start(slot)
        self._reaper = threading.Thread(target=self._reap_loop, name=f"warm-op-{name}", daemon=True)
        self._reaper.start()

    def _start(self, slot: _Slot) -> None:
        slot.handle = self._make()
        slot.generation += 1
        slot.outstanding = 0
        slot.pid = None
        slot.ping_ref = None
        slot.answered = False
        self.started += 1

    # -- submitting --------------------------------------------------------------------------

    def submit(
        self, attempt: str, block_ref: Any, start: int | None, stop: int | None, batch_size: int, cancelled: Callable[[], bool]
    ) -> _Call:
        with self._cv:
            while True:
                if cancelled():
                    raise AttemptCancelled(attempt)
                if self.closed:
                    raise OperatorFailed(f"the instances of {self.name} were shut down")
                slot = min(self.slots, key=lambda s: s.outstanding)
                if slot.outstanding < DEPTH:
                    break
                self._cv.wait(0.5)
            slot.outstanding += 1
            out_ref, info_ref = _unpack(slot.handle.call).remote(block_ref, start, stop, batch_size)
            call = _Call(attempt, slot, slot.generation, out_ref, info_ref)
            self._calls[info_ref] = call
            self.calls += 1
            return call

    # -- the reaper: completions, deaths, health ---------------------------------------------

    def _reap_loop(self) -> None:
        while not self.closed:
            with self._cv:
                refs = list(self._calls)
            if not refs:
                time.sleep(REAP_SECS)
            else:
                ready, _ = ray.wait(refs, num_returns=1, timeout=REAP_SECS)
                for ref in ready:
                    self._finish(ref)
            self._check_health()

    def _finish(self, info_ref: Any) -> None:
        with self._cv:
            call = self._calls.pop(info_ref)
        try:
            began, ended, rows_in, _rows_out = ray.get(info_ref)
        except ray.exceptions.RayActorError as exc:
            call.error = f"instance {self._who(call.slot)} of {self.name} died: {_first_line(exc)}"
            call.replace_instance = True
        except ray.exceptions.RayTaskError as exc:
            text = str(exc)
            call.error = f"{self.name} raised in instance {self._who(call.slot)}: {text}"
            call.replace_instance = any(word in text for word in CUDA_FAILURE_WORDS)
        except Exception as exc:  # noqa: BLE001 - reported as this call's error
            call.error = f"{self.name}: {type(exc).__name__}: {exc}"
        else:
            with self._cv:
                self.busy.add(call.slot.index, began, ended)
                self.rows += rows_in
        with self._cv:
            slot = call.slot
            if call.generation == slot.generation:
                slot.outstanding -= 1
                if call.replace_instance:
                    self._replace(slot, call.error or "it failed")
            self._cv.notify_all()
        call.done.set()

    def _replace(self, slot: _Slot, why: str) -> None:
        self.deaths += 1
        log.warning("replacing instance %s of %s: %s", self._who(slot), self.name, why)
        _kill(slot.handle)
        self._start(slot)

    def _check_health(self) -> None:
        now = time.monotonic()
        with self._cv:
            for slot in self.slots:
                if slot.ping_ref is not None:
                    ready, _ = ray.wait([slot.ping_ref], timeout=0)
                    if ready:
                        slot.ping_ref = None
                        try:
                            slot.pid = ray.get(ready[0])
                            slot.answered = True
                        except ray.exceptions.RayActorError as exc:
                            if slot.outstanding == 0:  # else its calls fail, and replace it
                                self._replace(slot, f"it died while idle: {_first_line(exc)}")
                        except ray.exceptions.RayError:
                            pass
                        continue
                    limit = self.hang_secs if slot.answered else max(self.hang_secs, STARTING_GRACE_SECS)
                    if now - slot.ping_sent > limit:
                        log.error(
                            "instance %s of %s did not answer for %.0fs: killing it (its calls fail)",
                            self._who(slot),
                            self.name,
                            now - slot.ping_sent,
                        )
                        slot.ping_ref = None
                        _kill(slot.handle)
                        if slot.outstanding == 0:
                            self._replace(slot, "it hung while idle")
                    continue
                if now - slot.ping_sent >= PING_SECS:
                    slot.ping_ref = slot.handle.ping.remote()
                    slot.ping_sent = now

    @staticmethod
    def _who(slot: _Slot) -> str:
        return f"#{slot.index}" + (f" (pid {slot.pid})" if slot.pid else "")

    # -- reporting and shutdown ----------------------------------------------------------------

    def stats(self) -> OperatorStats:
        with self._cv:
            return OperatorStats(
                op=self.name,
                runtime_pid=os.getpid(),
                instances=self.size,
                started=self.started,
                deaths=self.deaths,
                calls=self.calls,
                rows=self.rows,
                busy_secs=round(self.busy.busy_secs, 3),
                all_busy_secs=round(self.busy.all_busy_secs, 3),
                window_secs=round(self.busy.window_secs(), 3),
                busy_now=sum(1 for s in self.slots if s.outstanding),
            )

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()
            for slot in self.slots:
                _kill(slot.handle)


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # it may be gone already
        ray.kill(handle, no_restart=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        calls: list[_Call] = []
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
    def _raise_failed(calls: list[_Call]) -> None:
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
