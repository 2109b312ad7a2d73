"""Queries on ``approval_decisions``: one row per approver and approval."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import RowMapping, and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.status import RunStatus, StepStatus
from app.db.dialect import now_expr
from app.db.queries.runs import visible_to
from app.db.tables import approval_decisions, runs, steps


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
        .on_conflict_do_nothing(index_elements=["tenant_id", "run_id", "step_id", "decided_by"])
        .returning(approval_decisions.c.decided_by)
    )
    return (await conn.execute(stmt)).first() is not None


async def list_decisions(
    conn: AsyncConnection, run_id: uuid.UUID, step_id: str | None = None, *, tenant_id: str
) -> Sequence[RowMapping]:
    """Decisions on a tenant's run's approvals (one approval if ``step_id``), in order."""
    stmt = select(approval_decisions).where(
        approval_decisions.c.tenant_id == tenant_id, approval_decisions.c.run_id == run_id
    )
    if step_id is not None:
        stmt = stmt.where(approval_decisions.c.step_id == step_id)
    stmt = stmt.order_by(approval_decisions.c.decided_at, approval_decisions.c.decided_by)
    return (await conn.execute(stmt)).mappings().all()


async def list_waiting(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    subject: str,
    owner: str | None,
    workflow: str | None,
    after: tuple[datetime, uuid.UUID, str] | None,
    limit: int,
) -> Sequence[RowMapping]:
    """Waiting approvals of the tenant's open runs that ``subject`` has not decided yet.

    Oldest waiting first, keyset-paged on ``(steps.created_at, run_id, step_id)`` (pass
    the last row's as ``after``). Each row has the step's columns, the run's ``workflow``,
    ``version``, ``created_by``, ``run_status``, ``run_reason``, and the counts
    ``approvals_given`` and ``rejections`` of its decisions so far. The walk starts from
    the open runs (``ix_runs_tenant_id_status_run_id``), not from every step of the
    tenant. Groups are not filtered here: they live in the step's JSON ``detail``.

    Args:
        conn: an open connection.
        tenant_id: the caller's tenant.
        subject: the caller: approvals it already decided are left out.
        owner: the subject owner-policy runs must belong to (None: all, for ``admin``).
        workflow: only runs of this workflow (None: all).
        after: the keyset position to continue after (None: from the oldest).
        limit: at most this many rows.
    """
    d = approval_decisions
    given = (
        select(func.count())
        .where(d.c.run_id == steps.c.run_id, d.c.step_id == steps.c.step_id)
        .where(d.c.decision == "approve")
        .scalar_subquery()
    )
    rejected = (
        select(func.count())
        .where(d.c.run_id == steps.c.run_id, d.c.step_id == steps.c.step_id)
        .where(d.c.decision == "reject")
        .scalar_subquery()
    )
    mine = (
        select(d.c.decided_by)
        .where(d.c.run_id == steps.c.run_id, d.c.step_id == steps.c.step_id)
        .where(d.c.decided_by == subject)
        .exists()
    )
    open_statuses = [s.value for s in RunStatus if not s.is_terminal]
    stmt = (
        select(
            steps,
            runs.c.workflow,
            runs.c.version,
            runs.c.created_by,
            runs.c.status.label("run_status"),
            runs.c.reason.label("run_reason"),
            given.label("approvals_given"),
            rejected.label("rejections"),
        )
        .select_from(
            runs.join(
                steps,
                and_(steps.c.tenant_id == runs.c.tenant_id, steps.c.run_id == runs.c.run_id),
            )
        )
        .where(
            runs.c.tenant_id == tenant_id,
            runs.c.status.in_(open_statuses),
            visible_to(owner),
            steps.c.kind == "approval",
            steps.c.status == StepStatus.WAITING.value,
            ~mine,
        )
    )
    if workflow is not None:
        stmt = stmt.where(runs.c.workflow == workflow)
    if after is not None:
        at, run_id, step_id = after
        stmt = stmt.where(
            or_(
                steps.c.created_at > at,
                and_(
                    steps.c.created_at == at,
                    or_(
                        steps.c.run_id > run_id,
                        and_(steps.c.run_id == run_id, steps.c.step_id > step_id),
                    ),
                ),
            )
        )
    stmt = stmt.order_by(steps.c.created_at, steps.c.run_id, steps.c.step_id).limit(limit)
    return (await conn.execute(stmt)).mappings().all()
