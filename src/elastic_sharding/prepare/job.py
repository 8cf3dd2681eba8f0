"""prepare: validate the recipe and input, split the input into fixed shards, publish the job.

Two streaming passes over the input. Pass one validates every line, fingerprints every file,
learns the union schema and the total normalized size. Pass two re-reads (detecting any change
since pass one), writes each row in normalized form, and cuts exactly `num_shards` contiguous,
non-empty shards balanced by normalized bytes. Everything is written into a private staging
directory that is renamed onto the job directory only when complete: a failed prepare leaves
no job directory behind.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import platform
import secrets
import shlex
import socket
import stat
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from elastic_sharding import crashpoints, fsops
from elastic_sharding.engine import engine_identity
from elastic_sharding.errors import InputError, JobStateError, RecipeError, UsageError
from elastic_sharding.fsprobe import check_job_filesystem
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.cooperate import RECIPE, Gone, Participant, PrepareDir, spawn_helpers, stop_helpers
from elastic_sharding.prepare.fingerprints import fingerprint_files, sha256_concatenated
from elastic_sharding.prepare.jsonl import (
    HashingLineReader,
    Offload,
    check_keys,
    first_duplicate_key,
    line_too_long,
    parse_object,
)
from elastic_sharding.prepare.normalize import RowNormalizer, SchemaNode
from elastic_sharding.prepare.recipe import Recipe, dump_config, load_recipe, read_recipe, read_resolved
from elastic_sharding.prepare.sources import compression_of, file_kind, is_input_name
from elastic_sharding.records import (
    FORMAT_VERSION,
    ROW_KEY,
    InputFile,
    Manifest,
    PrepareCuts,
    PreparePlan,
    RecipeJudged,
    Request,
    ScanResult,
    ShardCut,
    ShardSpec,
    ShardWritten,
    encode,
    from_dict,
    load,
    shard_id_for,
)
from elastic_sharding.settings import Settings, validate_settings

log = logging.getLogger(__name__)


@dataclass
class PrepareRequest:
    config: Path
    dataset_path: Path | None
    job_dir: Path
    num_shards: int
    settings: Settings
    base_dir: Path | None = None  # relative paths in the recipe resolve from here (default: cwd)
    procs: int | None = None  # processes on this node that share the work (default: its usable cores)


@dataclass
class PrepareResult:
    manifest: Manifest
    created: bool


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
        if not is_input_name(dataset.name):
            hint = "; compressed inputs must end in .jsonl.gz or .jsonl.zst" if ".jsonl." in dataset.name else ""
            raise InputError(
                f"not a .jsonl file (inputs are .jsonl, .jsonl.gz or .jsonl.zst files or directories of them){hint}", dataset
            )
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
            if is_input_name(name):
                mode = _stat(path).st_mode  # follows a link to a file; a broken or looping one is refused
                if not stat.S_ISREG(mode):
                    raise InputError(f"not a regular file but {file_kind(mode)}; inputs must be regular .jsonl files", path)
                found.append((path.relative_to(dataset).as_posix(), path))
            else:
                skipped += 1
    if skipped:
        log.warning("ignoring %d file(s) under %s that do not end in .jsonl, .jsonl.gz or .jsonl.zst", skipped, dataset)
    if not found:
        raise InputError("directory contains no .jsonl files (nor .jsonl.gz or .jsonl.zst)", dataset)
    found.sort(key=lambda item: item[0])
    return "dir", dataset, [path for _, path in found]


MAX_MARKS = 1 << 16  # rows of cumulative weights held at once while placing a shard boundary
UNIT_BYTES = 64 << 20
UNIT_BYTES_ENV = "ELASTIC_SHARD_PREPARE_UNIT_BYTES"


class _Scan(NamedTuple):
    schema: SchemaNode
    rows: int
    weight: int
    lengths: array[int]
    weights: array[int]
    added: bytearray
    pieces: list[list[Any]]


def _scan_pieces(
    files: list[Path],
    pieces: list[list[int | None]],
    base: str,
    normalizer: RowNormalizer,
    offload: Offload,
    max_line: int,
    schema: SchemaNode | None = None,
    first_row: int | None = None,
    first_lines: list[int] | None = None,
) -> _Scan:
    """Pass one over byte ranges: validate and normalize every row, learn the schema and each
    row's weight (its normalized JSON size) and line length.

    Alone (`first_row` None) a range does not know the rows before it: origins are then
    "<piece>:<line in the piece>" and an added index is weighed as one digit (the cut unit
    corrects both). Given the schema of everything before and where the range starts, it is
    exactly the one-pass scan of the whole input, and raises the same error.

    Repeated keys are looked for once per block (`check_keys`), with the key count the schema
    keeps anyway; a row that fails another check is first checked for a repeated key in the rows
    up to it, so the error always names the first bad line."""
    schema = schema if schema is not None else SchemaNode()
    add_row = schema.add_row
    normalize = normalizer.normalize
    index_key = normalizer.index_key
    dumps = orjson.dumps
    lengths = array("I")
    weights = array("I")
    added = bytearray()
    out: list[list[Any]] = []
    weight = 0
    index = first_row or 0
    keys_before = schema.keys_seen() - normalizer.added_keys
    for number, (file, start, end) in enumerate(pieces):
        path = files[file]
        rows_before = len(lengths)
        name: Any = path if first_row is not None else str(number)
        line0 = first_lines[number] if first_lines is not None else 1
        reader = HashingLineReader(path, offload, max_line=max_line, count_colons=True, start=start, end=end, first_line=line0)
        for first, lines in reader.blocks():
            try:
                for lineno, line in enumerate(lines, first):
                    row = parse_object(line, path, lineno)
                    adds = index_key is not None and row.get(index_key) is None
                    row = normalize(row, base, index if first_row is not None else 0, path, lineno)
                    size = len(dumps(row)) + 1
                    weight += size
                    weights.append(size)
                    lengths.append(len(line))
                    added.append(adds)
                    add_row(row, (name, lineno))
                    index += 1
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
        offload.drain()
        source = reader.source
        offset = source.first_offset if source is not None else start
        out.append([offset, len(lengths) - rows_before, reader.sha256.hexdigest()])
    return _Scan(schema, index - (first_row or 0), weight, lengths, weights, added, out)


def _scan(
    files: list[Path], base_of: dict[Path, str], normalizer: RowNormalizer, offload: Offload, quiet: bool, max_line: int
) -> _Scan:
    """Pass one over whole files in one process (every file from its start, in order)."""
    bases = set(base_of.values())
    base = bases.pop() if len(bases) == 1 else ""
    return _scan_pieces(files, [[i, 0, None] for i in range(len(files))], base, normalizer, offload, max_line, first_row=0)


def _relpath(path: Path, kind: str, root: Path) -> str:
    return path.relative_to(root).as_posix() if kind == "dir" else path.name


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
    for old, path, digest in zip(before, paths, fingerprint_files(paths, [old.chunk_bytes for old in before], quiet)):
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

    The work is shared by `req.procs` processes on this node (default: its usable cores) and by
    any other process that joins through the job directory's parent (`prepare.cooperate`). `quiet`
    turns off progress bars on stderr; `verify_content=False` skips re-hashing the inputs of an
    existing job: for a `dlc` instance whose prepare coordinator has just done that."""
    started = time.monotonic()
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
        _remove_finished(PrepareDir.of(job.root))
        return PrepareResult(existing, created=False)

    kind, root, files = _discover(dataset)
    stats = [_stat(path) for path in files]
    units = _plan_units(files, [st.st_size for st in stats], _unit_bytes())
    total = sum(st.st_size for st in stats)
    procs = req.procs or usable_cores()
    helpers = 0 if total < _unit_bytes() // 2 else max(0, min(procs, max(len(units), req.num_shards)) - 1)
    # Helpers start now: their interpreters start while this process plans.
    procs_started = spawn_helpers(job.root, helpers) if helpers else []
    try:
        recipe = read_resolved(config_path, base)
        plan = _plan(request, recipe, kind, root, files, stats, units, base)
        pdir = PrepareDir.of(job.root)
        # A prepare of the same request that was under way may have published the job since the
        # check above: then there is nothing to join.
        existing = _check_existing(job, request, dataset, False, quiet)
        if existing is None:
            plan = _open_plan(pdir, plan)
    except BaseException:
        stop_helpers(procs_started, wait_secs=0)
        raise
    if existing is not None:
        stop_helpers(procs_started, wait_secs=0)
        log.info("job %s was prepared meanwhile with this exact request: nothing to do", job.root)
        _remove_finished(pdir)
        return PrepareResult(existing, created=False)
    log.info(
        "preparing %s: %d input file(s), %d byte(s) in %d scan unit(s), %d shard(s), %d process(es) here",
        job.root,
        len(files),
        total,
        len(plan.units),
        plan.num_shards,
        helpers + 1,
    )
    participant = Participant(pdir, plan, UnitWork(pdir, plan), quiet=quiet)
    try:
        try:
            # Data-Juicer's judgement of the recipe (seconds of imports) first, while the
            # helpers and any other participant already scan.
            participant.take_first(RECIPE)
            for warning in recipe.warnings:
                log.warning("%s", warning)
            participant.run(write_phase=lambda: _write_shards(participant))
        except Gone:
            if not pdir.published():
                raise JobStateError(f"the prepare of {job.root} was abandoned by another process; run prepare again") from None
    except BaseException as exc:
        stop_helpers(procs_started, wait_secs=0)
        if not isinstance(exc, Gone):
            pdir.remove()
        raise
    stop_helpers(procs_started)
    manifest = job.load_manifest()
    participants = len(manifest.prepared_by)
    log.info(
        "prepared %s: %d rows from %d file(s) in %d shard(s) in %.2fs by %d participant(s)",
        job.root,
        manifest.total_rows,
        len(files),
        len(manifest.shards),
        time.monotonic() - started,
        participants,
    )
    return PrepareResult(manifest, created=True)


