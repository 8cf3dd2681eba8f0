"""prepare: validate the recipe and input, split the input into fixed shards, publish the job.

Two streaming passes over the input. Pass one validates every line, fingerprints every file,
learns the union schema and the total normalized size. Pass two re-reads (detecting any change
since pass one), writes each row in normalized form, and cuts exactly `num_shards` contiguous,
non-empty shards balanced by normalized bytes. Everything is written into a private staging
directory that is renamed onto the job directory only when complete: a failed prepare leaves
no job directory behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import secrets
import shlex
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from . import crashpoints, fsops
from .engine import engine_identity
from .errors import InputError, JobStateError, UsageError
from .fingerprints import sha256_files
from .fsprobe import check_job_filesystem
from .jsonl import HashingLineReader, Offload, check_keys, file_kind, first_duplicate_key, line_too_long, parse_object
from .layout import JobLayout
from .normalize import RowNormalizer, SchemaNode
from .progress import Progress
from .recipe import Recipe, dump_config, load_recipe, read_recipe
from .records import (
    FORMAT_VERSION,
    ROW_KEY,
    InputFile,
    Manifest,
    Request,
    Settings,
    ShardSpec,
    encode,
    shard_id_for,
)

log = logging.getLogger(__name__)


@dataclass
class PrepareRequest:
    config: Path
    dataset_path: Path | None
    job_dir: Path
    num_shards: int
    settings: Settings
    base_dir: Path | None = None  # relative paths in the recipe resolve from here (default: cwd)


@dataclass
class PrepareResult:
    manifest: Manifest
    created: bool


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
    if settings.ray_temp_dir is not None and not os.path.isabs(settings.ray_temp_dir):
        raise UsageError(f"--ray-temp-dir must be an absolute path, got {settings.ray_temp_dir!r}")


def _stat(path: Path, context: str = "") -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise InputError(f"cannot access: {exc.strerror or exc}{context}", path) from None


def _discover(dataset: Path) -> tuple[str, Path, list[Path]]:
    try:
        st = dataset.stat()
    except OSError as exc:
        raise InputError(f"cannot access dataset: {exc.strerror or exc}", dataset) from None
    if stat.S_ISREG(st.st_mode):
        if dataset.suffix != ".jsonl":
            hint = "; compressed inputs are not read, decompress it first" if ".jsonl." in dataset.name else ""
            raise InputError(f"not a .jsonl file (inputs are .jsonl files or directories of them){hint}", dataset)
        return "file", dataset.parent, [dataset]
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"not a regular file or directory but {file_kind(st.st_mode)}", dataset)
    found: list[tuple[str, Path]] = []
    skipped = 0

    def on_error(exc: OSError) -> None:
        raise InputError(f"cannot list directory: {exc.strerror or exc}", exc.filename or dataset)

    for dirpath, dirnames, filenames in os.walk(dataset, onerror=on_error, followlinks=False):
        dirnames.sort()
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                log.warning("not reading %s: a link to a directory (links to files are read)", Path(dirpath) / name)
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".jsonl"):
                mode = _stat(path).st_mode  # follows a link to a file; a broken or looping one is refused
                if not stat.S_ISREG(mode):
                    raise InputError(f"not a regular file but {file_kind(mode)}; inputs must be regular .jsonl files", path)
                found.append((path.relative_to(dataset).as_posix(), path))
            else:
                skipped += 1
    if skipped:
        log.warning("ignoring %d file(s) under %s that do not end in .jsonl", skipped, dataset)
    if not found:
        raise InputError("directory contains no .jsonl files", dataset)
    found.sort(key=lambda item: item[0])
    return "dir", dataset, [path for _, path in found]


MAX_MARKS = 1 << 16


class _Scan(NamedTuple):
    schema: SchemaNode
    rows: int
    weight: int
    marks: list[int]
    stride: int


def _blocks(
    label: str,
    files: list[Path],
    readers: list[HashingLineReader],
    offload: Offload,
    quiet: bool,
    max_line: int,
    count_colons: bool = False,
) -> Iterator[tuple[HashingLineReader, int, list[bytes]]]:
    """(reader, first line number, lines) per block over all files, with progress per block;
    appends each file's reader to `readers`."""
    total = sum(_stat(path).st_size for path in files)
    with Progress(label, total, quiet) as progress:
        for path in files:
            reader = HashingLineReader(path, offload, max_line=max_line, count_colons=count_colons)
            readers.append(reader)
            seen = 0
            for first, lines in reader.blocks():
                yield reader, first, lines
                progress.update(reader.size - seen, len(lines))
                seen = reader.size


