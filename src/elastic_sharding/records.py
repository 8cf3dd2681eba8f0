"""On-disk records of a job directory, as dataclasses, and their JSON encoding.

Every record is written whole (create-once or atomic replace, see `fsops`), so a reader sees
either nothing or a complete record. Decoding validates types and names the file on error, and
every field that becomes part of a path (shard and attempt ids, tokens) against its pattern, so a
record can never lead the tool outside the job directory.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from elastic_sharding import fsops
from elastic_sharding.errors import JobStateError
from elastic_sharding.settings import Settings
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus

FORMAT_VERSION = 1
ROW_KEY = "__elastic_row__"
SHARD_ID_RE = re.compile(r"^part-(\d{5})-of-(\d{5})$")
ATTEMPT_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_.-]{1,80}-[0-9a-f]{8}$")
TOKEN_RE = re.compile(r"^[0-9a-f]{32}$")
# Fields that name files or directories (attempt dirs, stale-lock names); checked on every decode.
PATH_FIELDS = {
    "shard_id": ("shard id", SHARD_ID_RE),
    "attempt_id": ("attempt id", ATTEMPT_ID_RE),
    "last_attempt_id": ("attempt id", ATTEMPT_ID_RE),
    "token": ("token", TOKEN_RE),
    "by_token": ("token", TOKEN_RE),
}

R = TypeVar("R")


def shard_id_for(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def encode(record: Any) -> bytes:
    return orjson.dumps(dataclasses.asdict(record), option=orjson.OPT_INDENT_2) + b"\n"


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        (item_tp,) = typing.get_args(tp)
        return [_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """Resolving annotations costs more than decoding a small record, and workers decode many."""
    return typing.get_type_hints(cls)


def from_dict(cls: type[R], data: Any, where: str = "record") -> R:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object")
    hints = _type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            value = kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
            checked = PATH_FIELDS.get(f.name)
            if checked is not None and isinstance(value, str) and not checked[1].match(value):
                raise ValueError(f"{where}.{f.name}: {value!r} is not a valid {checked[0]}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: missing field {f.name!r}")
    return cls(**kwargs)


def decode(cls: type[R], data: bytes, path: Path | str) -> R:
    """Decode a record; a malformed one raises ValueError naming `path` (retried by readers)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return from_dict(cls, obj, str(path))


def load(cls: type[R], path: Path) -> R:
    """Read a required record; a missing, corrupt or symlinked one is a job-state error."""
    try:
        return decode(cls, fsops.read_bytes_nofollow(path), path)
    except FileNotFoundError:
        raise JobStateError(f"{path}: missing") from None
    except fsops.LinkRefused as exc:
        raise JobStateError(str(exc)) from None
    except ValueError as exc:
        raise JobStateError(f"corrupt record {exc}") from None


@dataclass
class InputFile:
    path: str
    relpath: str
    size: int
    mtime_ns: int
    sha256: str
    rows: int
    # A plain file larger than `chunk_bytes` is read in parallel chunks: `sha256` is then the
    # sha256 of its chunks' binary sha256 digests in order (`chunks`, the hex digests).
    chunk_bytes: int = 0
    chunks: list[str] = field(default_factory=list)


@dataclass
class ShardSpec:
    shard_id: str
    index: int
    path: str
    first_row: int
    rows: int
    bytes: int
    sha256: str


@dataclass
class Request:
    """What was asked of `prepare`; an identical request on an existing job is a no-op."""

    config_path: str
    config_sha256: str
    dataset_path: str
    num_shards: int
    settings: Settings


@dataclass
class Manifest:
    format_version: int
    job_id: str
    created_at: str
    created_on: str
    request: Request
    recipe_sha256: str
    recipe_file: str
    data_juicer_version: str
    data_juicer_commit: str | None
    ray_version: str
    python_version: str
    dataset_kind: str
    dataset_root: str
    inputs: list[InputFile]
    total_rows: int
    total_bytes: int
    normalized_sha256: str
    index_key: str | None
    media_keys: list[str]
    shards: list[ShardSpec]
    warnings: list[str] = field(default_factory=list)
    prepared_by: list[str] = field(default_factory=list)  # host:pid of every process that did a prepare unit

    def shard(self, shard_id: str) -> ShardSpec:
        for spec in self.shards:
            if spec.shard_id == shard_id:
                return spec
        raise KeyError(shard_id)


