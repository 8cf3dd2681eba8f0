"""What a runner gets for one attempt, and how it is told to stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class AttemptContext:
    """One attempt as a runner sees it: inputs, where to write, and a stop signal.

    `stop(reason)` may be called from another thread or a signal handler, so it only records the
    reason; runners poll `stop_reason()` (at least twice a second) and end their work themselves.
    """

    shard_id: str
    attempt_dir: Path
    recipe_path: Path
    log_path: Path
    ray_output: Path
    env: dict[str, str]
    set_phase: Callable[[str], None] = lambda phase: None
    _reason: str | None = None

    def stop(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason

    def stop_reason(self) -> str | None:
        return self._reason


class Runner(Protocol):
    name: str

    def run(self, ctx: AttemptContext) -> None:
        """Process ctx's shard into ctx.ray_output; raise AttemptFailed on failure."""
