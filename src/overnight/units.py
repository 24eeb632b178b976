"""Sizes for people: ``human_bytes(1536) == "1.5 KB"``. Shared by the CLI and the dashboard."""

from __future__ import annotations


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
