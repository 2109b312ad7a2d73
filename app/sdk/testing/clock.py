"""The test kit's virtual clock and the SQLite ``strftime`` that reads it.

See docs/adr/0006-test-kit-virtual-clock.md: on the kit's own connections ``strftime(…,
'now')``, which is how :mod:`app.db.dialect` reads the database clock on SQLite, returns
the virtual time instead of the host's.
"""

from __future__ import annotations

import functools
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["VirtualClock", "install_clock", "virtual_strftime"]


class VirtualClock:
    """Real UTC time plus an offset that only moves forward.

    Time keeps flowing while a test runs (so durations and event order stay realistic);
    :meth:`advance` jumps ahead.

    Args:
        start: the virtual time now (aware); default: the real time.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("VirtualClock start must be timezone-aware")
        self._lock = threading.Lock()  # read from aiosqlite's connection threads
        self._offset = timedelta(0) if start is None else start - datetime.now(UTC)

    def now(self) -> datetime:
        """The virtual time (aware UTC)."""
        with self._lock:
            offset = self._offset
        return datetime.now(UTC) + offset

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by ``delta``.

        Raises:
            ValueError: ``delta`` is negative (database time never goes back).
        """
        if delta < timedelta(0):
            raise ValueError("the clock only moves forward")
        with self._lock:
            self._offset += delta


_MODIFIER = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?)\s+(second|minute|hour|day)s?\s*$")
_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86_400.0}


def _sqlite_format(fmt: str, when: datetime) -> str:
    # The subset of SQLite's strftime specifiers (https://sqlite.org/lang_datefunc.html)
    # that date/time text needs; anything else fails loudly rather than silently.
    parts: list[str] = []
    i = 0
    while i < len(fmt):
        char = fmt[i]
        if char != "%":
            parts.append(char)
            i += 1
            continue
        spec = fmt[i + 1 : i + 2]
        i += 2
        match spec:
            case "Y":
                parts.append(f"{when.year:04d}")
            case "m":
                parts.append(f"{when.month:02d}")
            case "d":
                parts.append(f"{when.day:02d}")
            case "H":
                parts.append(f"{when.hour:02d}")
            case "M":
                parts.append(f"{when.minute:02d}")
            case "S":
                parts.append(f"{when.second:02d}")
            case "f":  # SS.SSS: SQLite's clock has millisecond precision
                parts.append(f"{when.second:02d}.{when.microsecond // 1000:03d}")
            case "s":
                parts.append(str(int(when.timestamp())))
            case "%":
                parts.append("%")
            case _:
                raise ValueError(f"test kit strftime: unsupported specifier %{spec}")
    return "".join(parts)


def virtual_strftime(clock: VirtualClock, fmt: str, timestring: str, *modifiers: str) -> str:
    """``strftime`` for the kit's connections: ``'now'`` is the virtual clock."""
    if timestring == "now":
        when = clock.now()
    else:
        when = datetime.fromisoformat(timestring)
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    for modifier in modifiers:
        found = _MODIFIER.match(modifier)
        if found is None:
            raise ValueError(f"test kit strftime: unsupported modifier {modifier!r}")
        when += timedelta(seconds=float(found[1]) * _UNITS[found[2]])
    return _sqlite_format(fmt, when)


def install_clock(engine: AsyncEngine, clock: VirtualClock) -> None:
    """Make every new connection of ``engine`` (SQLite) read ``clock`` for ``'now'``."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.create_function("strftime", -1, functools.partial(virtual_strftime, clock))
