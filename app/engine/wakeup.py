"""Waking workers when a transaction makes a run claimable (PostgreSQL LISTEN/NOTIFY)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.wakeups import NOTIFY_CHANNEL

__all__ = ["NOTIFY_CHANNEL", "notify"]


async def notify(conn: AsyncConnection) -> None:
    """Wake listening workers when this transaction commits (PostgreSQL NOTIFY).

    A no-op on SQLite, where workers poll. NOTIFY is transactional: a rolled-back
    transaction wakes nobody. The commit then takes PostgreSQL's global notification
    lock, so the hot submit path uses the coalescer instead
    (:meth:`app.db.database.Database.wake_workers`, docs/adr/0037-coalesced-wake-ups.md);
    this transactional form stays for rarer sites whose wake-up must not precede their
    commit's other effects and cost one NOTIFY per user action.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_notify(:c, '')"), {"c": NOTIFY_CHANNEL})