def _remove_finished(pdir: PrepareDir) -> None:
    """What a prepare whose job is published left beside it (its final unit's owner died before
    removing it)."""
    if pdir.root.is_dir() and pdir.published():
        pdir.remove()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _unit_bytes() -> int:
    value = os.environ.get(UNIT_BYTES_ENV)
    return int(value) if value else UNIT_BYTES


def _plan_units(paths: list[Path], sizes: list[int], unit_bytes: int) -> list[list[list[int | None]]]:
    """Scan units: a large plain file in `unit_bytes` ranges of its own, smaller files (and every
    compressed one, which cannot be entered in the middle) whole, grouped up to `unit_bytes`."""
    units: list[list[list[int | None]]] = []
    group: list[list[int | None]] = []
    group_bytes = 0
    for i, (path, size) in enumerate(zip(paths, sizes)):
        compressed = compression_of(path) is not None
        if compressed or size <= unit_bytes:
            if group and group_bytes + size > unit_bytes:
                units.append(group)
                group, group_bytes = [], 0
            group.append([i, 0, None if compressed else size])
            group_bytes += size
            continue
        if group:
            units.append(group)
            group, group_bytes = [], 0
        for start in range(0, size, unit_bytes):
            units.append([[i, start, min(size, start + unit_bytes)]])
    if group:
        units.append(group)
    return units