def _scan(
    files: list[Path], base_of: dict[Path, str], normalizer: RowNormalizer, offload: Offload, quiet: bool, max_line: int
) -> tuple[_Scan, list[HashingLineReader]]:
    """Pass one: validate and normalize every row, learn the schema and the rows' weights.

    A row's weight is its normalized JSON size. Only every `stride`-th cumulative weight is kept
    (at most MAX_MARKS of them, the stride doubling as needed): that is all pass two needs to
    reproduce the exact weight-balanced cuts while computing weights only near the cuts.

    Repeated keys are looked for once per block (`check_keys`), with the key count the schema
    keeps anyway; a row that fails another check is first checked for a repeated key in the rows
    up to it, so the error always names the first bad line."""
    schema = SchemaNode()
    add_row = schema.add_row
    normalize = normalizer.normalize
    dumps = orjson.dumps
    readers: list[HashingLineReader] = []
    marks: list[int] = []
    stride = 1
    next_mark = 1
    weight = 0
    index = 0
    keys_before = 0
    for reader, first, lines in _blocks("pass 1/2", files, readers, offload, quiet, max_line, count_colons=True):
        path = reader.path
        base = base_of[path]
        try:
            for lineno, line in enumerate(lines, first):
                row = normalize(parse_object(line, path, lineno), base, index, path, lineno)
                weight += len(dumps(row)) + 1
                add_row(row, (path, lineno))
                index += 1
                if index == next_mark:
                    marks.append(weight)
                    if len(marks) >= MAX_MARKS:
                        marks = marks[1::2]
                        stride *= 2
                    next_mark = (len(marks) + 1) * stride
        except (InputError, orjson.JSONEncodeError) as exc:
            duplicate = first_duplicate_key(lines[: lineno - first + 1], first, path)
            if duplicate is not None:
                raise duplicate from None
            if isinstance(exc, orjson.JSONEncodeError):  # only nesting beyond orjson.dumps's depth gets here
                raise InputError(
                    f"objects and lists nested too deeply to write back as JSON ({exc}; orjson writes at most 254 levels)",
                    path,
                    lineno,
                ) from None
            raise
        keys_now = schema.keys_seen() - normalizer.added_keys  # keys of the input text so far
        check_keys(reader.block, lines, first, path, keys_now - keys_before, reader.colons())
        keys_before = keys_now
    return _Scan(schema, index, weight, marks, stride), readers


def _relpath(path: Path, kind: str, root: Path) -> str:
    return path.relative_to(root).as_posix() if kind == "dir" else path.name


def _fingerprint(path: Path, reader: HashingLineReader, kind: str, root: Path) -> InputFile:
    st = _stat(path, " (it disappeared while prepare was reading it)")
    return InputFile(
        path=str(path),
        relpath=_relpath(path, kind, root),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        sha256=reader.sha256.hexdigest(),
        rows=reader.lines,
    )


def _same_request(existing: Manifest, request: Request, inputs_now: list[InputFile]) -> str | None:
    """Return why `existing` differs from this request, or None if it is the same request (the
    input files' contents aside: see `_changed_content`)."""
    old = existing.request
    if old.config_sha256 != request.config_sha256:
        return "the recipe changed"
    if old.dataset_path != request.dataset_path:
        return f"the dataset path differs ({old.dataset_path} vs {request.dataset_path})"
    if old.num_shards != request.num_shards:
        return f"--num-shards differs ({old.num_shards} vs {request.num_shards})"
    if old.settings != request.settings:
        return "the claim/retry/poll/Ray settings differ"
    change = _changed_file(existing.inputs, inputs_now)
    return f"the input files changed: {change}" if change else None


