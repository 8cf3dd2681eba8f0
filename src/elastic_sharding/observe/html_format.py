"""Text for the HTML report: escaping, and numbers, sizes, rates, durations and times as shown.

The report's data comes from `status --json` (any field may be missing or of another type), so
every formatter takes any value and shows one that is not a number as "–".
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

from elastic_sharding.observe.durations import format_duration

NONE = "–"


def esc(value: object) -> str:
    """Escaped text for element content and quoted attributes; None shows as nothing."""
    return "" if value is None else html.escape(str(value), quote=True)


def num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def fmt_int(value: object) -> str:
    number = num(value)
    return NONE if number is None else f"{int(number):,}"


def fmt_bytes(value: object) -> str:
    number = num(value)
    if number is None:
        return NONE
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(number) < 1024 or unit == "TiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.1f} {unit}"
        number /= 1024
    return NONE


def fmt_rate(value: object, unit: str) -> str:
    number = num(value)
    if number is None:
        return NONE
    return fmt_bytes(number) + "/s" if unit == "bytes" else f"{number:,.1f} rows/s"


def fmt_secs(value: object) -> str:
    return format_duration(value, "report")


def iso(epoch: object) -> str:
    number = num(epoch)
    if number is None:
        return NONE
    return datetime.fromtimestamp(number, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def dicts(value: object) -> list[Any]:
    """The objects of a JSON list (anything else in it, or a value that is no list, is left out)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
