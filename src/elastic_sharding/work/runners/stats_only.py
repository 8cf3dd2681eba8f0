"""Data-Juicer's own stats-only switch for the attempts of a `--analyze` job.

`RayDataset.process(ops, stats_only=True)` (what Data-Juicer's RayAnalyzer calls) computes every
Filter's statistics and drops no row; `RayExecutor.run` has no way to ask for it. So the engine's
`process` is wrapped once per runtime, and an attempt that is an analysis turns the switch on
for the thread that builds its dataset (the warm runtime runs two attempts at once, each in its
own thread; the process runner's child runs one, and turns it on for the whole process).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

ENV = "ELASTIC_SHARD_STATS_ONLY"  # set in a process runner child's environment: the whole child

_local = threading.local()
_installed = False


def install(default: bool = False) -> None:
    """Wrap `RayDataset.process` so that it reads the switch; `default` when no attempt set it."""
    global _installed
    if _installed:
        return
    from data_juicer.core.data.ray_dataset import RayDataset

    original = RayDataset.process

    def process(self: Any, operators: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "on", default):
            kwargs["stats_only"] = True
        return original(self, operators, *args, **kwargs)

    RayDataset.process = process
    _installed = True


@contextlib.contextmanager
def stats_only(on: bool) -> Iterator[None]:
    """The attempts this thread runs meanwhile compute statistics only (when `on`)."""
    previous = getattr(_local, "on", None)
    _local.on = on
    try:
        yield
    finally:
        if previous is None:
            del _local.on
        else:
            _local.on = previous