def _plan(
    request: Request,
    recipe: Recipe,
    kind: str,
    root: Path,
    files: list[Path],
    stats: list[os.stat_result],
    units: list[list[list[int | None]]],
    recipe_base: Path,
) -> PreparePlan:
    sizes = [st.st_size for st in stats]
    mtimes = [st.st_mtime_ns for st in stats]
    unit_bytes = _unit_bytes()
    config = dict(recipe.config)
    config["dataset_path"] = str(Path(request.dataset_path))
    recipe_bytes = dump_config(config)
    identity = engine_identity()
    manifest = {
        "format_version": FORMAT_VERSION,
        "job_id": secrets.token_hex(8),
        "created_on": socket.gethostname(),
        "request": dataclasses.asdict(request),
        "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(),
        "recipe_file": "recipe.yaml",
        "data_juicer_version": identity.data_juicer_version,
        "data_juicer_commit": identity.data_juicer_commit,
        "ray_version": identity.ray_version,
        "python_version": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "dataset_kind": kind,
        "dataset_root": str(root if kind == "dir" else files[0]),
        "index_key": recipe.index_key,
        "media_keys": list(recipe.media_keys),
        "warnings": list(recipe.warnings),
    }
    settings = request.settings
    key_source = orjson.dumps(
        [FORMAT_VERSION, dataclasses.asdict(request), [str(f) for f in files], sizes, mtimes, unit_bytes, recipe_bytes.decode()]
    )
    return PreparePlan(
        key=hashlib.sha256(key_source).hexdigest(),
        files=[str(f) for f in files],
        sizes=sizes,
        mtimes=mtimes,
        units=units,
        unit_bytes=unit_bytes,
        base=str(root),
        media_keys=list(recipe.media_keys),
        index_key=recipe.index_key,
        max_line=recipe.max_line_bytes,
        num_shards=request.num_shards,
        lease_secs=settings.lock_timeout_secs,
        heartbeat_secs=settings.heartbeat_interval_secs,
        poll_secs=min(settings.poll_interval_secs, 0.2),
        manifest=manifest,
        recipe_text=recipe_bytes.decode(),
        recipe_base=str(recipe_base),
    )


