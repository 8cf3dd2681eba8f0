"""The warm runtime: one process that keeps Ray, Data-Juicer and the warm operators loaded.

Started by the worker's warm runner (`python -m elastic_sharding.work.runners.warm_server`), so a
crash or hang here costs the worker its attempts in flight, never the worker itself. Requests
arrive on stdin and events leave on `--events-fd`, one JSON object per line. A pulse thread
reports every PULSE_SECS that the process and the Ray processes it started are alive, with the
warm operators' figures; the worker treats a silence as a hang.

Each `run` request is one attempt, run in its own thread, so the worker can send the next shard
while the current one drains and the warm operators never wait at a shard boundary (at most two
run at once). The thread's output and Data-Juicer's log lines go to the attempt's log
(`attempt_logs`); a `cancel` request stops one attempt and leaves the runtime and its warm
operators to the others. The input is materialised as it is read, before Data-Juicer probes its
columns and schema: a probe of a lazy read cancels the running read task, and Ray then kills the
warm Ray worker that ran it (a ~1 s worker restart per shard).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO

import orjson

from elastic_sharding.work.runners import lifeline, ray_runtime

PULSE_SECS = 0.5
# Below this many rows a second pass to split the read costs more than the parallelism gains.
REPARTITION_MIN_ROWS = 2048


class Events:
    def __init__(self, handle: BinaryIO):
        self._handle = handle
        self._lock = threading.Lock()

    def send(self, **event: Any) -> None:
        with self._lock:
            self._handle.write(orjson.dumps(event) + b"\n")


def _pulse(events: Events, state: _State) -> None:
    """Runs from before ray.init, so a start-up that hangs is noticed like any other hang."""
    while True:
        time.sleep(PULSE_SECS)
        if state.ready:
            problem = ray_runtime.runtime_alive()
            if problem is not None:
                events.send(event="fatal", error=f"the node-local Ray runtime died: {problem}")
                os._exit(3)
        events.send(event="pulse", attempts=state.attempts(), operators=state.operators())


def _import_data_juicer() -> None:
    """While ray.init starts Ray's processes: the driver's share of Data-Juicer's import time."""
    with contextlib.suppress(Exception):  # imported again, and reported, where it is used
        import data_juicer.config  # noqa: F401
        import data_juicer.core.executor.ray_executor  # noqa: F401


def _warm_up_ray_workers() -> None:
    """Ray starts its worker processes lazily, and each imports Data-Juicer when it first
    unpickles an operator: do both now on every CPU, while the first shard's recipe is parsed."""
    import ray

    @ray.remote(num_cpus=1)
    def touch() -> int:
        import data_juicer.core.data.ray_dataset  # noqa: F401
        import data_juicer.ops  # noqa: F401

        return os.getpid()

    with contextlib.suppress(Exception):  # only a head start; the shards import what they need
        ray.get([touch.remote() for _ in range(int(ray.cluster_resources().get("CPU", 1)))], timeout=120)


def _load_custom_ops_once() -> None:
    """Data-Juicer refuses to load a custom operator module twice; the warm process loads each once."""
    from data_juicer.config import config as dj_config

    original = dj_config.load_custom_operators
    loaded: set[str] = set()

    def load_new(paths: list[str]) -> None:
        fresh = [p for p in paths if os.path.abspath(p) not in loaded]
        if fresh:
            original(fresh)
            loaded.update(os.path.abspath(p) for p in fresh)

    dj_config.load_custom_operators = load_new


def _materialize_reads() -> None:
    """Read each shard fully before Data-Juicer inspects it (see the module docstring), in at
    least as many blocks as the runtime has CPUs: a small shard file is read as one block, and one
    block is processed by one task on one CPU while the others idle (12.5k-row shards on 2 CPUs:
    ~12 % faster). Row order inside the output does not matter (the worker restores it) and the
    recipe's operators are row-wise."""
    import ray
    from data_juicer.core.data.ray_dataset import RayDataset

    original = RayDataset.read.__func__

    def read(cls: type, data_format: str, paths: Any, **kwargs: Any) -> Any:
        dataset = original(cls, data_format, paths, **kwargs).materialize()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        if dataset.num_blocks() < cpus and dataset.count() >= REPARTITION_MIN_ROWS:
            dataset = dataset.repartition(cpus).materialize()
        return dataset

    RayDataset.read = classmethod(read)


