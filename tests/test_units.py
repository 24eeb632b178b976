"""Sizes and durations as the CLI, the queue's statuses and the dashboard print them."""

from __future__ import annotations

import pytest

from overnight.units import human_bytes, human_duration


@pytest.mark.parametrize("ms, text", [
    (-5_000, "0.0 s"),  # a clock a little ahead reads as now, never "-5 s"
    (500, "0.5 s"), (9_949, "9.9 s"), (42_000, "42 s"), (119_000, "119 s"),
    (1_798_000, "30 min"), (7_169_999, "119 min"), (19_800_000, "5.5 h"), (276_480_000, "3.2 d"),
    # a value that rounds up to the next unit's threshold reads in that unit: never "120 s",
    # "120 min" or "48.0 h"
    (119_999, "2 min"), (7_199_000, "2.0 h"), (172_790_000, "2.0 d"),
])
def test_human_duration(ms, text):
    assert human_duration(ms) == text


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 1024 ** 2, 3 * 1024 ** 4)] == \
        ["0 B", "1023 B", "1.5 KB", "5.0 MB", "3072.0 GB"]
