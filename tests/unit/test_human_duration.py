"""Durations in human units (app/core/text.py ``human_duration``), at every unit boundary."""

from __future__ import annotations

import math

import pytest

from app.core.text import human_duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0.0 ms"),
        (0.0004, "0.4 ms"),
        (0.0099, "9.9 ms"),
        (0.00995, "10 ms"),  # rounds up into whole milliseconds
        (0.999, "999 ms"),
        (0.9994, "999 ms"),
        (0.9996, "1.0 s"),  # rounded before the unit is chosen: never "1000 ms"
        (1, "1.0 s"),
        (59.9, "59.9 s"),
        (59.94, "59.9 s"),
        (59.96, "1 min"),  # never "60.0 s"
        (60, "1 min"),
        (61, "1 min 1 s"),
        (90.4, "1 min 30 s"),
        (3599.4, "59 min 59 s"),
        (3599.6, "1 h"),
        (3600, "1 h"),
        (3660, "1 h 1 min"),
        (86_340, "23 h 59 min"),
        (86_399, "1 d"),
        (86_400, "1 d"),
        (90_000, "1 d 1 h"),
        (400 * 86_400 + 7200, "400 d 2 h"),
    ],
)
def test_boundaries(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


@pytest.mark.parametrize("bad", [-0.001, -5, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_duration_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds >= 0"):
        human_duration(bad)
