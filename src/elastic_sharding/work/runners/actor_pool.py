"""A pool of long-lived Ray actors of one operator, and the calls the driver routes to them.

Each instance holds one operator object (and its model) for the warm runtime's life. The driver
keeps `DEPTH` calls queued per instance, sends each call to the least-loaded instance, watches
every instance with a health ping (one that does not answer for `hang_secs` is killed), replaces
instances that die, and records when each call began and ended (`BusyTracker`), from which the
pool reports the time every instance was busy at once. `warm_ops.py` decides what runs here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

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
class Call:
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
        self._calls: dict[Any, Call] = {}
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
    ) -> Call:
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
            call = Call(attempt, slot, slot.generation, out_ref, info_ref)
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
