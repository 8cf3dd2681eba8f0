"""verify: a job is complete, its outputs match their records, enough nodes took part, and the
published output (a merged file or a directory of one file per shard, in any format) is the one
merge.json describes: every byte re-hashed (a match proves what merge wrote; no parsing), and a
Parquet file's row count read from its footer."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding import confined
from elastic_sharding.destination import INDEX_FORMAT, INDEX_NAME, JSON_SUFFIXES, output_form
from elastic_sharding.errors import IntegrityError, JobStateError, next_step
from elastic_sharding.finish.parallel_copy import SourceError, hash_file, identify, run_all, thread_count
from elastic_sharding.finish.validate import Trusted, completed_outputs, validate_outputs
from elastic_sharding.layout import JobLayout
from elastic_sharding.output_formats import JSONL, PARQUET, default_outputs, part_name
from elastic_sharding.prepare.jsonl import BLOCK_SIZE
from elastic_sharding.records import CompletionRecord, OutputIndex, PublishRecord, decode, load


@dataclass
class VerifyResult:
    shards: int
    hosts: list[str]
    output_checked: Path | None
    form: str | None = None  # "file" or "directory" when an output was checked
    output_format: str | None = None  # what it holds (jsonl, jsonl.zst, parquet) when an output was checked


def check_hosts(shards: list[tuple[CompletionRecord, Path]], expect_nodes: int = 1) -> list[str]:
    """The distinct hosts that completed shards; refused if fewer than `expect_nodes`."""
    hosts = sorted({record.host for record, _ in shards})
    if len(hosts) < expect_nodes:
        raise JobStateError(
            f"{len(shards)} shards were completed by {len(hosts)} node(s) ({', '.join(hosts)}), expected at least {expect_nodes}"
        )
    return hosts


def verify_shards(layout: JobLayout, expect_nodes: int = 1) -> tuple[int, list[str]]:
    """Every shard is done, its output matches its completion record, and enough hosts took part."""
    count, hosts, _ = _verify_shards(layout, expect_nodes)
    return count, hosts


def _verify_shards(layout: JobLayout, expect_nodes: int) -> tuple[int, list[str], Trusted]:
    shards = completed_outputs(layout)
    trusted = validate_outputs(shards)
    return len(shards), check_hosts(shards, expect_nodes), trusted


def _merge_record(layout: JobLayout, target: Path, form: str, output_format: str | None = None) -> PublishRecord:
    if not confined.lexists(layout.merge_record):
        raise JobStateError(f"{target}: no merge.json in the job directory; run merge first")
    merged = load(PublishRecord, layout.merge_record)
    if os.path.abspath(merged.output) != str(target):
        raise JobStateError(f"merge.json describes {merged.output}, not {target}")
    if merged.form != form:
        raise JobStateError(f"merge.json describes a {merged.form} output at {target}, not a {form}")
    if output_format is not None and merged.output_format != output_format:
        raise JobStateError(f"merge.json describes {merged.output_format} at {target}, not {output_format}")
    return merged


def _check_footer(path: Path, rows: int) -> None:
    """A Parquet file's row count, read from its footer, is `rows` (its bytes were hashed already)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        found = pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise IntegrityError(f"{path}: not a readable Parquet file ({exc})") from None
    if found != rows:
        raise IntegrityError(f"{path}: its Parquet footer says {found} rows, merge.json {rows}")


def verify_merged(layout: JobLayout, target: Path, output_format: str | None = None) -> PublishRecord:
    """`target` is the merged file that `merge.json` describes, byte for byte (its sha256 was
    taken over what merge wrote from validated shard outputs, so a match proves every row valid:
    no parsing); a Parquet file's footer also counts the rows."""
    merged = _merge_record(layout, target, "file", output_format)
    try:
        identity = identify(target)
        sha256 = hash_file(target, identity, BLOCK_SIZE).sha256 if identity.size == merged.bytes else None
    except FileNotFoundError:
        raise JobStateError(f"{target}: merged output does not exist; run merge") from None
    except SourceError as exc:
        raise IntegrityError(f"{target}: {exc.cause}") from None
    except OSError as exc:
        raise IntegrityError(f"{target}: {exc}") from None
    if sha256 is None:
        raise IntegrityError(f"{target}: merged output does not match merge.json (bytes {identity.size} vs {merged.bytes})")
    if sha256 != merged.sha256:
        raise IntegrityError(f"{target}: merged output does not match merge.json (sha256 {sha256[:12]} vs {merged.sha256[:12]})")
    if merged.output_format == PARQUET:
        _check_footer(target, merged.rows)
    return merged


