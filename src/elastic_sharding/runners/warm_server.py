"""The warm runtime: one process that keeps Ray and Data-Juicer loaded and runs shard after shard.

Started by the worker's warm runner (`python -m elastic_sharding.runners.warm_server`), so a
crash or hang here costs the worker one attempt, never the worker itself. Requests arrive on
stdin and events leave on `--events-fd`, one JSON object per line. A pulse thread reports every
PULSE_SECS that the process and the Ray processes it started are alive; the worker treats a
silence as a hang.

Per shard, fd 1 and 2 point at the attempt's log, Data-Juicer's logger is set up afresh for the
attempt's work dir, and the input is materialised as it is read, before Data-Juicer probes its
columns and schema: a probe of a lazy read cancels the running read task, and Ray then kills the
warm Ray worker that ran it (a ~1 s worker restart per shard).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO

import orjson

from . import lifeline, ray_runtime

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


class _Output:
    """Points fd 1 and 2 at a log file; back at the runtime log afterwards."""

    def __init__(self, runtime_log_fd: int):
        self._home = runtime_log_fd

    def to(self, path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._point(fd)
        os.close(fd)

    def home(self) -> None:
        self._point(self._home)

    @staticmethod
    def _point(fd: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)


def _pulse(events: Events, busy: dict[str, Any]) -> None:
    """Runs from before ray.init, so a start-up that hangs is noticed like any other hang."""
    while True:
        time.sleep(PULSE_SECS)
        problem = ray_runtime.runtime_alive() if busy.get("ready") else None
        if problem is not None:
            events.send(event="fatal", error=f"the node-local Ray runtime died: {problem}")
            os._exit(3)
        events.send(event="pulse", shard=busy.get("shard"))


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


def _run_shard(recipe: str) -> None:
    from data_juicer.config import init_configs
    from data_juicer.core.executor.ray_executor import RayExecutor
    from data_juicer.utils import logger_utils

    logger_utils.LOGGER_SETUP = False
    cfg = init_configs(args=["--config", recipe])
    RayExecutor(cfg).run()


def _end_attempt_logging() -> None:
    """Flush and close the attempt's log sinks so its files are complete before the next shard."""
    from loguru import logger

    logger.complete()
    logger.remove()


def serve(args: argparse.Namespace) -> int:
    events = Events(os.fdopen(args.events_fd, "wb", buffering=0))
    output = _Output(os.dup(1))
    started = time.monotonic()
    busy: dict[str, Any] = {}
    threading.Thread(target=_pulse, args=(events, busy), name="pulse", daemon=True).start()
    try:
        info = ray_runtime.init_ray(args)
        _load_custom_ops_once()
        _materialize_reads()
    except BaseException as exc:  # noqa: BLE001 - reported to the worker, which fails the attempt
        traceback.print_exc()
        events.send(event="fatal", error=f"{type(exc).__name__}: {exc}")
        return 3
    busy["ready"] = True
    events.send(event="ready", pid=os.getpid(), secs=time.monotonic() - started, ray=info)
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        if request.get("op") == "quit":
            break
        busy["shard"] = request["shard"]
        began = time.monotonic()
        os.chdir(request["cwd"])
        output.to(request["log"])
        ok, error = True, None
        try:
            _run_shard(request["recipe"])
        except BaseException as exc:  # noqa: BLE001 - the attempt fails, the worker decides what next
            traceback.print_exc()
            ok, error = False, f"{type(exc).__name__}: {exc}"
        finally:
            _end_attempt_logging()
            output.home()
            busy.pop("shard", None)
        events.send(event="result", ok=ok, error=error, secs=time.monotonic() - began)
    import ray

    ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    lifeline.hold_group()
    parser = argparse.ArgumentParser(prog="warm_server")
    parser.add_argument("--events-fd", type=int, required=True)
    ray_runtime.add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
