"""Durations for people: the one formatter behind `status` text and the HTML report.

Two named styles, each what its output has always shown:

- "status" (the terminal view of `status`): whole seconds up to 119s ("90s"), then minutes and
  seconds below two hours ("119m59s"), then hours and minutes; a missing value is "-".
- "report" (the HTML report): tenths below 10s ("9.5s"), whole seconds below a minute ("45s"),
  then minutes and seconds below an hour ("1m30s"), then hours and minutes ("1h05m"); anything
  that is not a number (it comes from JSON) is "–".
"""

from __future__ import annotations

from typing import Literal

DurationStyle = Literal["status", "report"]


def format_duration(seconds: object, style: DurationStyle) -> str:
    if style == "status":
        if seconds is None:
            return "-"
        whole = int(seconds)  # type: ignore[call-overload]
        return f"{whole}s" if whole < 120 else _minutes_or_hours(whole, hours_from=7200)
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "–"
    secs = float(seconds)
    if secs < 60:
        return f"{secs:.1f}s" if secs < 10 else f"{secs:.0f}s"
    return _minutes_or_hours(int(secs), hours_from=3600)


def _minutes_or_hours(whole: int, hours_from: int) -> str:
    if whole < hours_from:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


__all__ = ["DurationStyle", "format_duration"]
