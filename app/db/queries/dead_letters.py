"""Queries on ``dead_letters``: one row per terminal failure, requeueable later."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import RowMapping, and_, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.ids import new_uuid7
from app.db.dialect import now_expr
from app.db.tables import dead_letters


async def insert_dead_letter(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    workflow: str,
    reason: str,
    error: str | None,
) -> uuid.UUID:
    """Write a pending dead letter for a failed run; returns its id."""
    dead_letter_id = new_uuid7()
    await conn.execute(
        insert(dead_letters).values(
            dead_letter_id=dead_letter_id,
            run_id=run_id,
            tenant_id=tenant_id,
            workflow=workflow,
            reason=reason,
            error=error,
            status="pending",
            created_at=now_expr(conn.dialect.name),
        )
    )
    return dead_letter_id


async def list_for_run(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID
) -> Sequence[RowMapping]:
    """Every dead letter of one of the tenant's runs (the run's own tenant), oldest first."""
    stmt = (
        select(dead_letters)
        .where(dead_letters.c.run_id == run_id, dead_letters.c.tenant_id == tenant_id)
        .order_by(dead_letters.c.created_at)
    )
    return (await conn.execute(stmt)).mappings().all()


async def lock_for_requeue(
    conn: AsyncConnection, *, tenant_id: str, dead_letter_id: uuid.UUID
) -> RowMapping | None:
    """Read a tenant's dead letter and lock it until the transaction ends (None if absent).

    Locked (PostgreSQL ``FOR UPDATE``; SQLite: the write lock) so a concurrent requeue
    waits here and then sees ``requeued``, even if the run has failed again in between.
    """
    stmt = select(dead_letters).where(
        dead_letters.c.dead_letter_id == dead_letter_id, dead_letters.c.tenant_id == tenant_id
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return (await conn.execute(stmt)).mappings().first()


async def pending_for_run(conn: AsyncConnection, run_id: uuid.UUID) -> RowMapping | None:
    """The run's pending dead letter, if any (a failed run has exactly one)."""
    stmt = select(dead_letters).where(
        dead_letters.c.run_id == run_id, dead_letters.c.status == "pending"
    )
    return (await conn.execute(stmt)).mappings().first()


async def mark_requeued(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    dead_letter_id: uuid.UUID,
    actor: str,
    reason: str,
    correlation_id: str | None,
) -> RowMapping:
    """Record the requeue audit (who, why, correlation id) and return the updated row.

    ``tenant_id`` is the run's: both statements find the row by the tenant-leading key
    ``(tenant_id, dead_letter_id)`` (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    """
    mine = and_(
        dead_letters.c.tenant_id == tenant_id, dead_letters.c.dead_letter_id == dead_letter_id
    )
    await conn.execute(
        update(dead_letters)
        .where(mine)
        .values(
            status="requeued",
            requeued_at=now_expr(conn.dialect.name),
            requeued_by=actor,
            requeue_reason=reason,
            correlation_id=correlation_id,
        )
    )
    stmt = select(dead_letters).where(mine)
    return (await conn.execute(stmt)).mappings().one()