def _open_plan(pdir: PrepareDir, plan: PreparePlan) -> PreparePlan:
    """Start the prepare of `plan`, or join the same one already under way (or left by a killed
    prepare: its finished units are kept). A plan of another request or of input files that
    changed since, or one that failed, is removed first."""
    for _ in range(5):
        if pdir.root.is_dir():
            try:
                existing = pdir.read_plan()
            except ValueError:
                existing = None
            if existing is not None:
                if existing.key == plan.key and not fsops.lexists(pdir.failed):
                    log.info("joining the prepare already under way in %s", pdir.root)
                    return existing
                log.warning("removing %s: it holds an earlier prepare of another request or input", pdir.root)
                pdir.remove()
                continue
        fsops.ensure_dir(pdir.root)
        for sub in (pdir.units, pdir.stage, JobLayout(pdir.stage).shards_dir):
            fsops.ensure_dir(sub)
        if fsops.publish_once(pdir.plan, encode(plan)):
            return plan
    raise JobStateError(f"could not start the prepare in {pdir.root}: other prepares keep replacing it")


def _unit_blob(scan: _Scan) -> bytes:
    return scan.lengths.tobytes() + scan.weights.tobytes() + bytes(scan.added)


def _read_blob(path: Path, rows: int) -> tuple[Any, Any, Any]:
    import numpy as np

    data = path.read_bytes()
    if len(data) != rows * 9:
        raise JobStateError(f"{path}: {len(data)} bytes, expected {rows * 9} for {rows} rows")
    lengths = np.frombuffer(data, dtype=np.uint32, count=rows)
    weights = np.frombuffer(data, dtype=np.uint32, count=rows, offset=rows * 4)
    added = np.frombuffer(data, dtype=np.uint8, count=rows, offset=rows * 8)
    return lengths, weights, added


_POWERS_OF_TEN = [10**k for k in range(1, 19)]


def _digits(first: int, rows: int) -> Any:
    """The number of decimal digits of each row index first .. first + rows - 1."""
    import numpy as np

    index = np.arange(first, first + rows, dtype=np.int64)
    return np.searchsorted(np.array(_POWERS_OF_TEN, dtype=np.int64), index, side="right") + 1


