"""`status` once, or `status --watch`: redraw on a terminal, plain lines elsewhere, JSON lines for machines."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson

from elastic_sharding import confined
from elastic_sharding.errors import EXIT_INCOMPLETE
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe import prometheus
from elastic_sharding.observe.status import Status
from elastic_sharding.observe.status_text import progress_line, status_text

_HOME_AND_CLEAR = "\x1b[H\x1b[2J"


def _emit(status: Status, as_json: bool, show_all: bool, export: Path | None, *, compact: bool = False) -> None:
    if export is not None:
        prometheus.write(status, export)
    if as_json:
        option = 0 if compact else orjson.OPT_INDENT_2
        sys.stdout.write(orjson.dumps(status.as_json(), option=option).decode() + "\n")
    else:
        sys.stdout.write(status_text(status, show_all) + "\n")
    sys.stdout.flush()


def show_status(job_dir: Path, lock_timeout: float | None, as_json: bool, show_all: bool, export: Path | None) -> int:
    export = prometheus.check_target(export) if export is not None else None
    status = Status(job_dir, lock_timeout)
    _emit(status, as_json, show_all, export)
    return status.exit_code


def _is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def watch_status(
    job_dir: Path, lock_timeout: float | None, every: float, as_json: bool, show_all: bool, export: Path | None
) -> int:
    """Until the job completes or fails (then its status exit code); Ctrl-C ends it with 1."""
    export = prometheus.check_target(export) if export is not None else None
    redraw = _is_terminal() and not as_json
    code = EXIT_INCOMPLETE
    manifest = JobLayout(Path(os.path.abspath(job_dir))).manifest
    try:
        while not confined.lexists(manifest):
            # Started before `prepare` finished (a launcher's first minutes): wait for the job. On
            # stderr, so that stdout stays the view (or one JSON object per line).
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {job_dir}: waiting for prepare to publish the job\n")
            time.sleep(every)
        while True:
            status = Status(job_dir, lock_timeout)
            code = status.exit_code
            if redraw:
                sys.stdout.write(_HOME_AND_CLEAR)
                _emit(status, False, show_all, export)
                sys.stdout.write(f"\n(every {every:g}s; Ctrl-C to stop watching; the job goes on)\n")
                sys.stdout.flush()
            elif as_json:
                _emit(status, True, show_all, export, compact=True)
            else:
                if export is not None:
                    prometheus.write(status, export)
                sys.stdout.write(f"{time.strftime('%H:%M:%S')} {status.summary_line()}\n  {progress_line(status)}\n")
                sys.stdout.flush()
            if code != EXIT_INCOMPLETE:
                if not redraw and not as_json:
                    sys.stdout.write(status_text(status, show_all) + "\n")
                return code
            time.sleep(every)
    except KeyboardInterrupt:
        return code
