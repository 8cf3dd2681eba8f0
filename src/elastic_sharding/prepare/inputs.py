"""The input files of a prepare: finding them under the dataset path, and checking a job that
already exists against a request.

A job directory belongs to one recipe, input, shard count and set of settings: an existing job is
reused only if it holds exactly this request. Names, sizes and modification times of the input
files are compared first (cheap); then every file is hashed again and compared with its recorded
sha256, unless the caller has just done that.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import time
from pathlib import Path

from elastic_sharding import crashpoints
from elastic_sharding.errors import InputError, JobStateError, UsageError
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.fingerprints import fingerprint_files
from elastic_sharding.prepare.parquet import is_parquet_name
from elastic_sharding.prepare.sources import INPUT_KINDS, file_kind, is_input_name
from elastic_sharding.records import InputFile, Manifest, Request

log = logging.getLogger(__name__)


def stat_input(path: Path, context: str = "") -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise InputError(f"cannot access: {exc.strerror or exc}{context}", path) from None


def discover(dataset: Path) -> tuple[str, Path, list[Path]]:
    try:
        st = dataset.stat()
    except OSError as exc:
        raise InputError(f"cannot access dataset: {exc.strerror or exc}", dataset) from None
    if stat.S_ISREG(st.st_mode):
        if not is_input_name(dataset.name):
            hint = "; compressed inputs must end in .jsonl.gz or .jsonl.zst" if ".jsonl." in dataset.name else ""
            raise InputError(f"not an input file (inputs are {INPUT_KINDS} files or directories of them){hint}", dataset)
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
                mode = stat_input(path).st_mode  # follows a link to a file; a broken or looping one is refused
                if not stat.S_ISREG(mode):
                    raise InputError(f"not a regular file but {file_kind(mode)}; inputs must be regular files", path)
                found.append((path.relative_to(dataset).as_posix(), path))
            else:
                skipped += 1
    if skipped:
        log.warning("ignoring %d file(s) under %s that are not %s files", skipped, dataset, INPUT_KINDS)
    if not found:
        raise InputError(f"directory contains no input files ({INPUT_KINDS})", dataset)
    found.sort(key=lambda item: item[0])
    parquet = [rel for rel, _ in found if is_parquet_name(rel)]
    if parquet and len(parquet) < len(found):
        jsonl = next(rel for rel, _ in found if not is_parquet_name(rel))
        raise InputError(
            f"the directory mixes Parquet files ({parquet[0]}, ...) and JSONL files ({jsonl}, ...): one job reads one "
            "format; convert one kind, or prepare each kind as its own job",
            dataset,
        )
    return "dir", dataset, [path for _, path in found]


def input_format(files: list[Path]) -> str:
    """'parquet' or 'jsonl': `discover` lets through only one of them."""
    return "parquet" if files and is_parquet_name(files[0].name) else "jsonl"


def relpath(path: Path, kind: str, root: Path) -> str:
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
    if old.analyze != request.analyze:
        return "this job was prepared with --analyze" if old.analyze else "this job was prepared without --analyze"
    if old.percentiles != request.percentiles:
        return f"--percentiles differs ({old.percentiles} vs {request.percentiles})"
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


def check_existing(job: JobLayout, request: Request, dataset: Path, verify_content: bool, quiet: bool) -> Manifest | None:
    """The job already in `job`, if it holds exactly this request (a different one is refused).

    Names, sizes and modification times of the input files are compared first; then, unless
    `verify_content` is off, every file is hashed again and compared with its recorded sha256."""
    if not job.root.exists() and not job.root.is_symlink():
        return None
    if not job.manifest.is_file():
        raise JobStateError(f"{job.root} exists and is not a prepared job directory; choose a new --job-dir")
    existing = job.load_manifest()
    kind, root, files = discover(dataset)
    current = []
    for path in files:
        st = stat_input(path)
        current.append(InputFile(str(path), relpath(path, kind, root), st.st_size, st.st_mtime_ns, "", 0))
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


def check_locations(job_dir: Path, dataset: Path) -> None:
    job_abs = Path(os.path.abspath(job_dir))
    data_abs = Path(os.path.abspath(dataset))
    if data_abs.is_dir() and (job_abs == data_abs or data_abs in job_abs.parents):
        raise UsageError(f"--job-dir {job_dir} is inside the dataset directory {dataset}; put the job directory elsewhere")
    if job_abs in data_abs.parents:
        raise UsageError(f"the dataset {dataset} is inside --job-dir {job_dir}; put the job directory elsewhere")
