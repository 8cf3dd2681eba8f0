"""The job's settings, in one place: their defaults, their flags, their validation, and how one
worker overrides them.

`prepare` (and every launcher) stores the settings in the manifest, so every worker of a job
uses the same lease, retries and Ray options; a `worker` may override each one for itself with
the same flag. The overrides are derived from the fields of `Settings`, so a new setting is one
line in `Settings` plus one in `SETTINGS` and nothing is mirrored by hand.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any

from elastic_sharding.errors import UsageError
from elastic_sharding.vocabulary import OutputCodec

DEFAULT_LOCK_TIMEOUT = 126000.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_POLL_INTERVAL = 20.0
DEFAULT_RAY_ADDRESS = "local"
DEFAULT_CLAIM_AHEAD = 10.0
MAX_HEARTBEAT_INTERVAL = 30.0
# The launchers (dlc, mpi, local) heartbeat every claim, so a short lease is safe and a crashed
# node's shard is taken over in minutes; the original demo's 126000 s stays the default of `prepare`.
LAUNCHER_LOCK_TIMEOUT = 600.0
LAUNCHER_POLL_INTERVAL = 2.0
# Backup attempts (docs/concepts/claims.md, "Backup attempts"); chosen from bench/ `tail`.
DEFAULT_BACKUP_AFTER = 1.5
DEFAULT_BACKUP_MIN_SECS = 3.0
DEFAULT_BACKUP_SHARE = 0.1
# How workers store shard outputs; chosen from bench/ `parquet` and `run` (docs/concepts/outputs.md).
DEFAULT_OUTPUT_CODEC = OutputCodec.ZSTD.value


@dataclass
class Settings:
    """Defaults a worker uses unless its command line overrides them (stored in the manifest)."""

    lock_timeout_secs: float
    max_retries: int
    poll_interval_secs: float
    heartbeat_interval_secs: float
    ray_address: str
    ray_num_cpus: int | None = None
    ray_num_gpus: int | None = None
    ray_object_store_mb: int | None = None
    ray_temp_dir: str | None = None
    claim_ahead_secs: float = DEFAULT_CLAIM_AHEAD
    backup_after: float = DEFAULT_BACKUP_AFTER
    backup_min_secs: float = DEFAULT_BACKUP_MIN_SECS
    backup_share: float = DEFAULT_BACKUP_SHARE
    shard_output_codec: str = DEFAULT_OUTPUT_CODEC


@dataclass(frozen=True)
class Setting:
    """One setting's flag: its type, its default for `prepare` and for the launchers, its help,
    and (for a default of None) what None means."""

    flag: str
    kind: type
    default: Any
    launcher_default: Any
    text: str
    unset_means: str | None = None

    @property
    def key(self) -> str:
        return self.flag[2:].replace("-", "_")


SETTINGS = (
    Setting(
        "--lock-timeout-secs",
        float,
        DEFAULT_LOCK_TIMEOUT,
        LAUNCHER_LOCK_TIMEOUT,
        "claim lease: a claim whose heartbeat does not change for this long is stale",
    ),
    Setting("--max-retries", int, DEFAULT_MAX_RETRIES, DEFAULT_MAX_RETRIES, "retries after the first failure"),
    Setting(
        "--poll-interval-secs",
        float,
        DEFAULT_POLL_INTERVAL,
        LAUNCHER_POLL_INTERVAL,
        "worker wait when nothing is claimable (launchers: also their coordination polling)",
    ),
    Setting("--heartbeat-interval-secs", float, None, None, "claim renewal interval", "min(30, lock timeout / 4)"),
    Setting("--ray-address", str, DEFAULT_RAY_ADDRESS, DEFAULT_RAY_ADDRESS, "node-local Ray address for workers"),
    Setting("--ray-num-cpus", int, None, None, "CPUs the node-local Ray runtime may use", "all"),
    Setting("--ray-num-gpus", int, None, None, "GPUs the node-local Ray runtime may use", "all Ray detects"),
    Setting("--ray-object-store-mb", int, None, None, "object store size of the node-local Ray runtime", "Ray's, 30%% of RAM"),
    Setting("--ray-temp-dir", str, None, None, "Ray's session/socket directory, a short absolute path", "Ray's /tmp/ray"),
    Setting(
        "--claim-ahead-secs",
        float,
        DEFAULT_CLAIM_AHEAD,
        DEFAULT_CLAIM_AHEAD,
        "claim and stage the next shard when the current one should end within this many seconds (0: off)",
    ),
    Setting(
        "--backup-after",
        float,
        DEFAULT_BACKUP_AFTER,
        DEFAULT_BACKUP_AFTER,
        "a running shard straggles once it has processed for over this many times the median shard's time for "
        "its size: an idle worker backs it up and status flags it (0: no backup attempts)",
    ),
    Setting(
        "--backup-min-secs",
        float,
        DEFAULT_BACKUP_MIN_SECS,
        DEFAULT_BACKUP_MIN_SECS,
        "and at least this many seconds past that median time",
    ),
    Setting(
        "--backup-share",
        float,
        DEFAULT_BACKUP_SHARE,
        DEFAULT_BACKUP_SHARE,
        "at most this share of the live workers run backup attempts at once (always at least one)",
    ),
    Setting(
        "--shard-output-codec",
        str,
        DEFAULT_OUTPUT_CODEC,
        DEFAULT_OUTPUT_CODEC,
        "how workers store each shard's output in the job directory: zstd (processed.jsonl.zst) or none "
        "(processed.jsonl); merged outputs are the same either way",
    ),
)

# One optional override per setting (None: the manifest's value), derived from the fields.
Overrides = make_dataclass(
    "Overrides",
    [(f.name, f"{f.type} | None", field(default=None)) for f in fields(Settings)],
    namespace={"__doc__": "One worker's overrides of the manifest's settings; None keeps the manifest's value."},
)


def default_heartbeat(lock_timeout: float) -> float:
    """Heartbeat often enough that a live claim renews several times per lease."""
    return min(MAX_HEARTBEAT_INTERVAL, lock_timeout / 4)


def add_arguments(parser: argparse.ArgumentParser, as_overrides: bool, launcher: bool = False) -> None:
    """The settings' flags: with their defaults (`prepare`, the launchers) or as overrides (`worker`)."""
    for setting in SETTINGS:
        if as_overrides:
            text = f"override for this worker: {setting.text} (default: the manifest's value)"
            parser.add_argument(setting.flag, type=setting.kind, help=text)
        else:
            value = setting.launcher_default if launcher else setting.default
            shown = "%(default)s" if value is not None else setting.unset_means
            parser.add_argument(setting.flag, type=setting.kind, default=value, help=f"{setting.text} (default {shown})")


