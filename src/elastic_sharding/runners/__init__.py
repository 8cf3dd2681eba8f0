"""How one shard attempt is processed. Only this package imports Data-Juicer or Ray at run time."""

from __future__ import annotations

from ..errors import UsageError
from .base import AttemptContext, Runner

RUNNERS = ("process",)


def get_runner(name: str) -> Runner:
    if name == "process":
        from .process import ProcessRunner

        return ProcessRunner()
    raise UsageError(f"unknown runner {name!r}; choose one of {', '.join(RUNNERS)}")


__all__ = ["AttemptContext", "Runner", "RUNNERS", "get_runner"]