@dataclass
class ClaimRecord:
    """The claim (lock) of one shard. `status` becomes terminal in place (P6)."""

    shard_id: str
    token: str
    attempt_id: str
    host: str
    pid: int
    claimed_at: float
    status: str = ClaimStatus.RUNNING
    updated_at: float = 0.0


@dataclass
class OperatorStats:
    """One warm operator's instances in one warm runtime, counted since the runtime started.

    `window_secs` runs from the first call's start to the last call's end on any instance;
    `all_busy_secs` is the part of it in which every instance was inside a call at once (the
    CPU analogue of "all GPUs busy"). `started` counts instances built (the first ones plus
    replacements of `deaths`), so it is also the number of model loads."""

    op: str
    runtime_pid: int
    instances: int
    started: int
    deaths: int = 0
    calls: int = 0
    rows: int = 0
    busy_secs: float = 0.0
    all_busy_secs: float = 0.0
    window_secs: float = 0.0
    busy_now: int = 0


def operator_stats(raw: list[dict[str, Any]] | None) -> list[OperatorStats] | None:
    """The warm runtime's figures (JSON from its events) as records; None when there are none."""
    if not raw:
        return None
    return [from_dict(OperatorStats, item, "warm operator figures") for item in raw]


@dataclass
class Heartbeat:
    """Rewritten by the claim owner every heartbeat; observers watch `seq` change.

    It also carries the attempt's progress, so `status` learns it without another file per
    worker: the phase and since when (owner's clock), the owner's own estimate of the attempt's
    processing time (from its previous shards' throughput; None before its first), and rows or
    bytes done once they are known (Ray does not report rows mid-run, so they stay None while
    processing).
    """

    token: str
    seq: int
    wall_time: float
    phase: str
    pid: int
    phase_since: float | None = None
    attempt_started_at: float | None = None
    expected_secs: float | None = None
    rows_done: int | None = None
    bytes_done: int | None = None
    operators: list[OperatorStats] | None = None  # the warm runtime's operators, live


@dataclass
class AttemptRecord:
    shard_id: str
    attempt_id: str
    token: str
    host: str
    pid: int
    runner: str
    started_at: float
    status: str = AttemptStatus.RUNNING
    finished_at: float | None = None
    error: str | None = None
    input_rows: int = 0
    output_rows: int | None = None
    output_bytes: int | None = None
    output_sha256: str | None = None
    exit_code: int | None = None
    setup_secs: float | None = None  # spent starting the node's runtime (a warm runner's first shard)
    operators: list[OperatorStats] | None = None  # the warm runtime's operators when it ended


@dataclass
class SupersededRecord:
    """Written (create-once) into an attempt dir by the worker that took its claim over."""

    shard_id: str
    attempt_id: str
    by_token: str
    by_host: str
    by_pid: int
    at: float
    reason: str


@dataclass
class CompletionRecord:
    shard_id: str
    attempt_id: str
    token: str
    host: str
    pid: int
    input_rows: int
    input_sha256: str
    output_rows: int
    output_bytes: int
    output_sha256: str
    started_at: float
    finished_at: float


@dataclass
class FailureRecord:
    shard_id: str
    failures: int
    last_attempt_id: str
    last_error: str
    host: str
    at: float


@dataclass
class MergeShard:
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class MergeRecord:
    output: str
    rows: int
    bytes: int
    sha256: str
    merged_at: float
    host: str
    shards: list[MergeShard]


# -- launcher coordination (`.<job-dir>.dlc-coordination/<run-hash>/`) --------------------------


@dataclass
class RunRecord:
    """Which submission a coordination generation belongs to (written once, for humans)."""

    run_id: str
    job_dir: str
    created_by: str
    created_at: float