def from_args(args: argparse.Namespace) -> Settings:
    """The settings a `prepare` or a launcher was given (the heartbeat defaults from the lease)."""
    values = {setting.key: getattr(args, setting.key) for setting in SETTINGS}
    values["heartbeat_interval_secs"] = args.heartbeat_interval_secs or default_heartbeat(args.lock_timeout_secs)
    return Settings(**values)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """A worker's overrides; a lease given without a heartbeat gets the heartbeat that lease implies."""
    overrides = {setting.key: getattr(args, setting.key) for setting in SETTINGS}
    if overrides["heartbeat_interval_secs"] is None and args.lock_timeout_secs is not None:
        overrides["heartbeat_interval_secs"] = default_heartbeat(args.lock_timeout_secs)
    return overrides


def with_overrides(settings: Settings, overrides: Any) -> Settings:
    """`settings` with every field `overrides` sets (any object with the fields' names), validated."""
    chosen = {f.name: getattr(overrides, f.name) for f in fields(Settings) if getattr(overrides, f.name) is not None}
    result = replace(settings, **chosen)
    validate_settings(result)
    return result


def validate_settings(settings: Settings) -> None:
    if settings.lock_timeout_secs <= 0:
        raise UsageError("--lock-timeout-secs must be positive")
    if settings.max_retries < 0:
        raise UsageError("--max-retries must be zero or more")
    if settings.poll_interval_secs <= 0:
        raise UsageError("--poll-interval-secs must be positive")
    if settings.heartbeat_interval_secs <= 0:
        raise UsageError("--heartbeat-interval-secs must be positive")
    if settings.heartbeat_interval_secs * 2 > settings.lock_timeout_secs:
        raise UsageError(
            f"--heartbeat-interval-secs ({settings.heartbeat_interval_secs:g}) must be at most half of "
            f"--lock-timeout-secs ({settings.lock_timeout_secs:g}) so a live claim always shows a heartbeat within one lease"
        )
    if not settings.ray_address:
        raise UsageError("--ray-address must not be empty")
    if settings.shard_output_codec not in tuple(OutputCodec):
        raise UsageError(f"--shard-output-codec must be one of {', '.join(OutputCodec)}, not {settings.shard_output_codec!r}")
    for flag, value in (
        ("--ray-num-cpus", settings.ray_num_cpus),
        ("--ray-object-store-mb", settings.ray_object_store_mb),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if settings.ray_num_gpus is not None and settings.ray_num_gpus < 0:
        raise UsageError("--ray-num-gpus must be zero or more")
    if settings.ray_object_store_mb is not None and settings.ray_object_store_mb < 75:
        raise UsageError("--ray-object-store-mb must be at least 75 (Ray's minimum object store)")
    if settings.claim_ahead_secs < 0:
        raise UsageError("--claim-ahead-secs must be zero or more")
    if settings.backup_after != 0 and settings.backup_after < 1:
        raise UsageError(f"--backup-after must be 0 (no backups) or at least 1, got {settings.backup_after:g}")
    if settings.backup_min_secs < 0:
        raise UsageError("--backup-min-secs must be zero or more")
    if not 0 < settings.backup_share <= 1:
        raise UsageError(f"--backup-share must be above 0 and at most 1, got {settings.backup_share:g}")
    if settings.ray_temp_dir is not None and not os.path.isabs(settings.ray_temp_dir):
        raise UsageError(f"--ray-temp-dir must be an absolute path, got {settings.ray_temp_dir!r}")
