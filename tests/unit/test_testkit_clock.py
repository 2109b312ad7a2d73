"""The test kit's virtual clock and its SQLite ``strftime`` stand-in (no database)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest

from app.db.dialect import _SQLITE_FORMAT
from app.sdk.testing.clock import VirtualClock, virtual_strftime

START = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def test_clock_starts_where_asked_and_only_moves_forward() -> None:
    clock = VirtualClock(START)
    assert START <= clock.now() < START + timedelta(seconds=5)
    clock.advance(timedelta(days=3))
    assert clock.now() >= START + timedelta(days=3)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="timezone"):
        VirtualClock(datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("timestring", "modifiers"),
    [
        ("2030-05-06 07:08:09.123", ()),
        ("2030-05-06 07:08:09.123", ("+1.500000 seconds",)),
        ("2030-05-06 07:08:09.123", ("-86400.000000 seconds",)),
        ("2030-12-31 23:59:59.999", ("+0.001000 seconds",)),
        ("2030-05-06 07:08:09", ("+2 days", "-3 hours", "+1 minute")),
    ],
)
def test_strftime_matches_sqlite_builtin(timestring: str, modifiers: tuple[str, ...]) -> None:
    clock = VirtualClock()
    marks = ", ?" * len(modifiers)
    with sqlite3.connect(":memory:") as conn:
        expected = conn.execute(
            f"SELECT strftime(?, ?{marks})", (_SQLITE_FORMAT, timestring, *modifiers)
        ).fetchone()[0]
        unix = conn.execute("SELECT strftime('%s', ?)", (timestring,)).fetchone()[0]
    conn.close()
    assert virtual_strftime(clock, _SQLITE_FORMAT, timestring, *modifiers) == expected
    assert virtual_strftime(clock, "%s", timestring) == unix


def test_strftime_now_reads_the_virtual_clock() -> None:
    clock = VirtualClock(START)
    text = virtual_strftime(clock, _SQLITE_FORMAT, "now", "+60.000000 seconds")
    assert text.startswith("2030-05-06 07:09:")
    with pytest.raises(ValueError, match="unsupported"):
        virtual_strftime(clock, "%J", "now")
    with pytest.raises(ValueError, match="unsupported"):
        virtual_strftime(clock, _SQLITE_FORMAT, "now", "start of month")
