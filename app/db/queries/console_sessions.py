"""Queries on ``console_sessions``: the console's server-side sessions (docs/console.md).

Every deadline is compared with the database clock (``now_expr``), like leases, so API
processes with skewed clocks agree on when a session ended. A session is live while
``expires_at`` (absolute) is ahead and ``last_seen_at`` is within the idle timeout.
"""

from __future__ import annotations

from sqlalchemy import RowMapping, delete, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr, now_plus
from app.db.tables import console_sessions


async def insert_session(
    conn: AsyncConnection,
    *,
    id_hash: str,
    tenant_id: str,
    subject: str,
    token_ciphertext: str,
    csrf_token: str,
    absolute_seconds: float,
) -> None:
    """Create a session that ends ``absolute_seconds`` from now at the latest."""
    dialect = conn.dialect.name
    await conn.execute(
        insert(console_sessions).values(
            id_hash=id_hash,
            tenant_id=tenant_id,
            subject=subject,
            token_ciphertext=token_ciphertext,
            csrf_token=csrf_token,
            flash=None,
            created_at=now_expr(dialect),
            last_seen_at=now_expr(dialect),
            expires_at=now_plus(dialect, absolute_seconds),
        )
    )


async def touch_live_session(
    conn: AsyncConnection, id_hash: str, *, idle_seconds: float
) -> RowMapping | None:
    """Return a live session after moving its ``last_seen_at`` to now; None if ended.

    One statement: a session past either deadline is never refreshed back to life by the
    request that finds it.
    """
    dialect = conn.dialect.name
    stmt = (
        update(console_sessions)
        .where(
            console_sessions.c.id_hash == id_hash,
            console_sessions.c.expires_at > now_expr(dialect),
            console_sessions.c.last_seen_at > now_plus(dialect, -idle_seconds),
        )
        .values(last_seen_at=now_expr(dialect))
        .returning(*console_sessions.c)
    )
    return (await conn.execute(stmt)).mappings().first()


async def get_live_session(
    conn: AsyncConnection, id_hash: str, *, idle_seconds: float
) -> RowMapping | None:
    """Return a live session without moving its ``last_seen_at`` (None if ended).

    For the pages' background refreshes: a page left open in a tab must not keep its
    session alive past the idle timeout.
    """
    dialect = conn.dialect.name
    stmt = select(console_sessions).where(
        console_sessions.c.id_hash == id_hash,
        console_sessions.c.expires_at > now_expr(dialect),
        console_sessions.c.last_seen_at > now_plus(dialect, -idle_seconds),
    )
    return (await conn.execute(stmt)).mappings().first()


async def set_flash(conn: AsyncConnection, id_hash: str, flash: str | None) -> None:
    """Store (or, with None, clear) the session's one-shot message (JSON text)."""
    await conn.execute(
        update(console_sessions).where(console_sessions.c.id_hash == id_hash).values(flash=flash)
    )


async def take_flash(conn: AsyncConnection, id_hash: str) -> str | None:
    """Return the session's message and clear it (None when there is none)."""
    row = (
        await conn.execute(
            select(console_sessions.c.flash).where(console_sessions.c.id_hash == id_hash)
        )
    ).first()
    if row is None or row[0] is None:
        return None
    await set_flash(conn, id_hash, None)
    return str(row[0])


async def delete_session(conn: AsyncConnection, id_hash: str) -> bool:
    """End a session (sign-out); False if there was none."""
    result = await conn.execute(
        delete(console_sessions).where(console_sessions.c.id_hash == id_hash)
    )
    return bool(result.rowcount)


async def delete_ended(conn: AsyncConnection, *, idle_seconds: float, limit: int = 500) -> int:
    """Delete up to ``limit`` sessions past either deadline; return how many.

    Called on each sign-in, so the table holds little more than the live sessions
    without a maintenance job of its own.
    """
    dialect = conn.dialect.name
    ended = or_(
        console_sessions.c.expires_at <= now_expr(dialect),
        console_sessions.c.last_seen_at <= now_plus(dialect, -idle_seconds),
    )
    ids = select(console_sessions.c.id_hash).where(ended).limit(limit).scalar_subquery()
    result = await conn.execute(delete(console_sessions).where(console_sessions.c.id_hash.in_(ids)))
    return int(result.rowcount or 0)
