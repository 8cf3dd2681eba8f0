"""Paths inside a job directory. Every identifier that becomes a path is checked first, so a
name read from a record or the command line can never point outside the job directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import JobStateError, UsageError
from .records import ATTEMPT_ID_RE, SHARD_ID_RE, Manifest, load

STATE_DIRS = ("locks", "stale_locks", "done", "failed", "history")


def check_shard_id(shard_id: str) -> str:
    if not SHARD_ID_RE.match(shard_id):
        raise UsageError(f"{shard_id!r} is not a shard id (expected part-NNNNN-of-NNNNN)")
    return shard_id


def check_attempt_id(attempt_id: str) -> str:
    if not ATTEMPT_ID_RE.match(attempt_id):
        raise JobStateError(f"{attempt_id!r} is not a valid attempt id")
    return attempt_id


@dataclass(frozen=True)
class JobLayout:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.yaml"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def attempts_root(self) -> Path:
        return self.root / "attempts"

    @property
    def runtime_logs(self) -> Path:
        """Logs of the warm runtimes (one per worker start-up); attempt logs stay in attempts/."""
        return self.root / "logs"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def merge_record(self) -> Path:
        return self.root / "merge.json"

    @property
    def default_output(self) -> Path:
        return self.root / "merged.jsonl"

    def shard_input(self, shard_id: str) -> Path:
        return self.shards_dir / f"{check_shard_id(shard_id)}.jsonl"

    def attempts_dir(self, shard_id: str) -> Path:
        return self.attempts_root / check_shard_id(shard_id)

    def attempt_dir(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempts_dir(shard_id) / check_attempt_id(attempt_id)

    def lock(self, shard_id: str) -> Path:
        return self.state / "locks" / f"{check_shard_id(shard_id)}.json"

    def done(self, shard_id: str) -> Path:
        return self.state / "done" / f"{check_shard_id(shard_id)}.json"

    def failed(self, shard_id: str) -> Path:
        return self.state / "failed" / f"{check_shard_id(shard_id)}.json"

    def stale_lock(self, shard_id: str, suffix: str) -> Path:
        return self.state / "stale_locks" / f"{check_shard_id(shard_id)}.{suffix}.json"

    @property
    def history(self) -> Path:
        return self.state / "history"

    def load_manifest(self) -> Manifest:
        if not self.root.is_dir():
            raise JobStateError(f"{self.root}: job directory does not exist (run prepare first)")
        if not self.manifest.exists():
            raise JobStateError(f"{self.root}: not a prepared job directory (no manifest.json)")
        manifest = load(Manifest, self.manifest)
        for spec in manifest.shards:
            check_shard_id(spec.shard_id)
            if spec.path != f"shards/{spec.shard_id}.jsonl":
                raise JobStateError(f"{self.manifest}: shard {spec.shard_id} has an unexpected path {spec.path!r}")
        return manifest


def attempt_files(attempt_dir: Path) -> dict[str, Path]:
    return {
        "record": attempt_dir / "attempt.json",
        "heartbeat": attempt_dir / "heartbeat.json",
        "superseded": attempt_dir / "superseded.json",
        "log": attempt_dir / "process.log",
        "recipe": attempt_dir / "recipe.yaml",
        "ray_output": attempt_dir / "ray-output.jsonl",
        "processed": attempt_dir / "processed.jsonl",
    }
