"""Queries on ``signals``: buffered per run and name, each consumed exactly once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import RowMapping, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.tables import signals


async def insert_signal(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    name: str,
    payload: str | None,
    sent_by: str,
) -> int:
    """Buffer a signal; returns its id (ids order signals of one run)."""
    result = await conn.execute(
        insert(signals)
        .values(
            run_id=run_id,
            tenant_id=tenant_id,
            name=name,
            payload=payload,
            sent_by=sent_by,
            received_at=now_expr(conn.dialect.name),
        )
        .returning(signals.c.signal_id)
    )
    return int(result.scalar_one())


async def oldest_unconsumed(
    conn: AsyncConnection, run_id: uuid.UUID, name: str, *, tenant_id: str
) -> RowMapping | None:
    """The oldest buffered, unconsumed signal of this name for the tenant's run."""
    stmt = (
        select(signals)
        .where(
            signals.c.tenant_id == tenant_id,
            signals.c.run_id == run_id,
            signals.c.name == name,
            signals.c.consumed_step_id.is_(None),
        )
        .order_by(signals.c.signal_id)
        .limit(1)
    )
    return (await conn.execute(stmt)).mappings().first()


async def consume(conn: AsyncConnection, signal_id: int, step_id: str, *, tenant_id: str) -> bool:
    """Mark a signal consumed by ``step_id``; False if something else consumed it first.

    ``tenant_id`` is the consuming run's (the signal's own): it keys the statement to it.
    """
    result = await conn.execute(
        update(signals)
        .where(
            signals.c.tenant_id == tenant_id,
            signals.c.signal_id == signal_id,
            signals.c.consumed_step_id.is_(None),
        )
        .values(consumed_step_id=step_id, consumed_at=now_expr(conn.dialect.name))
    )
    return result.rowcount == 1


async def list_for_run(conn: AsyncConnection, run_id: uuid.UUID) -> Sequence[RowMapping]:
    """Every signal sent to a run, oldest first."""
    stmt = select(signals).where(signals.c.run_id == run_id).order_by(signals.c.signal_id)
    return (await conn.execute(stmt)).mappings().all()


async def count_buffered(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> int:
    """Signals sent to a tenant's run and not yet consumed (the buffered-signals ceiling)."""
    stmt = select(func.count()).where(
        signals.c.tenant_id == tenant_id,
        signals.c.run_id == run_id,
        signals.c.consumed_step_id.is_(None),
    )
    return int((await conn.execute(stmt)).scalar_one())