def verify_directory(
    layout: JobLayout,
    target: Path,
    shards: list[tuple[CompletionRecord, Path]],
    trusted: Trusted | None = None,
    output_format: str | None = None,
) -> PublishRecord:
    """`target` is the directory output that `merge.json` describes: its index is the one merge
    wrote, lists exactly the job's completed shards, every listed file is there with the listed
    bytes and sha256, and nothing else a directory reader would take as data is there. Files
    that are a shard output `trusted` has just checked (the same inode) are not hashed again."""
    merged = _merge_record(layout, target, "directory", output_format)
    if confined.kind(target) != "dir":
        what = "is a symbolic link" if confined.kind(target) == "link" else "is not a directory"
        if not confined.lexists(target):
            raise JobStateError(f"{target}: directory output does not exist; run merge")
        raise IntegrityError(f"{target}: {what}")
    index_path = target / INDEX_NAME
    try:
        data = confined.read_bytes_nofollow(index_path)
    except FileNotFoundError:
        raise IntegrityError(f"{target}: no {INDEX_NAME}, so not a complete directory output; run merge") from None
    except OSError as exc:
        raise IntegrityError(f"{index_path}: {exc.strerror or exc}") from None
    if hashlib.sha256(data).hexdigest() != merged.sha256:
        raise IntegrityError(f"{index_path} does not match merge.json (it was changed after merge)")
    try:
        index = decode(OutputIndex, data, index_path)
    except ValueError as exc:
        raise IntegrityError(f"corrupt index {exc}") from None
    job_id = layout.load_manifest().job_id
    if index.format != INDEX_FORMAT or index.job_id != job_id:
        raise IntegrityError(f"{index_path} is not this job's index (job {index.job_id}, not {job_id})")
    if index.output_format != merged.output_format:
        raise IntegrityError(f"{index_path} lists {index.output_format} parts, merge.json {merged.output_format}")
    _check_entries(index, index_path, shards)
    listing = confined.list_dir(target)
    names = [entry.name for entry in index.entries if entry.name is not None]
    for name in names:
        found = listing.get(name)
        if found is None:
            raise IntegrityError(f"{target / name}: missing (listed in {index_path})")
        if found != "file":
            raise IntegrityError(f"{target / name}: {'is a symbolic link' if found == 'link' else 'is not a regular file'}")
    listed = set(names)
    extra = sorted(
        name
        for name in listing
        if name != INDEX_NAME and name not in listed and (not name.startswith(".") or name.endswith(JSON_SUFFIXES))
    )
    if extra:
        raise IntegrityError(
            f"{target / extra[0]}: not in {index_path}; a reader of the directory would take it as data"
            + (f" ({len(extra) - 1} more such entries)" if len(extra) > 1 else "")
        )
    _check_files(target, index, trusted or {})
    return merged


def _check_entries(index: OutputIndex, index_path: Path, shards: list[tuple[CompletionRecord, Path]]) -> None:
    if len(index.entries) != len(shards):
        raise IntegrityError(f"{index_path} lists {len(index.entries)} shard(s); the job has {len(shards)}")
    for entry, (record, _) in zip(index.entries, shards):
        name = part_name(record.shard_id, index.output_format) if record.output_bytes else None
        expected = (name, record.shard_id, record.attempt_id, record.output_rows, record.output_bytes, record.output_sha256)
        found = (entry.name, entry.shard_id, entry.attempt_id, entry.rows, entry.bytes, entry.sha256)
        if index.output_format != JSONL and name is not None:  # a converted part: its own bytes, checked below
            expected, found = expected[:4], found[:4]
        if found != expected:
            raise IntegrityError(f"{index_path}: the entry of {record.shard_id} does not match its completion record")
    totals = (sum(e.rows for e in index.entries), sum(e.bytes for e in index.entries), sum(1 for e in index.entries if e.name))
    if (index.rows, index.bytes, index.files) != totals:
        raise IntegrityError(f"{index_path}: its totals do not add up")


