"""Compare two `overall.csv` files the way the analysis promises they agree with `dj-analyze`'s:
the same row labels and statistic columns in the same order; counts and strings exactly; floats
within 1e-9 relative or 1e-9 absolute (dj-analyze's values carry about 10 decimals)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

TOLERANCE = 1e-9


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def same_cell(got: str, want: str) -> bool:
    if got == want:
        return True
    a, b = _number(got), _number(want)
    if a is None or b is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def overall_differences(got: Path, want: Path) -> list[str]:
    """Every way `got` differs from `want`, one line each; empty when they agree."""
    a = list(csv.reader(got.read_text().splitlines()))
    b = list(csv.reader(want.read_text().splitlines()))
    if a[:1] != b[:1]:
        return [f"columns differ: {a[:1]} vs {b[:1]}"]
    if [row[0] for row in a] != [row[0] for row in b]:
        return [f"row labels differ: {[r[0] for r in a]} vs {[r[0] for r in b]}"]
    columns = a[0]
    return [
        f"{row_a[0]} of {columns[i]}: {cell_a!r} vs {cell_b!r}"
        for row_a, row_b in zip(a[1:], b[1:])
        for i, (cell_a, cell_b) in enumerate(zip(row_a, row_b))
        if i and not same_cell(cell_a, cell_b)
    ]