class _State:
    def __init__(self) -> None:
        self.ready = False
        self.warm: Any = None
        self.recipes: Any = None
        self._running: dict[str, int] = {}  # attempt id -> ident of the thread running it
        self._lock = threading.Lock()

    def enter(self, attempt: str) -> None:
        with self._lock:
            self._running[attempt] = threading.get_ident()

    def leave(self, attempt: str) -> None:
        with self._lock:
            self._running.pop(attempt, None)

    def thread_of(self, attempt: str) -> int | None:
        with self._lock:
            return self._running.get(attempt)

    def attempts(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def operators(self) -> list[dict[str, Any]]:
        return self.warm.stats() if self.warm is not None else []


def _run_shard(recipe: str, recipes: Any, analyze: bool) -> None:
    from data_juicer.core.executor.ray_executor import RayExecutor

    from elastic_sharding.work.runners.stats_only import stats_only

    with stats_only(analyze):
        RayExecutor(recipes.config(recipe)).run()


def _attempt(request: dict[str, Any], state: _State, logs: Any, events: Events) -> None:
    from elastic_sharding.work.runners.actor_pool import AttemptCancelled

    attempt = request["attempt"]
    began = time.monotonic()
    ok, error = True, None
    try:
        state.enter(attempt)
        try:
            logs.start(request["log"])
            state.warm.begin_attempt(attempt)
            if state.warm.is_cancelled(attempt):
                raise AttemptCancelled(attempt)
            _run_shard(request["recipe"], state.recipes, bool(request.get("stats_only")))
        except BaseException as exc:  # noqa: BLE001 - the attempt fails, the worker decides what next
            traceback.print_exc()
            ok, error = False, f"{type(exc).__name__}: {exc}"
        finally:
            state.leave(attempt)  # no cancel reaches this thread after this
            state.warm.end_attempt()
            logs.end()
    except AttemptCancelled:  # a cancel that landed while the attempt was ending
        ok, error = False, "AttemptCancelled: while it ended"
    events.send(event="result", attempt=attempt, ok=ok, error=error, secs=time.monotonic() - began, operators=state.operators())


def _cancel(state: _State, attempt: str) -> None:
    """Stop one attempt: its warm-operator calls are refused, and its thread gets an exception
    at its next Python instruction (the runner kills the runtime if that does not end it)."""
    from elastic_sharding.work.runners.actor_pool import AttemptCancelled

    state.warm.cancel(attempt)
    ident = state.thread_of(attempt)
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(AttemptCancelled))


def serve(args: argparse.Namespace) -> int:
    events = Events(os.fdopen(args.events_fd, "wb", buffering=0))
    started = time.monotonic()
    state = _State()
    threading.Thread(target=_pulse, args=(events, state), name="pulse", daemon=True).start()
    importing = threading.Thread(target=_import_data_juicer, name="import", daemon=True)
    importing.start()
    try:
        info = ray_runtime.init_ray(args)
        importing.join()
        _load_custom_ops_once()
        _materialize_reads()
        from elastic_sharding.work.runners import stats_only

        stats_only.install()
        from elastic_sharding.work.runners.attempt_logs import AttemptLogs
        from elastic_sharding.work.runners.recipe_cache import RecipeCache
        from elastic_sharding.work.runners.warm_ops import WarmOperators

        logs = AttemptLogs()
        state.recipes = RecipeCache()
        state.warm = WarmOperators(args.hang_secs, on_feeding=lambda attempt: events.send(event="feeding", attempt=attempt))
        state.warm.install()
    except BaseException as exc:  # noqa: BLE001 - reported to the worker, which fails the attempt
        traceback.print_exc()
        events.send(event="fatal", error=f"{type(exc).__name__}: {exc}")
        return 3
    state.ready = True
    events.send(event="ready", pid=os.getpid(), secs=time.monotonic() - started, ray=info)
    threading.Thread(target=_warm_up_ray_workers, name="warm-up", daemon=True).start()
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        if request.get("op") == "quit":
            break
        if request.get("op") == "cancel":
            _cancel(state, request["attempt"])
            continue
        thread = threading.Thread(
            target=_attempt, args=(request, state, logs, events), name=f"attempt-{request['shard']}", daemon=True
        )
        thread.start()
    import ray

    state.warm.close()
    ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    lifeline.hold_group()
    parser = argparse.ArgumentParser(prog="warm_server")
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--hang-secs", type=float, default=30.0)
    ray_runtime.add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
