"""Compare two `overall.csv` files the way the analysis promises they agree with `dj-analyze`'s:
the bench's own comparison (`bench/analyze_measure.compare_overall`: the same columns and row
labels in order; counts and strings exactly; floats within 1e-9 relative or absolute)."""

from __future__ import annotations

import sys
from pathlib import Path

from support.jobs import REPO

sys.path.insert(0, str(REPO / "bench"))
from analyze_measure import compare_overall  # noqa: E402


def overall_differences(got: Path, want: Path) -> list[str]:
    """How `got` differs from `want` (the first 20 ways), empty when they agree."""
    result = compare_overall(got, want)
    return [] if result["equal"] else result["mismatches"] or ["no cells compared"]
