"""Queries on ``approval_decisions``: one row per approver and approval."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import RowMapping, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.tables import approval_decisions


async def insert_decision(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    step_id: str,
    tenant_id: str,
    decided_by: str,
    decision: str,
    payload: str | None,
    comment: str | None,
) -> bool:
    """Record one approver's decision; False if this approver already decided."""
    dialect = conn.dialect.name
    ins = (postgresql if dialect == "postgresql" else sqlite).insert(approval_decisions)
    stmt = (
        ins.values(
            run_id=run_id,
            step_id=step_id,
            tenant_id=tenant_id,
            decided_by=decided_by,
            decision=decision,
            payload=payload,
            comment=comment,
            decided_at=now_expr(dialect),
        )
        .on_conflict_do_nothing(index_elements=["run_id", "step_id", "decided_by"])
        .returning(approval_decisions.c.decided_by)
    )
    return (await conn.execute(stmt)).first() is not None


async def list_decisions(
    conn: AsyncConnection, run_id: uuid.UUID, step_id: str | None = None
) -> Sequence[RowMapping]:
    """Decisions on a run's approvals (one approval if ``step_id``), in decision order."""
    stmt = select(approval_decisions).where(approval_decisions.c.run_id == run_id)
    if step_id is not None:
        stmt = stmt.where(approval_decisions.c.step_id == step_id)
    stmt = stmt.order_by(approval_decisions.c.decided_at, approval_decisions.c.decided_by)
    return (await conn.execute(stmt)).mappings().all()