def _check_files(target: Path, index: OutputIndex, trusted: Trusted) -> None:
    entries = [entry for entry in index.entries if entry.name is not None]

    def check(entry) -> None:
        path = target / entry.name
        try:
            identity = identify(path)
            if identity.size != entry.bytes:
                raise IntegrityError(f"{path}: does not match {INDEX_NAME} (bytes {identity.size} vs {entry.bytes})")
            known = trusted.get((identity.dev, identity.ino))
            if known is not None and known == (identity.size, identity.mtime_ns, entry.sha256):
                return  # the very shard output just checked against its record
            content = hash_file(path, identity, BLOCK_SIZE, stop)
        except FileNotFoundError:
            raise IntegrityError(f"{path}: missing (listed in {target / INDEX_NAME})") from None
        except SourceError as exc:
            raise IntegrityError(f"{path}: {exc.cause}") from None
        except OSError as exc:
            raise IntegrityError(f"{path}: {exc}") from None
        if content.sha256 != entry.sha256:
            raise IntegrityError(f"{path}: does not match {INDEX_NAME} (sha256 {content.sha256[:12]} vs {entry.sha256[:12]})")
        if index.output_format == JSONL and content.rows != entry.rows:
            raise IntegrityError(f"{path}: does not match {INDEX_NAME} (rows {content.rows} vs {entry.rows})")
        if index.output_format == PARQUET:
            _check_footer(path, entry.rows)

    stop = threading.Event()
    with ThreadPoolExecutor(thread_count(len(entries)), thread_name_prefix="elastic-verify") as pool:
        run_all(pool, check, entries, stop)


# What to do when the merged output no longer is what merge.json says (its shards are checked first).
MERGED_CHANGED = (
    "the merged output was changed after merge: publish it again with `merge --overwrite` (it checks every shard output first)"
)


def verify_output(
    layout: JobLayout,
    target: Path,
    directory: bool,
    shards: list[tuple[CompletionRecord, Path]],
    trusted: Trusted | None = None,
    output_format: str | None = None,
) -> PublishRecord:
    """The published output at `target`, in either form, is the one merge.json describes
    (`shards`: the job's completed outputs, already validated), and of `output_format` if given."""
    with next_step(MERGED_CHANGED, IntegrityError):
        if directory:
            return verify_directory(layout, target, shards, trusted, output_format)
        return verify_merged(layout, target, output_format)


def output_is_directory(layout: JobLayout, output: Path | str) -> tuple[Path, bool]:
    """`--output` as verify reads it: a directory output if it says so (a trailing `/`, an
    existing directory) or if merge.json published a directory there."""
    target, directory = output_form(output)
    if not directory and confined.lexists(layout.merge_record) and not confined.lexists(target):
        try:
            record = load(PublishRecord, layout.merge_record)
        except JobStateError:
            return target, False
        directory = record.form == "directory" and os.path.abspath(record.output) == str(target)
    return target, directory


def verify(job_dir: Path, expect_nodes: int = 1, output: Path | str | None = None) -> VerifyResult:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    shards = completed_outputs(layout)
    trusted = validate_outputs(shards)
    hosts = check_hosts(shards, expect_nodes)
    if output is not None:
        target, directory = output_is_directory(layout, output)
    else:
        target, directory = _default_target(layout), False
    if output is None and not confined.lexists(target):
        return VerifyResult(len(shards), hosts, None)
    record = verify_output(layout, target, directory, shards, trusted)
    return VerifyResult(len(shards), hosts, target, "directory" if directory else "file", record.output_format)


def _default_target(layout: JobLayout) -> Path:
    """What verify checks without `--output`: the default output merge.json names (a launcher's
    `merged.jsonl`, `merged.jsonl.zst` or `merged.parquet`), else `merged.jsonl`."""
    defaults = default_outputs(layout)
    if confined.lexists(layout.merge_record):
        try:
            named = Path(os.path.abspath(load(PublishRecord, layout.merge_record).output))
        except JobStateError:
            named = None
        if named in defaults:
            return named
    return defaults[0]
