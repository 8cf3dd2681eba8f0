"""What a runner gets for one attempt, and how it is told to stop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class AttemptContext:
    """One attempt as a runner sees it: inputs, where to write, and a stop signal.

    `stop(reason)` may be called from another thread (the heartbeat, a signal handler); the
    runner registers a callback with `on_stop` to end its child at once.
    """

    shard_id: str
    attempt_dir: Path
    recipe_path: Path
    log_path: Path
    ray_output: Path
    env: dict[str, str]
    set_phase: Callable[[str], None] = lambda phase: None
    _reason: str | None = None
    _callbacks: list[Callable[[str], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback(reason)

    def stop_reason(self) -> str | None:
        return self._reason

    def on_stop(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
            reason = self._reason
        if reason is not None:
            callback(reason)


class Runner(Protocol):
    name: str

    def run(self, ctx: AttemptContext) -> None:
        """Process ctx's shard into ctx.ray_output; raise AttemptFailed on failure."""
