"""What a job's deduplication stages are doing, read from their files without writing to them.

A stage's units (`dedup/cooperate.py`) leave in `stages/<k>/units/` a claim (`<unit>.lock`,
`records.UnitClaim`: host, pid, and when it was claimed by the owner's clock), a heartbeat
(`<unit>.beat`) and, once done, a result (`<unit>.json`: `DedupUnitDone` with the seconds the
work took, or a keep unit's `KeptShard` with its start and end). From them:

- a unit is *done* once its result exists, *held* while only its claim does (a dead
  participant's claim included, until another takes it over); on the timeline a held unit whose
  heartbeat is older than the lease is drawn as stale, like an attempt;
- a unit's start is its claim's `at` and its end `at + secs` when the claim is its publisher's
  (the owner's clock, as attempts' times are), else the result's mtime less `secs`; a keep unit
  records both itself;
- totals: keys and keep have one unit per shard; the number of bucket partitions, and of node
  partitions in a components round, is the stage's plan, which needs Data-Juicer to compute, so
  it is read from the header of the first key file (bucket file) written instead: unknown (None)
  until one exists. A components round's counts are those of the current (or, once the stage is
  complete, the last) round; an exact deduplicator has no components units (0 once complete);
- the stage is `waiting` until every shard of the segment before it is done (its keys units may
  already hash the finished ones), `running` after, `done` once `stage.json` exists and every
  shard is kept, `failed` while `failed.json` exists (`retry --all-failed` archives it);
- its ETA: (keys and keep units not yet done) x the median seconds of the done ones / the
  participants (distinct host and pid holding a unit now, else those that did one): buckets and
  components are left out, a rough floor; 0 once done; None while waiting, failed or before any
  keys or keep unit is done.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import struct
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from elastic_sharding import confined
from elastic_sharding.claims.heartbeat import read_heartbeat_file
from elastic_sharding.layout import JobLayout, StageLayout, UnitFiles
from elastic_sharding.observe.snapshot import read_leniently
from elastic_sharding.records import DedupStageDone, DedupUnitDone, KeptShard, StageFailure, UnitClaim

log = logging.getLogger(__name__)


# The phases of `dedup/cooperate.py` and `global_ops/cooperate.py`, in order (not imported: those
# modules need numpy, status does not). A stage has the ones its operator needs.
KEYS, BUCKETS, COMPONENTS, PLACE, KEEP = "keys", "buckets", "components", "place", "keep"
PHASES = (KEYS, BUCKETS, COMPONENTS, PLACE, KEEP)
WAITING, RUNNING, DONE, FAILED = "waiting", "running", "done", "failed"
STAGE_STATES = (WAITING, RUNNING, DONE, FAILED)
UNIT_OUTCOMES = ("done", "held", "stale", "failed")
_UNIT_RE = re.compile(r"^(?P<phase>keys|buckets|components|place|keep)-(?:r(?P<round>[0-9]{4,})-)?(?P<index>[0-9]{5,})$")
# The header of `dedup/arrays.py`'s record files: magic, number of partitions, dtype length.
RECORD_MAGIC = b"ESDDREC1"
_RECORD_HEAD = struct.Struct("<8sQQ")


@dataclass
class UnitView:
    """One unit of a stage as its files record it (times by its owner's clock where known)."""

    stage: int
    unit: str
    phase: str
    round: int | None
    index: int
    outcome: str  # done | held | stale | failed
    host: str | None
    pid: int | None
    started_at: float | None
    ended_at: float | None  # None while held
    count: int | None = None  # records written (keys, buckets), messages sent (components), rows kept (keep)

    @property
    def secs(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)


@dataclass
class PhaseUnits:
    done: int = 0
    held: int = 0
    total: int | None = None


@dataclass
class StageView:
    stage: int
    operator: str | None
    state: str
    phase: str | None
    round: int | None
    units: dict[str, PhaseUnits]
    failure: StageFailure | None
    started_at: float | None
    finished_at: float | None
    eta_secs: float | None
    unit_views: list[UnitView] = field(default_factory=list)
    rounds: int | None = None  # components rounds, from stage.json

    @property
    def error(self) -> str | None:
        f = self.failure
        return None if f is None else f"unit {f.unit} on host={f.host} pid={f.pid}: {f.error}: {f.message}"


def recipe_operators(layout: JobLayout) -> list[str] | None:
    """The names of the job recipe's `process`, in order; None if it cannot be read (a link
    planted in its place is not followed)."""
    try:
        with confined.open_read(layout.recipe) as handle:
            config = yaml.safe_load(handle)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        log.warning("cannot read the operators of %s: %s", layout.recipe, exc)
        return None
    process = config.get("process") if isinstance(config, dict) else None
    if not isinstance(process, list):
        return None
    names = []
    for item in process:
        if isinstance(item, dict) and len(item) == 1:
            item = next(iter(item))
        names.append(str(item))
    return names


def _partitions(directory: Path) -> int | None:
    """The partition count in the header of any record file in `directory` (None if none yet)."""
    try:
        entries = confined.list_dir(directory)
    except (OSError, ValueError):
        return None
    for name in sorted(entries):
        if entries[name] != "file" or not name.endswith(".rec"):
            continue
        try:
            with confined.open_read(directory / name) as handle:
                head = handle.read(_RECORD_HEAD.size)
        except (OSError, ValueError):
            continue
        if len(head) == _RECORD_HEAD.size:
            magic, parts, _ = _RECORD_HEAD.unpack(head)
            if magic == RECORD_MAGIC:
                return int(parts)
    return None


def unit_names(files: UnitFiles, pattern: re.Pattern[str] = _UNIT_RE) -> tuple[set[str], set[str]]:
    """(units with a claim, units with a result) in a stage's units directory, of the names `pattern` matches."""
    try:
        entries = confined.list_dir(files.units)
    except confined.LinkRefused as exc:
        log.warning("ignoring %s", exc)
        return set(), set()
    except (FileNotFoundError, NotADirectoryError):
        return set(), set()
    claimed, published = set(), set()
    for name, kind in entries.items():
        if kind != "file":
            continue
        stem, dot, suffix = name.rpartition(".")
        if dot and pattern.match(stem):
            if suffix == "lock":
                claimed.add(stem)
            elif suffix == "json":
                published.add(stem)
    return claimed, published


def _unit_view(
    files: StageLayout, stage: int, name: str, published: bool, failure: StageFailure | None, lock_timeout: float, now: float
) -> UnitView | None:
    match = _UNIT_RE.match(name)
    if match is None:
        return None
    phase, index = match.group("phase"), int(match.group("index"))
    round_number = int(match.group("round")) if match.group("round") is not None else None

    def view(outcome: str, host: str | None, pid: int | None, start: float | None, end: float | None, count: int | None):
        return UnitView(stage, name, phase, round_number, index, outcome, host, pid, start, end, count)

    if published:
        if phase == KEEP:
            kept = read_leniently(files.result(name), KeptShard)
            if kept is not None:
                return view("done", kept.host, kept.pid, kept.started_at, kept.finished_at, kept.output_rows)
        else:
            done = read_leniently(files.result(name), DedupUnitDone)
            if done is not None:
                claim = read_leniently(files.lock(name), UnitClaim)
                if claim is not None and (claim.host, claim.pid) == (done.host, done.pid):
                    start = claim.at
                else:
                    try:
                        start = os.lstat(files.result(name)).st_mtime - done.secs
                    except OSError:
                        start = None
                end = None if start is None else start + done.secs
                return view("done", done.host, done.pid, start, end, done.count)
        return view("done", None, None, None, None, None)  # a result that cannot be read is still there
    claim = read_leniently(files.lock(name), UnitClaim)
    if claim is None:
        return None  # released between the listing and the read
    beat = read_heartbeat_file(files.beat(name))
    last_seen = beat.wall_time if beat is not None and beat.token == claim.token else claim.at
    if failure is not None and failure.unit == name:
        return view("failed", claim.host, claim.pid, claim.at, max(claim.at, last_seen), None)
    if now - last_seen > lock_timeout:
        return view("stale", claim.host, claim.pid, claim.at, max(claim.at, last_seen), None)
    return view("held", claim.host, claim.pid, claim.at, None, None)


def _phase_of(name: str) -> tuple[str | None, int | None]:
    match = _UNIT_RE.match(name)
    if match is None:
        return None, None
    return match.group("phase"), int(match.group("round")) if match.group("round") is not None else None


def read_stage(
    layout: JobLayout,
    stage: int,
    num_shards: int,
    operator: str | None,
    input_done: bool,
    lock_timeout: float,
    now: float,
) -> StageView:
    """Stage `stage` of the job: `input_done` says whether every shard of the segment before it is done."""
    files = StageLayout(layout.stage_dir(stage))
    failure = read_leniently(files.failed, StageFailure)
    complete = read_leniently(files.done, DedupStageDone)
    claimed, published = unit_names(files)
    views = []
    for name in sorted(claimed | published):
        view = _unit_view(files, stage, name, name in published, failure, lock_timeout, now)
        if view is not None:
            views.append(view)

    by_phase: dict[str, list[UnitView]] = {phase: [v for v in views if v.phase == phase] for phase in PHASES}
    rounds_seen = [v.round for v in by_phase[COMPONENTS] if v.round is not None]
    current_round = max(rounds_seen) if rounds_seen else None
    units = {phase: PhaseUnits() for phase in PHASES}
    for phase in PHASES:
        mine = by_phase[phase]
        if phase == COMPONENTS:
            mine = [v for v in mine if v.round == current_round]
        units[phase].done = sum(v.outcome == "done" for v in mine)
        units[phase].held = sum(v.outcome in ("held", "stale") for v in mine)
    units[KEYS].total = units[KEEP].total = num_shards
    units[BUCKETS].total = _partitions(files.root / "keys")
    if units[BUCKETS].total is None and complete is not None:
        units[BUCKETS].total = len(by_phase[BUCKETS])  # a whole-dataset operator's stage: its units are all there
    units[PLACE].total = num_shards if by_phase[PLACE] else 0 if complete is not None else None
    if complete is not None and complete.rounds == 0:
        units[COMPONENTS].total = 0
    elif by_phase[COMPONENTS] or (complete is not None and complete.rounds > 0):
        units[COMPONENTS].total = _partitions(files.root / "buckets")

    all_kept = units[KEEP].done >= num_shards
    if failure is not None:
        state = FAILED
        phase, round_number = _phase_of(failure.unit)
    elif complete is not None and all_kept:
        state, phase, round_number = DONE, None, None
    else:
        state = RUNNING if input_done or complete is not None else WAITING
        round_number = None
        if complete is not None:
            phase = KEEP
        elif by_phase[PLACE]:
            phase = PLACE
        elif by_phase[COMPONENTS]:
            phase, round_number = COMPONENTS, current_round
        elif by_phase[BUCKETS] or units[KEYS].done >= num_shards:
            phase = BUCKETS
        elif by_phase[KEYS] or state == RUNNING:
            phase = KEYS
        else:
            phase = None

    starts = [v.started_at for v in views if v.started_at is not None]
    ends = [v.ended_at for v in views if v.ended_at is not None]
    return StageView(
        stage=stage,
        operator=operator,
        state=state,
        phase=phase,
        round=round_number,
        units=units,
        failure=failure,
        started_at=min(starts) if starts else None,
        finished_at=max(ends) if state == DONE and ends else None,
        eta_secs=_eta(state, views, units, num_shards),
        unit_views=views,
        rounds=complete.rounds if complete is not None else None,
    )


def _eta(state: str, views: list[UnitView], units: dict[str, PhaseUnits], num_shards: int) -> float | None:
    """See the module's rules."""
    if state == DONE:
        return 0.0
    if state != RUNNING:
        return None
    samples = [v.secs for v in views if v.outcome == "done" and v.phase in (KEYS, KEEP) and v.secs is not None]
    if not samples:
        return None
    remaining = max(0, num_shards - units[KEYS].done) + max(0, num_shards - units[KEEP].done)
    holders = {(v.host, v.pid) for v in views if v.outcome == "held"}
    participants = len(holders) or len({(v.host, v.pid) for v in views if v.outcome == "done"}) or 1
    return remaining * statistics.median(samples) / participants


__all__ = ["PHASES", "STAGE_STATES", "PhaseUnits", "StageView", "UnitView", "read_stage", "recipe_operators", "unit_names"]
