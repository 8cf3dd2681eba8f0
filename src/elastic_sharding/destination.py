"""Where a command publishes its final file: the `--output` of `merge`, `report` and the launchers.

Like the original tool, a missing directory of `--output` is created (`mkdir -p`, with the tool's
modes). It is created and tried with a temporary file at once, before any shard is merged or any
job is started, so a place that cannot take the file (permission denied, a file in the way, a
read-only mount) fails in one line before work is spent, and leaves nothing behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import fsops
from .errors import JobStateError, UsageError
from .layout import JobLayout
from .records import MergeRecord, load


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


def check_target(output: Path, layout: JobLayout) -> Path:
    """The absolute output path, refused if it is a directory or would replace the job's own files."""
    output = Path(os.path.abspath(output))
    if output.is_dir():
        raise UsageError(f"--output {output} is a directory")
    part = _job_part(output, layout)
    if part in layout.own_names:
        raise UsageError(f"--output {output} is inside the job's own {part}; write it directly in the job directory or elsewhere")
    return output


def prepare_destination(output: Path, create_once: bool = False) -> Destination:
    """Create the missing directories of `output` (as `check_target` returned it) and prove a
    file can be created there, and with `create_once` published by hard link, as a merge that
    may not replace an existing file publishes it."""
    parent = output.parent
    try:
        created = fsops.make_dirs(parent)
    except NotADirectoryError as exc:
        if exc.filename == str(parent):
            raise UsageError(f"--output {output}: {parent} {exc.strerror}") from None
        raise UsageError(f"--output {output}: cannot create directory {parent}: {exc.filename} {exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot create directory {exc.filename or parent}: {exc.strerror or exc}") from None
    try:
        fsops.probe_create(output, create_once)
    except OSError as exc:
        fsops.remove_dirs(created)
        if exc.filename == str(output):  # the link: a mount without hard links
            raise UsageError(
                f"--output {output}: cannot publish it create-once in {parent}: {exc.strerror}; the output is linked into "
                "place so that a file another writer made meanwhile is never replaced: write it to a POSIX mount and copy "
                "it here afterwards (or use merge --overwrite, which renames it into place)"
            ) from None
        raise UsageError(f"--output {output}: cannot write in {parent}: {exc.strerror or exc}") from None
    return Destination(created)


def inside_job(output: Path, layout: JobLayout) -> bool:
    return _job_part(output, layout) is not None


def refuse_foreign_output(output: Path, layout: JobLayout) -> None:
    """A launcher keeps an existing output only if it is this job's merge: refuse any other file
    now, before the run, not after it. "This job's merge" is judged cheaply here (merge.json
    names it, with its size); finalize verifies it byte for byte. With the job directory there
    but no merge.json yet, the decision is left to finalize: another node may be publishing both.
    `output` is as `check_target` returned it."""
    if not fsops.lexists(output) or (layout.root.is_dir() and not fsops.lexists(layout.merge_record)):
        return
    why = "the job has not been prepared yet"
    if fsops.lexists(layout.merge_record):
        try:
            record = load(MergeRecord, layout.merge_record)
        except JobStateError as exc:
            raise UsageError(f"--output {output} already exists and this job's merge record is unreadable: {exc}") from None
        if os.path.abspath(record.output) != str(output):
            why = f"this job was merged into {record.output}"
        elif os.stat(output).st_size != record.bytes:
            why = f"its size differs from this job's merge ({record.bytes} bytes)"
        else:
            return
    raise UsageError(
        f"--output {output} already exists and is not this job's merge ({why}); move it away or pass another --output"
    )
