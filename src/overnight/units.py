"""Sizes and durations for people: ``human_bytes(1536) == "1.5 KB"``, ``human_duration(1_800_000) ==
"30 min"``. Shared by the CLI, the queue's statuses and the dashboard."""

from __future__ import annotations


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_duration(ms: int | float) -> str:
    """``ms`` milliseconds for a person: ``0.5 s`` below 10 s, ``42 s``, ``30 min`` from 2 min,
    ``5.5 h`` from 2 h, ``3.2 d`` from 2 days, each threshold applied to the value as printed
    (119.9 s reads ``2 min``, never ``120 s``); a negative duration reads as ``0.0 s``."""
    s = max(ms, 0) / 1000
    # each unit is chosen by the value as printed, so 7,199 s reads "2.0 h", not "120 min"
    if round(s, 1) < 10:
        return f"{s:.1f} s"
    if round(s) < 120:
        return f"{s:.0f} s"
    if round(s / 60) < 120:
        return f"{s / 60:.0f} min"
    if round(s / 3600, 1) < 48:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
