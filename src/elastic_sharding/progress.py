"""Progress of long steps (prepare's passes, merge, a launcher waiting for shards) on stderr.

A live bar (tqdm) is drawn only when stderr is a terminal and the command is not `--quiet` or
`--json`; logs captured by a scheduler stay free of it (the steps log their start and end, and
`status` answers "how far" for anyone). Callers report per block, not per row, and the bar
redraws a few times a second at most, so progress costs nothing measurable.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

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
    """Units done out of `total` (bytes by default; and rows, when the caller counts them)."""

    def __init__(self, label: str, total: int, quiet: bool = False, unit: str = "B"):
        self.label = label
        self.total = total
        self.done = 0
        self.rows = 0
        self._started = time.monotonic()
        self._bar: Any = None
        if progress_enabled(quiet):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=label,
                unit=unit,
                unit_scale=unit == "B",
                unit_divisor=1024,
                mininterval=REDRAW_SECS,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def update(self, done: int, rows: int = 0) -> None:
        self.done += done
        self.rows += rows
        if self._bar is not None:
            if rows:
                self._bar.set_postfix_str(f"{self.rows} rows", refresh=False)
            self._bar.update(done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
