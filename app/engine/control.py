"""Operator controls on runs: cancel."""

from __future__ import annotations

import uuid

from sqlalchemy import RowMapping

from app.core.errors import RunFinished
from app.core.status import EventKind, RunStatus
from app.db.database import Database
from app.db.queries import events as events_q
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q


async def cancel(
    db: Database, *, tenant_id: str, run_id: uuid.UUID, actor: str, reason: str | None
) -> RowMapping:
    """Cancel a run: ``cancelled`` / ``canceled_by_request``, with its fence advanced.

    A worker executing it can never commit again: it stops at its next checkpoint or
    heartbeat.

    Returns:
        The run row after the call. Cancelling a cancelled run is idempotent.

    Raises:
        RunNotFound: not this tenant's run.
        RunFinished: the run already finished otherwise (409).
    """
    async with db.write() as conn:
        await runs_q.get_run(conn, tenant_id, run_id)  # 404 for other tenants
        if await runs_q.cancel_run(conn, run_id=run_id, tenant_id=tenant_id):
            await steps_q.cancel_running(conn, run_id)
            await events_q.append(
                conn,
                run_id=run_id,
                tenant_id=tenant_id,
                kind=EventKind.RUN_CANCELLED,
                actor=actor,
                data={"reason": reason},
            )
        row = await runs_q.get_run(conn, tenant_id, run_id)
    if row["status"] != RunStatus.CANCELLED.value:
        raise RunFinished(
            f"run {run_id} already finished with status {row['status']!r}",
            run_id=str(run_id),
            run_status=row["status"],
        )
    return row