class UnitWork:
    """The five kinds of unit (`cooperate`) over one plan; any process can do any of them."""

    def __init__(self, pdir: PrepareDir, plan: PreparePlan):
        self.pdir = pdir
        self.plan = plan
        self.files = [Path(f) for f in plan.files]
        self.stage = JobLayout(pdir.stage)

    def _normalizer(self) -> RowNormalizer:
        return RowNormalizer(tuple(self.plan.media_keys), self.plan.index_key, ROW_KEY)

    def _scan_result(self, index: int) -> ScanResult:
        path = self.pdir.result(f"scan-{index:05d}")
        return load(ScanResult, path)

    def _cuts(self) -> PrepareCuts:
        return load(PrepareCuts, self.pdir.result("cut"))

    # ---- scan -------------------------------------------------------------------------------

    def scan(self, index: int) -> bytes:
        host, pid = socket.gethostname(), os.getpid()
        normalizer = self._normalizer()
        try:
            with Offload() as offload:
                scan = _scan_pieces(self.files, self.plan.units[index], self.plan.base, normalizer, offload, self.plan.max_line)
        except InputError as exc:
            return encode(ScanResult(index, host, pid, False, str(exc), 0, 0, 0, [], []))
        fsops.publish_once(self.pdir.blob(f"scan-{index:05d}"), _unit_blob(scan))
        record = ScanResult(
            index, host, pid, True, None, scan.rows, scan.weight, normalizer.added_keys, scan.pieces, scan.schema.flatten()
        )
        return encode(record)

    # ---- cut --------------------------------------------------------------------------------

    def cut(self) -> bytes:
        """Merge the scans in order into the one-pass schema (re-scanning the first unit that
        failed or contradicts the ones before it, to raise exactly the one-pass error), fix the
        weights of added indices, and place the shard boundaries by the one-pass rule."""
        import numpy as np

        plan = self.plan
        schema = SchemaNode()
        next_line = [1] * len(self.files)
        piece_lines: list[list[int]] = []
        piece_offsets: list[list[int]] = []
        unit_rows: list[int] = []
        unit_weights: list[int] = []
        results: list[ScanResult] = []
        rows = 0
        for index, pieces in enumerate(plan.units):
            result = self._scan_result(index)
            results.append(result)
            lines = [next_line[file] for file, _, _ in pieces]
            names = [str(self.files[file]) for file, _, _ in pieces]

            def origin(where: str, names: list[str] = names, lines: list[int] = lines) -> str:
                piece, _, line = where.partition(":")
                return f"{names[int(piece)]}:{lines[int(piece)] + int(line) - 1}"

            local = SchemaNode.unflatten(result.schema, origin) if result.ok else None
            if local is None or schema.conflicts_with(local):
                self._rescan(index, schema, rows, lines)
                raise InputError(result.error or "the input changed while prepare was reading it; rerun prepare")
            schema.absorb(local)
            for (file, _, _), (_, count, _) in zip(pieces, result.pieces):
                next_line[file] += count
            piece_lines.append(lines)
            piece_offsets.append([offset for offset, _, _ in result.pieces])
            weight = result.weight
            if plan.index_key is not None and result.rows:
                _, _, added = _read_blob(self.pdir.blob(f"scan-{index:05d}"), result.rows)
                weight += int((added * (_digits(rows, result.rows) - 1)).sum())
            unit_rows.append(result.rows)
            unit_weights.append(weight)
            rows += result.rows
        total_weight = sum(unit_weights)
        dataset_root = Path(plan.manifest["dataset_root"])
        if rows == 0:
            raise InputError("the input has no rows", dataset_root)
        if plan.num_shards > rows:
            raise UsageError(f"--num-shards {plan.num_shards} exceeds the number of input rows ({rows})")
        warnings = []
        int_nulls = schema.int_null_fields()
        if int_nulls:
            warnings.append(
                "integer field(s) null or missing in some rows: "
                + ", ".join(int_nulls[:5])
                + " - Ray's JSON export writes them as floats in blocks that hold a null"
            )
        firsts = self._cut_rows(rows, total_weight, unit_rows, unit_weights, np)
        shards = []
        unit_first = [0]
        for n in unit_rows:
            unit_first.append(unit_first[-1] + n)
        for k, first in enumerate(firsts):
            end = firsts[k + 1] if k + 1 < len(firsts) else rows
            shards.append(ShardCut(first, end - first, _segments(first, end, unit_first, results)))
        return encode(PrepareCuts(rows, total_weight, schema.flatten(), warnings, shards, piece_lines, piece_offsets))

    def _rescan(self, index: int, schema: SchemaNode, first_row: int, lines: list[int]) -> None:
        with Offload() as offload:
            _scan_pieces(
                self.files,
                self.plan.units[index],
                self.plan.base,
                self._normalizer(),
                offload,
                self.plan.max_line,
                schema=schema,
                first_row=first_row,
                first_lines=lines,
            )

    def _cut_rows(self, rows: int, total_weight: int, unit_rows: list[int], unit_weights: list[int], np: Any) -> list[int]:
        """The first row of every shard: shard i ends after the first row r at or after its start
        whose cumulative weight reaches (i+1)/count of the total, unless only as many rows as
        shards are left (exactly the one-pass rule)."""
        count = self.plan.num_shards
        ends = []
        acc = 0
        for w in unit_weights:
            acc += w
            ends.append(acc)
        firsts = [0]
        unit_first = [0]
        for n in unit_rows:
            unit_first.append(unit_first[-1] + n)
        for shard in range(count - 1):
            start = firsts[-1]
            threshold = math.ceil(total_weight * (shard + 1) / count)
            row = self._first_reaching(threshold, ends, unit_first, unit_weights, np)
            row = min(max(row, start), rows - count + shard)
            firsts.append(row + 1)
        return firsts

    def _first_reaching(self, threshold: int, ends: list[int], unit_first: list[int], unit_weights: list[int], np: Any) -> int:
        """The first row whose cumulative weight is at least `threshold`."""
        unit = bisect.bisect_left(ends, threshold)
        if unit >= len(ends):
            return unit_first[-1] - 1
        rows = unit_first[unit + 1] - unit_first[unit]
        _, weights, added = _read_blob(self.pdir.blob(f"scan-{unit:05d}"), rows)
        cumulative = ends[unit] - unit_weights[unit]
        for lo in range(0, rows, MAX_MARKS):
            hi = min(rows, lo + MAX_MARKS)
            part = weights[lo:hi].astype(np.int64)
            if self.plan.index_key is not None:
                part += added[lo:hi] * (_digits(unit_first[unit] + lo, hi - lo) - 1)
            sums = np.cumsum(part) + cumulative
            at = int(np.searchsorted(sums, threshold, side="left"))
            if at < hi - lo:
                return unit_first[unit] + lo + at
            cumulative = int(sums[-1])
        return unit_first[unit + 1] - 1

    # ---- write ------------------------------------------------------------------------------

    def write(self, index: int) -> bytes:
        """Pass two for one shard: re-read its rows, write them normalized in the schema's shape."""
        cuts = self._cuts()
        cut = cuts.shards[index]
        plan = self.plan
        schema = SchemaNode.unflatten(cuts.schema)
        shape = schema.shaper() or (lambda row: row)
        normalize = self._normalizer().normalize
        dumps = orjson.dumps
        max_shard_line = plan.max_line + 1  # with its newline
        shard_id = shard_id_for(index, plan.num_shards)
        blobs: dict[int, Any] = {}
        row_index = cut.first_row
        with Offload() as offload:
            writer = _ShardWriter(self.stage.shards_dir / f"{shard_id}.jsonl", offload)
            try:
                for file in sorted({plan.units[unit][piece][0] for unit, piece, *_ in cut.segments}):
                    _stat(self.files[file])
                for unit, piece, in_unit, in_piece, count in cut.segments:
                    file, start, _ = plan.units[unit][piece]
                    path = self.files[file]
                    if unit not in blobs:
                        blobs[unit] = _read_blob(self.pdir.blob(f"scan-{unit:05d}"), self._scan_result(unit).rows)[0]
                    lengths = blobs[unit]
                    piece_start = in_unit - in_piece
                    offset = cuts.piece_offsets[unit][piece] + int(lengths[piece_start:in_unit].sum()) + in_piece
                    line0 = cuts.piece_lines[unit][piece] + in_piece
                    reader = HashingLineReader(
                        path, offload, max_line=plan.max_line, start=offset, first_line=line0, hashing=False
                    )
                    left = count
                    at = in_unit
                    for first, lines in reader.blocks():
                        for lineno, line in enumerate(lines, first):
                            if len(line) != lengths[at]:
                                raise InputError(
                                    "changed while prepare was reading it; rerun prepare when the input is stable", path, lineno
                                )
                            row = normalize(parse_object(line, path, lineno), plan.base, row_index, path, lineno)
                            shaped = {ROW_KEY: row_index}
                            shaped.update(shape(row))
                            out = dumps(shaped) + b"\n"
                            if len(out) > max_shard_line:
                                raise _ShardLineTooLong(len(out) - 1, plan.max_line, path, lineno)
                            writer.add(out)
                            row_index += 1
                            at += 1
                            left -= 1
                            if not left:
                                break
                        if not left:
                            break
                    if left:
                        raise InputError("lost rows while prepare was reading it; rerun prepare when the input is stable", path)
                spec = writer.finish()
            except _ShardLineTooLong as exc:
                writer.abort()
                raise exc.error() from None
            except InputError as exc:
                writer.abort()
                if "while prepare was reading it" in str(exc):
                    raise
                raise InputError(f"{exc} (the input changed while prepare was reading it?)") from None
            except BaseException:
                writer.abort()
                raise
        rows, size, sha = spec
        return encode(ShardWritten(index, socket.gethostname(), os.getpid(), rows, size, sha))

    # ---- recipe -----------------------------------------------------------------------------

    def recipe(self) -> bytes:
        """Data-Juicer's judgement of the recipe the plan was made from (its registry and config
        parser); the final unit waits for it, so no job is published with a recipe it rejects."""
        request = self.plan.manifest["request"]
        recipe = load_recipe(Path(request["config_path"]), Path(self.plan.recipe_base))
        if recipe.sha256 != request["config_sha256"]:
            raise RecipeError(f"{recipe.source}: the recipe changed while prepare was running; run prepare again")
        identity = engine_identity()
        return encode(RecipeJudged(socket.gethostname(), os.getpid(), identity.data_juicer_version))

    # ---- final ------------------------------------------------------------------------------

    def final(self) -> bytes:
        """Fingerprints, the manifest, and the job published by renaming the stage onto it."""
        plan = self.plan
        cuts = self._cuts()
        scans = [self._scan_result(i) for i in range(len(plan.units))]
        per_file: list[list[str]] = [[] for _ in self.files]
        rows_of = [0] * len(self.files)
        for pieces, result in zip(plan.units, scans):
            for (file, _, _), (_, count, digest) in zip(pieces, result.pieces):
                per_file[file].append(digest)
                rows_of[file] += count
        kind, root = plan.manifest["dataset_kind"], Path(plan.manifest["dataset_root"])
        if kind == "file":
            root = root.parent
        inputs = []
        for i, path in enumerate(self.files):
            st = _stat(path, " (it disappeared while prepare was reading it)")
            if st.st_size != plan.sizes[i] or st.st_mtime_ns != plan.mtimes[i]:
                raise InputError("changed while prepare was reading it; rerun prepare when the input is stable", path)
            digests = per_file[i]
            chunked = len(digests) > 1
            sha = hashlib.sha256(b"".join(bytes.fromhex(d) for d in digests)).hexdigest() if chunked else digests[0]
            inputs.append(
                InputFile(
                    path=str(path),
                    relpath=_relpath(path, kind, root),
                    size=st.st_size,
                    mtime_ns=st.st_mtime_ns,
                    sha256=sha,
                    rows=rows_of[i],
                    chunk_bytes=plan.unit_bytes if chunked else 0,
                    chunks=digests if chunked else [],
                )
            )
        specs = []
        for k, cut in enumerate(cuts.shards):
            written = load(ShardWritten, self.pdir.result(f"write-{k:05d}"))
            shard_id = shard_id_for(k, plan.num_shards)
            specs.append(
                ShardSpec(shard_id, k, f"shards/{shard_id}.jsonl", cut.first_row, written.rows, written.bytes, written.sha256)
            )
        normalized = sha256_concatenated([self.stage.shards_dir / f"{s.shard_id}.jsonl" for s in specs])
        layout = self.stage
        for sub in (*layout.skeleton, layout.cache_dir):
            fsops.ensure_dir(sub)
        recipe_bytes = plan.recipe_text.encode()
        if not layout.recipe.exists():
            with fsops.atomic_output(layout.recipe, replace=True) as out:
                out.write(recipe_bytes)
                out.commit()
        fields = dict(plan.manifest)
        fields.update(
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            inputs=[dataclasses.asdict(f) for f in inputs],
            total_rows=cuts.total_rows,
            total_bytes=sum(s.bytes for s in specs),
            normalized_sha256=normalized,
            shards=[dataclasses.asdict(s) for s in specs],
            warnings=[*fields.get("warnings", []), *cuts.warnings],
            prepared_by=self._participants(scans, plan.num_shards),
        )
        manifest = from_dict(Manifest, fields, "manifest")
        # Every write unit is done: a temporary file left in shards/ is a partial shard of a writer
        # that lost its unit (killed, or fenced and still writing to an inode nobody will link).
        for entry in os.listdir(layout.shards_dir):
            if entry.startswith(".") and ".tmp-" in entry:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(layout.shards_dir / entry)
        fsops.publish_once(layout.manifest, encode(manifest))
        crashpoints.reached("prepare-staged")
        if not fsops.rename_dir(self.pdir.stage, self.pdir.job_root):
            raise JobStateError(f"could not publish {self.pdir.job_root}: it exists")
        return b"{}\n"

    def _participants(self, scans: list[ScanResult], shards: int) -> list[str]:
        who = {f"{r.host}:{r.pid}" for r in scans}
        for k in range(shards):
            written = load(ShardWritten, self.pdir.result(f"write-{k:05d}"))
            who.add(f"{written.host}:{written.pid}")
        who.add(f"{socket.gethostname()}:{os.getpid()}")
        return sorted(who)


