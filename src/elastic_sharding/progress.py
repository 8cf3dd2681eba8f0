"""Progress of long streaming steps (prepare's passes, merge) on stderr.

A live bar (tqdm) is drawn only when stderr is a terminal, so logs captured by a scheduler stay
clean; elsewhere a log line every `LOG_EVERY_SECS` keeps long runs visibly alive. `quiet`
silences both (the CLI's `--quiet`/`--json`). Callers report per block, not per row, and the bar
redraws a few times a second at most, so progress costs nothing measurable.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import Any

LOG_EVERY_SECS = 10.0
REDRAW_SECS = 0.25


def progress_enabled(quiet: bool) -> bool:
    """Whether a live bar may be drawn: not quiet and stderr is a terminal."""
    if quiet:
        return False
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Bytes done out of `total` (and rows, when the caller counts them) for one step."""

    def __init__(self, label: str, total: int, logger: logging.Logger, quiet: bool = False):
        self.label = label
        self.total = total
        self.done = 0
        self.rows = 0
        self._log = None if quiet else logger
        self._started = time.monotonic()
        self._next_log = self._started + LOG_EVERY_SECS
        self._bar: Any = None
        if progress_enabled(quiet):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=label,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                mininterval=REDRAW_SECS,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def update(self, nbytes: int, rows: int = 0) -> None:
        self.done += nbytes
        self.rows += rows
        if self._bar is not None:
            if rows:
                self._bar.set_postfix_str(f"{self.rows} rows", refresh=False)
            self._bar.update(nbytes)
        elif self._log is not None and time.monotonic() >= self._next_log:
            self._next_log = time.monotonic() + LOG_EVERY_SECS
            self._log.info("%s", self.summary())

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rows = f"{self.rows} rows, " if self.rows else ""
        return f"{self.label}: {rows}{pct:.1f}% of {self.total / 2**20:.1f} MiB ({self.done / elapsed / 2**20:.0f} MiB/s)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
