"""Paths inside a job directory. Every identifier that becomes a path is checked first, so a
name read from a record or the command line can never point outside the job directory; the
directories the tool descends into are checked not to be symbolic links planted there (the job
directory itself may be one: only links inside it are refused)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding import confined
from elastic_sharding.errors import JobStateError, UsageError
from elastic_sharding.records import ATTEMPT_ID_RE, SHARD_ID_RE, TOKEN_RE, Manifest, load

log = logging.getLogger(__name__)

STATE_DIRS = ("locks", "stale_locks", "done", "failed", "history", "backups", "blocks")
_SUFFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def check_shard_id(shard_id: str) -> str:
    if not SHARD_ID_RE.match(shard_id):
        raise UsageError(f"{shard_id!r} is not a shard id (expected part-NNNNN-of-NNNNN)")
    return shard_id


def check_attempt_id(attempt_id: str) -> str:
    if not ATTEMPT_ID_RE.match(attempt_id):
        raise JobStateError(f"{attempt_id!r} is not a valid attempt id; check the record that names it")
    return attempt_id


@dataclass(frozen=True)
class JobLayout:
    """The job directory `root`, seen from one segment of its recipe: segment 0's shards, attempts
    and claims sit in the job directory itself, segment k's beside its deduplication stage in
    `stages/<k>/` (`segment(k)`); the manifest, recipe, caches and merge are the job's."""

    root: Path
    segment_index: int = 0

    def segment(self, index: int) -> JobLayout:
        return JobLayout(self.root, index)

    def stage_dir(self, index: int) -> Path:
        """Deduplication stage `index` (>= 1) and the recipe segment that follows it."""
        if index < 1:
            raise JobStateError(f"stage {index} does not exist (stages count from 1); report this as a bug")
        return self.root / "stages" / str(index)

    @property
    def base(self) -> Path:
        return self.root if self.segment_index == 0 else self.stage_dir(self.segment_index)

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.yaml"

    @property
    def shards_dir(self) -> Path:
        return self.base / "shards"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def attempts_root(self) -> Path:
        return self.base / "attempts"

    @property
    def runtime_logs(self) -> Path:
        """Logs of the warm runtimes (one per worker start-up); attempt logs stay in attempts/."""
        return self.root / "logs"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def refusals(self) -> Path:
        """One record per host whose worker refused to claim (`work.node_check`)."""
        return self.root / "refusals"

    def refusal(self, host: str) -> Path:
        name = host if _SUFFIX_RE.match(host) and not host.startswith(".") else hashlib.sha256(host.encode()).hexdigest()[:16]
        return self.refusals / f"{name}.json"

    @property
    def merge_record(self) -> Path:
        return self.root / "merge.json"

    @property
    def default_output(self) -> Path:
        return self.root / "merged.jsonl"

    @property
    def analysis_stage(self) -> Path:
        """The units of a `--analyze` job's analysis (`AnalysisLayout`)."""
        return self.root / "analysis-stage"

    @property
    def default_analysis(self) -> Path:
        """Where a `--analyze` job's analysis directory is published without `--output`."""
        return self.root / "analysis"

    @property
    def own_names(self) -> frozenset[str]:
        """The names the tool keeps directly in the job directory: no output may take one."""
        paths = (self.manifest, self.recipe, self.merge_record, self.shards_dir, self.attempts_root, self.state)
        extra = (self.cache_dir, self.runtime_logs, self.refusals, self.root / "stages", self.analysis_stage)
        return frozenset(path.name for path in (*paths, *extra))

    def shard_input(self, shard_id: str, suffix: str = ".jsonl") -> Path:
        """A shard's input file: JSON lines, or (`.parquet`) a prepared Parquet input's row groups."""
        return self.shards_dir / f"{check_shard_id(shard_id)}{suffix}"

    def attempts_dir(self, shard_id: str) -> Path:
        return self.attempts_root / check_shard_id(shard_id)

    def attempt_dir(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempts_dir(shard_id) / check_attempt_id(attempt_id)

    @property
    def locks_dir(self) -> Path:
        return self.state / "locks"

    @property
    def done_dir(self) -> Path:
        return self.state / "done"

    @property
    def failed_dir(self) -> Path:
        return self.state / "failed"

    def lock(self, shard_id: str) -> Path:
        return self.locks_dir / f"{check_shard_id(shard_id)}.json"

    def done(self, shard_id: str) -> Path:
        return self.done_dir / f"{check_shard_id(shard_id)}.json"

    def failed(self, shard_id: str) -> Path:
        return self.failed_dir / f"{check_shard_id(shard_id)}.json"

    def done_block(self, block: int) -> Path:
        """The marker that every shard of block `block` (`claims.takeover.DONE_BLOCK` shards in
        manifest order) is done: a hint that saves each worker reading their claims one by one."""
        return self.state / "blocks" / f"{block:06d}.done"

    @property
    def backups_dir(self) -> Path:
        return self.state / "backups"

    def backup(self, shard_id: str, of_token: str) -> Path:
        """The backup record of the claim `of_token` of a shard (`records.BackupRecord`)."""
        if not TOKEN_RE.match(of_token):
            raise JobStateError(f"{of_token!r} is not a claim token; check the claim record that names it")
        return self.backups_dir / f"{check_shard_id(shard_id)}.{of_token}.json"

    def stale_lock(self, shard_id: str, suffix: str) -> Path:
        if not _SUFFIX_RE.match(suffix):
            raise JobStateError(f"{suffix!r} is not a valid stale-lock suffix; report this as a bug")
        return self.state / "stale_locks" / f"{check_shard_id(shard_id)}.{suffix}.json"

    @property
    def history(self) -> Path:
        return self.state / "history"

    def archived(self, retry_id: str, shard_id: str) -> dict[str, Path]:
        """Where a `retry` moves a shard's attempts, failure record and claim."""
        root = self.history / retry_id / check_shard_id(shard_id)
        return {"root": root, "attempts": root / "attempts", "failed": root / "failed.json", "lock": root / "lock.json"}

    @property
    def skeleton(self) -> tuple[Path, ...]:
        """The directories prepare creates, which every command descends into."""
        return (self.shards_dir, self.attempts_root, self.state, *(self.state / name for name in STATE_DIRS))

    def existing_attempt_dir(self, shard_id: str, attempt_id: str) -> Path:
        """An attempt directory to read from, refusing (LinkRefused) a link planted at it or at
        attempts/<shard>: two lstats, cheap enough for every running claim of every scan."""
        confined.refuse_link(self.attempts_dir(shard_id))
        path = self.attempt_dir(shard_id, attempt_id)
        confined.refuse_link(path)
        return path

    def load_manifest(self) -> Manifest:
        """The manifest, after checking that neither it nor the job's directories are links."""
        if not self.root.is_dir():
            raise JobStateError(f"{self.root}: job directory does not exist (run prepare first)")
        if not confined.lexists(self.manifest):
            raise JobStateError(
                f"{self.root}: not a prepared job directory (no manifest.json); pass the --job-dir that prepare created"
            )
        for directory in self.skeleton:
            if confined.kind(directory) == "link":
                raise JobStateError(str(confined.LinkRefused(directory)))
        manifest = load(Manifest, self.manifest)
        for spec in manifest.shards:
            check_shard_id(spec.shard_id)
            if spec.path != f"shards/{spec.shard_id}{shard_suffix(manifest.input_format)}":
                raise JobStateError(
                    f"{self.manifest}: shard {spec.shard_id} has an unexpected path {spec.path!r}; restore the manifest prepare wrote"
                )
        return manifest


def shard_suffix(input_format: str) -> str:
    """A prepared shard's file ending: JSON lines, or Parquet for a Parquet input."""
    return ".parquet" if input_format == "parquet" else ".jsonl"


def attempt_ids(directory: Path) -> list[str]:
    """The attempt directories in attempts/<shard> (or an archived copy of it), sorted.

    Entries that are not directories named like attempt ids (links among them) are skipped and
    never followed; a link in place of `directory` itself raises LinkRefused."""
    try:
        entries = confined.list_dir(directory)
    except FileNotFoundError:
        return []
    ids = []
    for name, found in sorted(entries.items()):
        if found == "dir" and ATTEMPT_ID_RE.match(name):
            ids.append(name)
        elif not name.startswith("."):
            log.warning("ignoring %s: not an attempt directory (%s)", directory / name, found)
    return ids


def attempt_files(attempt_dir: Path) -> dict[str, Path]:
    return {
        "record": attempt_dir / "attempt.json",
        "heartbeat": attempt_dir / "heartbeat.json",
        "superseded": attempt_dir / "superseded.json",
        "log": attempt_dir / "process.log",
        "recipe": attempt_dir / "recipe.yaml",
        "ray_output": attempt_dir / "ray-output.jsonl",
    }


# An attempt's collected output, by how it is stored (`work/output_codec.py`).
PROCESSED_NAMES = {"none": "processed.jsonl", "zstd": "processed.jsonl.zst"}


def processed_file(attempt_dir: Path, codec: str = "none") -> Path:
    return attempt_dir / PROCESSED_NAMES[codec]


def preparing_dir(job_root: Path) -> Path:
    """A prepare works beside the job directory it will publish (renamed into place at the end)."""
    return job_root.parent / f".{job_root.name}.preparing"


class UnitFiles:
    """The claim, heartbeat and result of each unit kept in `units/` (`claims.units.UnitPaths`)."""

    units: Path

    def lock(self, unit: str) -> Path:
        return self.units / f"{unit}.lock"

    def stale_lock(self, unit: str, suffix: str) -> Path:
        return self.units / f"{unit}.lock.{suffix}"

    def beat(self, unit: str) -> Path:
        return self.units / f"{unit}.beat"

    def result(self, unit: str) -> Path:
        return self.units / f"{unit}.json"


class PrepareLayout(UnitFiles):
    """The paths of a prepare under way: its plan, its units' claims, heartbeats and results, and
    the staged job directory."""

    def __init__(self, root: Path, job_root: Path):
        self.root = root
        self.job_root = job_root
        self.plan = root / "plan.json"
        self.failed = root / "failed.json"
        self.units = root / "units"
        self.stage = root / "stage"

    def blob(self, unit: str) -> Path:
        return self.units / f"{unit}.bin"


class StageLayout(UnitFiles):
    """A deduplication stage: its units' claims and results, its end and its failure, and the
    create-once data files its units write (`dedup/stage.py`)."""

    def __init__(self, root: Path):
        self.root = root
        self.units = root / "units"
        self.done = root / "stage.json"
        self.failed = root / "failed.json"

    @staticmethod
    def unit_name(phase: str, index: int, round_number: int | None = None) -> str:
        return f"{phase}-{index:05d}" if round_number is None else f"{phase}-r{round_number:04d}-{index:05d}"

    def kept(self, shard_index: int) -> Path:
        """The result of the keep unit of one shard (`records.KeptShard`)."""
        return self.result(self.unit_name("keep", shard_index))

    def key_file(self, shard_index: int) -> Path:
        return self.root / "keys" / f"{shard_index:05d}.rec"

    def bucket_file(self, part: int) -> Path:
        return self.root / "buckets" / f"{part:05d}.rec"

    def adjacency_file(self, part: int) -> Path:
        return self.root / "adjacency" / f"{part:05d}.rec"

    def labels_file(self, round_number: int, part: int) -> Path:
        return self.root / "rounds" / f"{round_number:04d}" / f"labels-{part:05d}.rec"

    def messages_file(self, round_number: int, part: int) -> Path:
        return self.root / "rounds" / f"{round_number:04d}" / f"messages-{part:05d}.rec"


class AnalysisLayout(UnitFiles):
    """The analysis of a `--analyze` job (`analysis/cooperate.py`): its units' claims and results,
    its end and its failure, each shard's sorted statistic columns, and the finished directory."""

    unit_name = staticmethod(StageLayout.unit_name)

    def __init__(self, root: Path):
        self.root = root
        self.units = root / "units"
        self.done = root / "stage.json"
        self.failed = root / "failed.json"
        self.report = root / "report"

    def shard_dir(self, shard_index: int) -> Path:
        return self.root / "shards" / f"{shard_index:05d}"


def coordination_root(job_dir: Path) -> Path:
    """The `dlc` submissions of a job coordinate beside it, one directory per run id."""
    job = Path(os.path.abspath(job_dir))
    return job.parent / f".{job.name}.dlc-coordination"


class SubmissionLayout:
    """The paths of one `dlc` submission: its run record, phase locks, heartbeats and results,
    its outcome and abort records."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def stale_dir(self) -> Path:
        return self.root / "stale"

    def lock_path(self, phase: str) -> Path:
        return self.root / f"{phase}.lock"

    def heartbeat_path(self, phase: str) -> Path:
        return self.root / f"{phase}.heartbeat"

    def result_path(self, phase: str) -> Path:
        return self.root / f"{phase}-result.json"
