"""Waking workers when a transaction makes a run claimable (PostgreSQL LISTEN/NOTIFY)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

NOTIFY_CHANNEL = "treadle_runs"
"""The channel workers LISTEN on; the payload is empty (a hint to claim, not a message)."""


async def notify(conn: AsyncConnection) -> None:
    """Wake listening workers when this transaction commits (PostgreSQL NOTIFY).

    A no-op on SQLite, where workers poll. NOTIFY is transactional: a rolled-back
    transaction wakes nobody.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_notify(:c, '')"), {"c": NOTIFY_CHANNEL})
