"""Where a command publishes its final output: the `--output` of `merge`, `report` and the launchers.

Like the original tool, a missing directory of `--output` is created (`mkdir -p`, with the tool's
modes). It is created and tried with a temporary file at once, before any shard is merged or any
job is started, so a place that cannot take the file (permission denied, a file in the way, a
read-only mount) fails in one line before work is spent, and leaves nothing behind.

`merge` and the launchers also publish a directory (an `--output` ending in `/`, or an existing
directory): one file per shard (JSONL, or another of `output_formats`) plus the index
`INDEX_NAME`, built in a hidden staging directory beside it and renamed into place whole, so no
reader sees a half-made one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import secrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from elastic_sharding import confined, fsops
from elastic_sharding.errors import JobStateError, UsageError
from elastic_sharding.layout import JobLayout
from elastic_sharding.output_formats import JSONL, is_part_name
from elastic_sharding.records import PublishRecord, load

log = logging.getLogger(__name__)

# The index of a directory output. Hidden, so that Hugging Face `datasets` (which skips names
# starting with "."), Ray Data (which skips "." and "_") and Data-Juicer (which picks files by
# suffix: .json, .jsonl and their .gz/.zst forms) all read the directory as its part files only.
INDEX_NAME = ".elastic-shard-index"
INDEX_FORMAT = "elastic-shard-output-index"
JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".json.zst", ".jsonl.zst")


@dataclass
class Destination:
    created: list[Path] = field(default_factory=list)  # the directories made for it, outermost first

    def discard(self) -> None:
        """Remove the directories made for this output (those still empty) after a failure."""
        fsops.remove_dirs(self.created)
        self.created = []


def _job_part(output: Path, layout: JobLayout) -> str | None:
    """The first component of `output` below the job directory, or None if it lies elsewhere."""
    try:
        relative = output.relative_to(layout.root)
    except ValueError:
        return None
    return relative.parts[0] if relative.parts else ""


def output_form(output: Path | str, directory: bool | None = None) -> tuple[Path, bool]:
    """The absolute `--output` and whether it names a directory output: asked for (`directory`),
    written with a trailing `/`, or an existing directory."""
    text = os.fspath(output)
    path = Path(os.path.abspath(text))
    if directory is None:
        directory = text.endswith(("/", os.sep)) or os.path.isdir(path)
    return path, directory


def check_target(output: Path, layout: JobLayout, directory: bool = False) -> Path:
    """The absolute output path, refused if it would replace the job's own files; a directory
    output may not be a link, nor the job directory or one that holds it, and a file output may
    not be an existing directory."""
    output = Path(os.path.abspath(output))
    if directory:
        if confined.kind(output) == "link":
            raise UsageError(f"--output {output} is a symbolic link; name the directory itself")
        if confined.kind(output) not in (None, "dir"):
            raise UsageError(f"--output {output}/ names a directory output, but {output} is a file")
        if output == layout.root or output in layout.root.parents:
            raise UsageError(f"--output {output} is or contains the job directory; publish the directory output elsewhere")
    elif output.is_dir():
        raise UsageError(f"--output {output} is a directory")
    part = _job_part(output, layout)
    if part in layout.own_names:
        raise UsageError(f"--output {output} is inside the job's own {part}; write it directly in the job directory or elsewhere")
    return output


def prepare_destination(output: Path, create_once: bool = False, directory: bool = False) -> Destination:
    """Create the missing directories of `output` (as `check_target` returned it) and prove a
    file can be created there, and with `create_once` published by hard link, as a merge that
    may not replace an existing file publishes it (a directory output is renamed into place:
    its parent needs to take new entries only)."""
    created: list[Path] = []
    # Several launchers may create one --output directory at once. On a caching NAS the loser of
    # a racing mkdir can see the directory and yet be told it is missing when it creates a file
    # in it (GlusterFS: its client still holds its own losing mkdir's handle) until its cache
    # settles: the directories and the probe are tried again for that long.
    deadline = time.monotonic() + fsops.STALE_HANDLE_SECS
    while True:
        created += _make_dirs(output)
        try:
            fsops.probe_create(output, create_once and not directory)
            return Destination(created)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESTALE) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            fsops.remove_dirs(created)
            _refuse_probe(output, exc)


def check_destination(output: Path, create_once: bool = False, directory: bool = False) -> None:
    """`prepare_destination`'s proof for a dry run, which must leave nothing: its missing
    directories are not created, the file is tried in the nearest existing one above instead
    (where `mkdir -p` would make the first; the same mount and permissions)."""
    existing = _nearest_directory(output)
    target = existing / output.name
    try:
        fsops.probe_create(target, create_once and not directory)
    except OSError as exc:
        if exc.filename == str(target):  # the link: name the output the user gave
            exc = type(exc)(exc.errno, exc.strerror, str(output))
        if existing == output.parent or exc.filename == str(output):
            _refuse_probe(output, exc)
        first = existing / output.parent.relative_to(existing).parts[0]
        raise UsageError(f"--output {output}: cannot create directory {first}: {exc.strerror or exc}") from None


def _nearest_directory(output: Path) -> Path:
    """The deepest existing directory on the way to `output` (links followed); something else in
    the way is refused as `_make_dirs` refuses it."""
    current = output.parent
    while True:
        try:
            mode = os.stat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if confined.is_link(current):
                _in_the_way(output, current, "is a broken symbolic link, not a directory")
            current = current.parent
            continue
        if not stat.S_ISDIR(mode):
            _in_the_way(output, current, "is not a directory")
        return current


def _in_the_way(output: Path, path: Path, why: str) -> NoReturn:
    if path == output.parent:
        raise UsageError(f"--output {output}: {path} {why}; choose another --output")
    raise UsageError(f"--output {output}: cannot create directory {output.parent}: {path} {why}")


def _make_dirs(output: Path) -> list[Path]:
    parent = output.parent
    try:
        return fsops.make_dirs(parent)
    except NotADirectoryError as exc:
        if exc.filename == str(parent):
            raise UsageError(f"--output {output}: {parent} {exc.strerror}; choose another --output") from None
        raise UsageError(f"--output {output}: cannot create directory {parent}: {exc.filename} {exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot create directory {exc.filename or parent}: {exc.strerror or exc}") from None


def _refuse_probe(output: Path, exc: OSError) -> NoReturn:
    if exc.filename == str(output):  # the link: a mount without hard links
        raise UsageError(
            f"--output {output}: cannot publish it create-once in {output.parent}: {exc.strerror}; the output is linked "
            "into place so that a file another writer made meanwhile is never replaced: write it to a POSIX mount and "
            "copy it here afterwards (or use merge --overwrite, which renames it into place)"
        ) from None
    raise UsageError(f"--output {output}: cannot write in {output.parent}: {exc.strerror or exc}") from None


def inside_job(output: Path, layout: JobLayout) -> bool:
    return _job_part(output, layout) is not None


def published(output: Path, directory: bool) -> bool:
    """Whether something is at `output` that a merge would have to replace (an empty directory
    is not: publishing a directory output renames onto it)."""
    if directory and confined.kind(output) == "dir":
        return bool(os.listdir(output))
    return confined.lexists(output)


def refuse_foreign_output(output: Path, layout: JobLayout, directory: bool = False, output_format: str = JSONL) -> None:
    """A launcher keeps an existing output only if it is this job's merge: refuse any other file
    now, before the run, not after it. "This job's merge" is judged cheaply here (merge.json
    names it, in the same form, with its size or its index); finalize verifies it byte for byte.
    With the job directory there but no merge.json yet, the decision is left to finalize: another
    node may be publishing both. `output` is as `check_target` returned it."""
    if not published(output, directory) or (layout.root.is_dir() and not confined.lexists(layout.merge_record)):
        return
    why = "the job has not been prepared yet"
    if confined.lexists(layout.merge_record):
        try:
            record = load(PublishRecord, layout.merge_record)
        except JobStateError as exc:
            raise UsageError(f"--output {output} already exists and this job's merge record is unreadable: {exc}") from None
        form = "directory" if directory else "file"
        if os.path.abspath(record.output) != str(output):
            why = f"this job was merged into {record.output}"
        elif record.form != form:
            why = f"this job's merge there is a {record.form}, not a {form}"
        elif record.output_format != output_format:
            why = f"this job's merge there is {record.output_format}, not {output_format}"
        elif directory and not confined.lexists(output / INDEX_NAME):
            why = f"it has no {INDEX_NAME}"
        elif not directory and os.stat(output).st_size != record.bytes:
            why = f"its size differs from this job's merge ({record.bytes} bytes)"
        else:
            return
    raise UsageError(
        f"--output {output} already exists and is not this job's merge ({why}); move it away or pass another --output"
    )


# -- directory outputs ----------------------------------------------------------------------------


def refuse_existing_directory(output: Path, overwrite: bool) -> None:
    """A directory output goes where nothing is, or onto an empty directory; an existing non-empty
    one is replaced only with `overwrite`, and only if it holds an earlier directory output and
    nothing else (its index and part files), so that --overwrite never deletes other files."""
    if not published(output, True):
        return
    if not overwrite:
        raise UsageError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    entries = confined.list_dir(output)
    foreign = sorted(
        name for name, found in entries.items() if name != INDEX_NAME and not (found == "file" and is_part_name(name))
    )
    if INDEX_NAME not in entries or foreign:
        what = f"holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}" if foreign else f"has no {INDEX_NAME}"
        raise UsageError(
            f"--output {output} is not an earlier directory output of merge (it {what}); --overwrite replaces only "
            "those: move it away or pass another --output"
        )


def _hidden_sibling(output: Path, kind: str) -> Path:
    return output.with_name(f".{output.name}.{kind}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")


def make_staging_dir(output: Path) -> Path:
    """The hidden directory beside `output` in which its directory output is built."""
    stage = _hidden_sibling(output, "staging")
    try:
        os.mkdir(stage, confined.DIR_MODE)
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write in {output.parent}: {exc.strerror or exc}") from None
    return stage


def remove_tree(path: Path) -> None:
    """Remove a staging or replaced directory (never following links inside it); errors are logged."""
    if confined.kind(path) != "dir":
        return

    def failed(function, name, exc_info) -> None:
        log.warning("could not remove %s: %s", name, exc_info[1])

    shutil.rmtree(path, onerror=failed)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two names atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, f"rename() of its staging directory failed: {os.strerror(code)}", str(b))


def publish_directory(stage: Path, output: Path, replace: bool) -> bool:
    """Move the complete directory `stage` to `output`; False if `output` is a non-empty directory
    that may not be replaced (one that appeared meanwhile). An empty directory, or nothing, at
    `output` is replaced in one rename; with `replace`, a non-empty one is swapped with `stage` in
    one step where the kernel can (renameat2 RENAME_EXCHANGE), else moved aside and `stage`
    renamed in its place (for a moment there is no `output`), and then removed."""
    fsops.fsync_dir(stage)
    try:
        os.rename(stage, output)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            with fsops.reported_as(output, "rename() of its staging directory", stage):
                raise
        if not replace:
            return False
    else:
        fsops.fsync_dir(output.parent)
        return True
    if _exchange(stage, output):
        fsops.fsync_dir(output.parent)
        remove_tree(stage)  # the replaced directory, now under the staging name
        return True
    aside = _hidden_sibling(output, "replaced")
    os.rename(output, aside)
    try:
        os.rename(stage, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.rename(aside, output)
        raise
    fsops.fsync_dir(output.parent)
    remove_tree(aside)
    return True


def load_publish_record(layout: JobLayout) -> PublishRecord:
    return load(PublishRecord, layout.merge_record)