def _changed_file(before: list[InputFile], now: list[InputFile]) -> str | None:
    """The first input file whose name, size or modification time differs from the manifest's."""
    current = {f.relpath: f for f in now}
    recorded = {f.relpath for f in before}
    for old in before:
        new = current.get(old.relpath)
        if new is None:
            return f"{old.path} is gone"
        if new.size != old.size:
            return f"{new.path}: its size changed ({old.size} bytes when prepared, {new.size} now)"
        if new.mtime_ns != old.mtime_ns:
            stamp = f"@{old.mtime_ns // 10**9}.{old.mtime_ns % 10**9:09d}"
            return (
                f"{new.path}: its modification time changed ({_utc(old.mtime_ns)} when prepared, {_utc(new.mtime_ns)} now; "
                f"if only its time changed, `touch -d {stamp} {shlex.quote(new.path)}` restores it and prepare then checks "
                "its bytes)"
            )
    added = [f.path for f in now if f.relpath not in recorded]
    return f"{added[0]} is new" if added else None


def _utc(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def _changed_content(before: list[InputFile], now: list[InputFile], quiet: bool) -> str | None:
    """The first input file whose bytes differ from the manifest's sha256 (all hashed at once);
    `now` holds the same names as `before`."""
    path_of = {f.relpath: Path(f.path) for f in now}
    paths = [path_of[old.relpath] for old in before]
    for old, path, digest in zip(before, paths, sha256_files(paths, quiet)):
        if digest != old.sha256:
            return (
                f"the input files changed: {path}: its content changed since the job was prepared (sha256 {digest[:12]}... "
                f"now, {old.sha256[:12]}... then) though its size and modification time did not"
            )
    return None


def _check_existing(job: JobLayout, request: Request, dataset: Path, verify_content: bool, quiet: bool) -> Manifest | None:
    """The job already in `job`, if it holds exactly this request (a different one is refused).

    Names, sizes and modification times of the input files are compared first; then, unless
    `verify_content` is off, every file is hashed again and compared with its recorded sha256."""
    if not job.root.exists() and not job.root.is_symlink():
        return None
    if not job.manifest.is_file():
        raise JobStateError(f"{job.root} exists and is not a prepared job directory; choose a new --job-dir")
    existing = job.load_manifest()
    kind, root, files = _discover(dataset)
    current = []
    for path in files:
        st = _stat(path)
        current.append(InputFile(str(path), _relpath(path, kind, root), st.st_size, st.st_mtime_ns, "", 0))
    why = _same_request(existing, request, current)
    if why is None and verify_content:
        log.info("checking that the %d input file(s) are unchanged (sha256)", len(files))
        crashpoints.reached("prepare-rehashing")
        why = _changed_content(existing.inputs, current, quiet)
    if why is None:
        return existing
    raise JobStateError(
        f"{job.root} already holds a different job: {why}. Use a new --job-dir for a new run "
        "(a job directory belongs to one recipe, input, shard count and Ray address)"
    )


def _check_locations(job_dir: Path, dataset: Path) -> None:
    job_abs = Path(os.path.abspath(job_dir))
    data_abs = Path(os.path.abspath(dataset))
    if data_abs.is_dir() and (job_abs == data_abs or data_abs in job_abs.parents):
        raise UsageError(f"--job-dir {job_dir} is inside the dataset directory {dataset}; put the job directory elsewhere")
    if job_abs in data_abs.parents:
        raise UsageError(f"the dataset {dataset} is inside --job-dir {job_dir}; put the job directory elsewhere")


class _Checked(NamedTuple):
    base: Path
    config_path: Path
    config_sha: str
    dataset: Path
    job: JobLayout


def preflight(req: PrepareRequest) -> _Checked:
    """The checks that need no input scan and no Data-Juicer: settings, the recipe file, where the
    dataset and the job directory are, and whether the job directory's filesystem can coordinate
    workers (its one write, which leaves nothing). Launchers run them before writing anything."""
    validate_settings(req.settings)
    if req.num_shards < 1:
        raise UsageError("--num-shards must be at least 1")
    base = req.base_dir or Path.cwd()
    config_path = Path(os.path.abspath(req.config))
    raw_config, config_sha = read_recipe(config_path)
    dataset_value = req.dataset_path if req.dataset_path is not None else raw_config.get("dataset_path")
    if not dataset_value:
        raise UsageError(f"{config_path}: the recipe has no dataset_path; pass --dataset-path")
    if not isinstance(dataset_value, (str, Path)):
        raise UsageError(f"{config_path}: dataset_path must be a path string")
    dataset = Path(os.path.abspath(base / dataset_value))
    job = JobLayout(Path(os.path.abspath(req.job_dir)))
    _check_locations(job.root, dataset)
    if not job.root.parent.is_dir():
        raise UsageError(f"the parent directory of --job-dir does not exist: {job.root.parent}")
    check_job_filesystem(job.root, creating=True)
    return _Checked(base, config_path, config_sha, dataset, job)


def prepare(req: PrepareRequest, *, quiet: bool = False, verify_content: bool = True) -> PrepareResult:
    """Prepare the job `req` describes (a no-op if the job directory already holds exactly it).

    `quiet` turns off progress bars on stderr (drawn only on a terminal); warnings and results
    are still logged. `verify_content=False` skips re-hashing the inputs of an existing job: for
    a `dlc` instance whose prepare coordinator has just done that for the whole submission."""
    base, config_path, config_sha, dataset, job = preflight(req)
    request = Request(
        config_path=str(config_path),
        config_sha256=config_sha,
        dataset_path=str(dataset),
        num_shards=req.num_shards,
        settings=req.settings,
    )
    existing = _check_existing(job, request, dataset, verify_content, quiet)
    if existing is not None:
        log.info("job %s is already prepared with this exact request: nothing to do", job.root)
        return PrepareResult(existing, created=False)

    recipe = load_recipe(config_path, base)
    for warning in recipe.warnings:
        log.warning("%s", warning)
    kind, root, files = _discover(dataset)
    stage = job.root.parent / f".{job.root.name}.staging-{secrets.token_hex(4)}"
    stage.mkdir(fsops.DIR_MODE)
    try:
        with Offload() as offload:
            manifest = _build(stage, job, request, recipe, kind, root, files, offload, quiet)
        crashpoints.reached("prepare-staged")
        if not fsops.rename_dir(stage, job.root):
            existing = _check_existing(job, request, dataset, verify_content, quiet)
            if existing is None:
                raise JobStateError(f"could not publish {job.root}")
            shutil.rmtree(stage, ignore_errors=True)
            return PrepareResult(existing, created=False)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    log.info(
        "prepared %s: %d rows from %d file(s) in %d shard(s)", job.root, manifest.total_rows, len(files), len(manifest.shards)
    )
    return PrepareResult(manifest, created=True)


def _build(
    stage: Path,
    job: JobLayout,
    request: Request,
    recipe: Recipe,
    kind: str,
    root: Path,
    files: list[Path],
    offload: Offload,
    quiet: bool,
) -> Manifest:
    base_of = {path: str(root) for path in files}
    normalizer = RowNormalizer(tuple(recipe.media_keys), recipe.index_key, ROW_KEY)

    log.info("pass 1/2: validating %d input file(s) under %s", len(files), root)
    scan, first_readers = _scan(files, base_of, normalizer, offload, quiet, recipe.max_line_bytes)
    offload.drain()
    schema, total_rows = scan.schema, scan.rows
    inputs = [_fingerprint(path, reader, kind, root) for path, reader in zip(files, first_readers)]
    if total_rows == 0:
        raise InputError("the input has no rows", root if kind == "dir" else files[0])
    if request.num_shards > total_rows:
        raise UsageError(f"--num-shards {request.num_shards} exceeds the number of input rows ({total_rows})")
    warnings = list(recipe.warnings)
    int_nulls = schema.int_null_fields()
    if int_nulls:
        warnings.append(
            "integer field(s) null or missing in some rows: "
            + ", ".join(int_nulls[:5])
            + " - Ray's JSON export writes them as floats in blocks that hold a null"
        )
        log.warning("%s", warnings[-1])

    layout = JobLayout(stage)
    for sub in (*layout.skeleton, layout.cache_dir):
        sub.mkdir(fsops.DIR_MODE)

    log.info("pass 2/2: writing %d shard(s)", request.num_shards)
    shards = _write_shards(layout, request.num_shards, files, base_of, normalizer, scan, offload, quiet, recipe.max_line_bytes)
    second_readers = shards.readers
    for before, path, reader in zip(inputs, files, second_readers):
        st = _stat(path, " (it disappeared while prepare was reading it)")
        if reader.sha256.hexdigest() != before.sha256 or st.st_size != before.size or st.st_mtime_ns != before.mtime_ns:
            raise InputError("changed while prepare was reading it; rerun prepare when the input is stable", path)

    config = dict(recipe.config)
    config["dataset_path"] = str(Path(request.dataset_path))
    recipe_bytes = dump_config(config)
    with fsops.create_file(layout.recipe) as handle:
        handle.write(recipe_bytes)
    identity = engine_identity()
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        job_id=secrets.token_hex(8),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        created_on=socket.gethostname(),
        request=request,
        recipe_sha256=hashlib.sha256(recipe_bytes).hexdigest(),
        recipe_file="recipe.yaml",
        data_juicer_version=identity.data_juicer_version,
        data_juicer_commit=identity.data_juicer_commit,
        ray_version=identity.ray_version,
        python_version=f"{platform.python_implementation()} {sys.version.split()[0]}",
        dataset_kind=kind,
        dataset_root=str(root if kind == "dir" else files[0]),
        inputs=inputs,
        total_rows=total_rows,
        total_bytes=shards.total_bytes,
        normalized_sha256=shards.normalized.hexdigest(),
        index_key=recipe.index_key,
        media_keys=list(recipe.media_keys),
        shards=shards.specs,
        warnings=warnings,
    )
    with fsops.create_file(layout.manifest) as handle:
        handle.write(encode(manifest))
    for path in (layout.manifest, layout.recipe):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    return manifest


