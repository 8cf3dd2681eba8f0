"""What a runner gets for one attempt, how it is told to stop, and the node runtime it may keep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


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
    set_phase: Callable[..., None] = lambda phase, **progress: None
    note: Callable[..., None] = lambda **progress: None
    setup_secs: float = 0.0  # the runner adds the time it spent starting its node runtime
    operators: list[dict[str, Any]] | None = None  # the warm operators' figures when it ended
    attempt_id: str = ""
    stats_only: bool = False  # an attempt of a `--analyze` job: its filters compute statistics only
    _reason: str | None = None

    def stop(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason

    def stop_reason(self) -> str | None:
        return self._reason


@dataclass(frozen=True)
class NodeRuntime:
    """The node-local Ray runtime a worker's runner starts (or joins), fixed for the worker's life.

    The caps apply only when the runner starts its own runtime (`ray_address: local`); an existing
    head brings its own resources.
    """

    ray_address: str = "local"
    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_mb: int | None = None
    temp_dir: str | None = None
    custom_operator_paths: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    hang_secs: float = 30.0

    @property
    def starts_own(self) -> bool:
        return self.ray_address == "local"

    def caps_given(self) -> bool:
        return any(v is not None for v in (self.num_cpus, self.num_gpus, self.object_store_mb, self.temp_dir))

    def entry_args(self) -> list[str]:
        """Command-line form for the child processes that start Ray (see ray_runtime.add_arguments)."""
        args = ["--ray-address", self.ray_address]
        for flag, value in (
            ("--num-cpus", self.num_cpus),
            ("--num-gpus", self.num_gpus),
            ("--object-store-mb", self.object_store_mb),
            ("--temp-dir", self.temp_dir),
        ):
            if value is not None:
                args += [flag, str(value)]
        for path in self.custom_operator_paths:
            args += ["--custom-op", path]
        return args


class Runner(Protocol):
    """`run` is all a runner must have. A runner that can overlap attempts (the warm runner) also
    has `begin(ctx)`, which starts a claimed-ahead attempt at once, before its `run` (which then
    waits for it), and `cancel(ctx)`, for a begun attempt that will not be run."""

    name: str

    def run(self, ctx: AttemptContext) -> None:
        """Process ctx's shard into ctx.ray_output; raise AttemptFailed on failure. The worker
        collects that export into processed.jsonl and then removes it, so nothing may write there
        once `run` has returned (or raised); an attempt only begun and then cancelled is removed
        again once the runner is closed."""

    def close(self) -> None:
        """Release whatever the runner keeps between attempts (called once, when the worker ends)."""