def _segments(first: int, end: int, unit_first: list[int], results: list[ScanResult]) -> list[list[int]]:
    """Rows [first, end) as runs within one piece: [unit, piece, row in unit, row in piece, rows]."""
    out = []
    unit = bisect.bisect_right(unit_first, first) - 1
    row = first
    while row < end:
        while unit_first[unit + 1] <= row:
            unit += 1
        in_unit = row - unit_first[unit]
        piece_first = 0
        for piece, (_, count, _) in enumerate(results[unit].pieces):
            if in_unit < piece_first + count:
                take = min(end - row, piece_first + count - in_unit)
                out.append([unit, piece, in_unit, in_unit - piece_first, take])
                row += take
                break
            piece_first += count
    return out


class _ShardWriter:
    """Writes one shard; lines are batched into large blocks whose writing and hashing run on
    the offload thread. Published create-once: a second writer of the same shard (after a
    takeover) wrote the same bytes."""

    FLUSH_BYTES = 4 << 20

    def __init__(self, path: Path, offload: Offload):
        self.offload = offload
        self.out = fsops.AtomicOutput(path, replace=False)
        self.sha = hashlib.sha256()
        self.rows = 0
        self.bytes = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, line: bytes) -> None:
        self.pending.append(line)
        self.pending_bytes += len(line)
        if self.pending_bytes >= self.FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.offload.submit(_write_block, self.out, b"".join(self.pending), self.sha)
        self.rows += len(self.pending)
        self.bytes += self.pending_bytes
        self.pending = []
        self.pending_bytes = 0

    def finish(self) -> tuple[int, int, str]:
        self._flush()
        self.offload.drain()
        self.out.commit()
        return self.rows, self.bytes, self.sha.hexdigest()

    def abort(self) -> None:
        self.out.abort()


def _write_block(out: fsops.AtomicOutput, data: bytes, sha: Any) -> None:
    out.write(data)
    sha.update(data)


class _ShardLineTooLong(Exception):
    """A row's shard line is over the limit though its input line is not (pass two)."""

    def __init__(self, size: int, limit: int, path: Path, lineno: int):
        self.size, self.limit, self.path, self.lineno = size, limit, path, lineno

    def error(self) -> InputError:
        what = "the row's shard line (null-filled missing fields, absolute media paths, row number added)"
        return line_too_long(self.size, self.limit, self.path, self.lineno, what=what)


def _write_shards(participant: Participant) -> None:
    """Pass two, this process's share: write shards until none is left to claim."""
    participant.write_phase()