class _ShardWriter:
    """Writes exactly `count` contiguous non-empty shards; lines are batched into large blocks
    whose writing and hashing run on the offload thread."""

    FLUSH_BYTES = 4 << 20

    def __init__(self, layout: JobLayout, count: int, offload: Offload):
        self.layout = layout
        self.count = count
        self.offload = offload
        self.specs: list[ShardSpec] = []
        self.normalized = hashlib.sha256()
        self.total_bytes = 0
        self.readers: list[HashingLineReader] = []
        self._open(0, 0)

    def _open(self, index: int, first_row: int) -> None:
        self.index = index
        self.first_row = first_row
        self.rows = 0
        self.bytes = 0
        self.sha = hashlib.sha256()
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.path = self.layout.shards_dir / f"{shard_id_for(index, self.count)}.jsonl"
        self.handle = fsops.create_file(self.path)

    def add(self, line: bytes) -> None:
        self.pending.append(line)
        self.pending_bytes += len(line)
        if self.pending_bytes >= self.FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.offload.submit(_write_block, self.handle, b"".join(self.pending), self.sha, self.normalized)
        self.rows += len(self.pending)
        self.bytes += self.pending_bytes
        self.pending = []
        self.pending_bytes = 0

    def cut(self, next_first_row: int) -> None:
        """Close the current shard; the next one starts at row `next_first_row`."""
        self._flush()
        self.total_bytes += self.bytes
        shard_id = shard_id_for(self.index, self.count)
        spec = ShardSpec(
            shard_id=shard_id,
            index=self.index,
            path=f"shards/{shard_id}.jsonl",
            first_row=self.first_row,
            rows=self.rows,
            bytes=self.bytes,
            sha256="",
        )
        self.offload.submit(_finish_shard, self.handle, self.sha, spec, self.specs)
        if self.index + 1 < self.count:
            self._open(self.index + 1, next_first_row)

    def close(self) -> None:
        """Close a shard left open by an error (the staging directory is removed anyway)."""
        if not self.handle.closed:
            self.handle.close()