@dataclass
class PhaseLock:
    """The coordinator lease of one phase (prepare or finalize) of one submission."""

    run_id: str
    phase: str
    token: str
    host: str
    pid: int
    acquired_at: float
    took_over_from: str | None = None


@dataclass
class PhaseResult:
    """The outcome of a phase, published once; every instance acts on the same one."""

    run_id: str
    phase: str
    ok: bool
    exit_code: int
    message: str
    host: str
    at: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How a submission ended. The finalize coordinator's success and the first failure race
    for one create-once `outcome.json`, so no instance exits 0 while another exits 2; a failure
    is also kept as `abort.lock`/`abort.json`, and every instance exits with its `exit_code`."""

    run_id: str
    ok: bool
    phase: str
    exit_code: int
    reason: str
    host: str
    pid: int
    at: float


# ---- cooperative prepare (`.<job>.preparing/`; removed when the job is published) ------------


@dataclass
class PreparePlan:
    """What every participant of one prepare needs, without the recipe or Data-Juicer: the input
    files as listed (with size and time, to detect a change) and the scan units over them."""

    key: str
    files: list[str]
    sizes: list[int]
    mtimes: list[int]
    units: list[list[list[int | None]]]  # per unit: [file, start, end (None: to the end)] pieces
    unit_bytes: int
    base: str
    media_keys: list[str]
    index_key: str | None
    max_line: int
    num_shards: int
    lease_secs: float
    heartbeat_secs: float
    poll_secs: float
    manifest: dict[str, Any]  # the manifest's fields known before the scan (request, recipe, engine...)
    recipe_text: str
    recipe_base: str  # where the recipe's relative paths resolve from, for its `recipe` unit


@dataclass
class RecipeJudged:
    """The `recipe` unit's result: Data-Juicer accepted the plan's recipe."""

    host: str
    pid: int
    data_juicer_version: str | None


@dataclass
class UnitClaim:
    token: str
    host: str
    pid: int
    at: float


@dataclass
class ScanResult:
    unit: int
    host: str
    pid: int
    ok: bool
    error: str | None
    rows: int
    weight: int  # normalized bytes, with every added index counted as one digit (fixed at the cut)
    added_keys: int
    pieces: list[list[Any]]  # per piece: [first line offset, lines, sha256 of its bytes]
    schema: list[list[Any]]  # flattened SchemaNode tree, origins as "<piece>:<line>"


@dataclass
class ShardCut:
    first_row: int
    rows: int
    segments: list[list[int]]  # [unit, piece, first row in the unit, first row in the piece, rows]


@dataclass
class PrepareCuts:
    total_rows: int
    total_weight: int
    schema: list[list[Any]]
    warnings: list[str]
    shards: list[ShardCut]
    piece_lines: list[list[int]]  # per unit, per piece: the number of its first line in its file
    piece_offsets: list[list[int]]


@dataclass
class ShardWritten:
    index: int
    host: str
    pid: int
    rows: int
    bytes: int
    sha256: str


@dataclass
class PrepareFailure:
    error: str  # the exception's class name in errors.py
    message: str
    host: str
    pid: int


# -- published outputs (`merge`) -----------------------------------------------------------------


@dataclass
class PublishRecord(MergeRecord):
    """`merge.json`: a MergeRecord that also says which form was published. `form` "file": one
    merged JSONL at `output`, `sha256` is that file's. `form` "directory": one JSONL per shard in
    the directory `output`, listed by its index file `index`, and `sha256` is the index file's."""

    form: str = "file"  # file | directory
    index: str | None = None


@dataclass
class IndexEntry:
    """One shard of a directory output; `name` is None for a shard without rows (no file)."""

    name: str | None
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class OutputIndex:
    """The index of a directory output, written last: its presence commits the directory."""

    format: str
    format_version: int
    job_id: str
    rows: int
    bytes: int
    files: int
    entries: list[IndexEntry]
    published_at: float
    host: str
