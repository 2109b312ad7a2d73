"""Cron next-time table across DST transitions in two zones (the engine's tick chain).

Each row starts from an instant and follows :func:`next_tick` tick after tick, exactly as
a scheduler pass does. Decisions (docs/adr/0005-schedules.md):

- gap (spring forward): a fixed wall time that does not exist fires once, at the first
  valid instant after the gap (03:00 local);
- overlap (fall back): a fixed wall time that occurs twice fires once, at its first
  occurrence (the earlier UTC instant);
- expressions with a wildcard hour follow elapsed time: every real hour / half hour,
  including both passes through a repeated hour, none for the hour that does not exist.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from app.core.errors import InvalidInput
from app.engine.schedules import check_timing, jitter_offset, next_tick


def z(text: str) -> datetime:
    """A UTC instant from ISO text with offset."""
    return datetime.fromisoformat(text).astimezone(UTC)


TABLE = [
    # Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
    (
        "Europe/Berlin",
        "30 2 * * *",
        "2026-03-28T12:00:00+01:00",
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
    ),
    (
        "Europe/Berlin",
        "30 2 * * *",
        "2026-10-24T12:00:00+02:00",
        ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
    ),
    (
        "Europe/Berlin",
        "0 * * * *",
        "2026-03-29T00:30:00+01:00",
        ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00"],
    ),
    (
        "Europe/Berlin",
        "*/30 * * * *",
        "2026-10-25T01:45:00+02:00",
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ],
    ),
    (
        "Europe/Berlin",
        "0 9 * * 1-5",
        "2026-10-23T10:00:00+02:00",
        ["2026-10-26T09:00:00+01:00", "2026-10-27T09:00:00+01:00"],
    ),
    # America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
    (
        "America/New_York",
        "30 2 * * *",
        "2026-03-07T12:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
    ),
    (
        "America/New_York",
        "0 2 * * *",
        "2026-03-07T12:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"],
    ),
    (
        "America/New_York",
        "30 1 * * *",
        "2026-10-31T12:00:00-04:00",
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
    ),
    (
        "America/New_York",
        "*/30 * * * *",
        "2026-11-01T00:45:00-04:00",
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:30:00-05:00",
            "2026-11-01T02:00:00-05:00",
        ],
    ),
    (
        "America/New_York",
        "0 9 * * 1-5",
        "2026-10-30T10:00:00-04:00",
        ["2026-11-02T09:00:00-05:00", "2026-11-03T09:00:00-05:00"],
    ),
]


@pytest.mark.parametrize(("zone", "cron", "start", "expected"), TABLE)
def test_next_ticks_across_dst(zone: str, cron: str, start: str, expected: list[str]) -> None:
    ticks: list[datetime] = []
    after = z(start)
    for _ in expected:
        tick = next_tick(cron, zone, None, after)
        assert tick is not None
        assert tick.tzinfo is UTC
        ticks.append(tick)
        after = tick
    assert ticks == [z(e) for e in expected]


def test_one_off_ticks_once() -> None:
    at = z("2027-01-01T09:00:00+01:00")
    assert next_tick(None, "UTC", at, z("2026-12-31T00:00:00+00:00")) == at
    assert next_tick(None, "UTC", at, at) is None


def test_jitter_is_deterministic_and_bounded() -> None:
    sid = uuid.UUID("01930000-0000-7000-8000-000000000000")
    tick = z("2026-06-01T12:00:00+00:00")
    values = {jitter_offset(sid, tick.replace(minute=m), 30) for m in range(60)}
    assert all(0 <= v < 30 for v in values)
    assert len(values) > 30  # spread out, not one constant
    assert jitter_offset(sid, tick, 30) == jitter_offset(sid, tick, 30)
    assert jitter_offset(sid, tick, 0) == 0


@pytest.mark.parametrize(
    ("cron", "zone", "at", "message"),
    [
        ("* * * *", "UTC", None, "5 fields"),
        ("* * * * * *", "UTC", None, "5 fields"),
        ("61 * * * *", "UTC", None, "bad cron"),
        ("* * * * *", "Nowhere/Else", None, "time zone"),
        ("* * * * *", "localtime", None, "time zone"),
        ("* * * * *", "Europe/../UTC", None, "time zone"),
        ("0 0 L-3 * *", "UTC", None, "bad cron"),
        (None, "UTC", None, "exactly one"),
        ("* * * * *", "UTC", z("2027-01-01T00:00:00+00:00"), "exactly one"),
        (None, "UTC", datetime(2027, 1, 1), "timezone"),
    ],
)
def test_bad_timing_is_refused(
    cron: str | None, zone: str, at: datetime | None, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_timing(cron, zone, at)