def _write_block(handle: BinaryIO, data: bytes, shard_sha: Any, normalized: Any) -> None:
    handle.write(data)
    shard_sha.update(data)
    normalized.update(data)


def _finish_shard(handle: BinaryIO, sha: Any, spec: ShardSpec, specs: list[ShardSpec]) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    spec.sha256 = sha.hexdigest()
    specs.append(spec)


def _cut_windows(scan: _Scan, count: int) -> list[tuple[int, int, int, bool]]:
    """Per `stride` rows: (last row count, cumulative weight before, after, whether a shard
    boundary falls inside). Outside such windows every row's cumulative weight compares with
    every boundary exactly as the window's end does, so pass two needs no weight there."""
    boundaries = [scan.weight * (k + 1) / count for k in range(count - 1)]
    ends = [((j + 1) * scan.stride, mark) for j, mark in enumerate(scan.marks)]
    if not ends or ends[-1][0] != scan.rows:
        ends.append((scan.rows, scan.weight))
    windows = []
    before = 0
    for end, after in ends:
        windows.append((end, before, after, any(before < b <= after for b in boundaries)))
        before = after
    return windows


class _ShardLineTooLong(Exception):
    """A row's shard line is over the limit though its input line is not (pass two)."""

    def __init__(self, size: int, limit: int, path: Path, lineno: int):
        self.size, self.limit, self.path, self.lineno = size, limit, path, lineno

    def error(self) -> InputError:
        what = "the row's shard line (null-filled missing fields, absolute media paths, row number added)"
        return line_too_long(self.size, self.limit, self.path, self.lineno, what=what)


