"""How one shard attempt is processed. Only this package imports Data-Juicer or Ray at run time."""

from __future__ import annotations

import os

from elastic_sharding.errors import UsageError
from elastic_sharding.work.runners.base import AttemptContext, NodeRuntime, Runner

RUNNERS = ("warm", "process")
# The default runner; tests and operators can switch every command to the other one at once.
DEFAULT_RUNNER = os.environ.get("ELASTIC_SHARD_RUNNER", "warm")


def get_runner(name: str, runtime: NodeRuntime | None = None) -> Runner:
    runtime = runtime or NodeRuntime()
    if name == "warm":
        from elastic_sharding.work.runners.warm import WarmRunner

        return WarmRunner(runtime)
    if name == "process":
        from elastic_sharding.work.runners.process import ProcessRunner

        return ProcessRunner(runtime)
    raise UsageError(f"unknown runner {name!r}; choose one of {', '.join(RUNNERS)}")


__all__ = ["AttemptContext", "DEFAULT_RUNNER", "NodeRuntime", "Runner", "RUNNERS", "get_runner"]
