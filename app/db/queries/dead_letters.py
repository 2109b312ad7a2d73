"""Queries on ``dead_letters``: one row per terminal failure, requeueable later."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import RowMapping, insert, select
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