def _write_shards(
    layout: JobLayout,
    count: int,
    files: list[Path],
    base_of: dict[Path, str],
    normalizer: RowNormalizer,
    scan: _Scan,
    offload: Offload,
    quiet: bool,
    max_line: int,
) -> _ShardWriter:
    """Pass two: write every row in normalized, schema-shaped form and cut it into shards.

    After row r (0-based) of shard i < count-1 a shard is cut when only as many rows are left as
    shards, or when the cumulative weight reached i+1 count-ths of the total while more rows than
    shards are left. A shard line, not only its input line, must fit the engine's line limit:
    null-filled fields, absolute media paths and the row number make it longer."""
    total_rows, total_weight = scan.rows, scan.weight
    writer = _ShardWriter(layout, count, offload)
    shape = scan.schema.shaper() or (lambda row: row)
    normalize = normalizer.normalize
    dumps = orjson.dumps
    windows = iter(_cut_windows(scan, count))
    window_end, cumulative, window_weight, exact = -1, 0, 0, False
    shard = 0
    boundary = total_weight / count
    row_index = -1
    max_shard_line = max_line + 1  # with its newline
    try:
        for reader, first, lines in _blocks("pass 2/2", files, writer.readers, offload, quiet, max_line):
            path = reader.path
            base = base_of[path]
            for lineno, line in enumerate(lines, first):
                row_index += 1
                if row_index >= total_rows:
                    raise InputError("gained rows while prepare was reading it", path, lineno)
                if row_index >= window_end:
                    window_end, cumulative, window_weight, exact = next(windows)
                row = normalize(parse_object(line, path, lineno), base, row_index, path, lineno)
                if exact:
                    cumulative += len(dumps(row)) + 1
                else:
                    cumulative = window_weight
                shaped = {ROW_KEY: row_index}
                shaped.update(shape(row))
                out = dumps(shaped) + b"\n"
                if len(out) > max_shard_line:
                    raise _ShardLineTooLong(len(out) - 1, max_line, path, lineno)
                writer.add(out)
                if shard < count - 1:
                    rows_left = total_rows - row_index - 1
                    shards_left = count - shard - 1
                    if rows_left == shards_left or (cumulative >= boundary and rows_left > shards_left):
                        writer.cut(row_index + 1)
                        shard += 1
                        boundary = total_weight * (shard + 1) / count
    except _ShardLineTooLong as exc:
        writer.close()
        raise exc.error() from None
    except InputError as exc:
        writer.close()
        raise InputError(f"{exc} (the input changed while prepare was reading it?)") from None
    except BaseException:
        writer.close()
        raise
    if row_index + 1 != total_rows:
        writer.close()
        raise InputError("lost rows while prepare was reading it; rerun prepare when the input is stable", files[-1])
    writer.cut(total_rows)
    offload.drain()
    if len(writer.specs) != count:
        raise AssertionError(f"wrote {len(writer.specs)} shards, expected {count}")
    return writer
