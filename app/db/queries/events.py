"""Queries on ``events``, each run's append-only timeline."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import RowMapping, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import EventKind
from app.db.dialect import now_expr
from app.db.tables import events


async def append(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    kind: EventKind,
    step_id: str | None = None,
    actor: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Append one event stamped with the database clock. Events are never updated."""
    await conn.execute(
        _append_stmt(conn.dialect.name),
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "kind": kind.value,
            "step_id": step_id,
            "actor": actor,
            "data": None if data is None else json.dumps(data),
        },
    )


@functools.cache
def _append_stmt(dialect: str) -> Any:
    # Twice per step attempt: built once per dialect (statement construction showed up
    # in worker profiles); the values arrive as execute() parameters.
    return insert(events).values(at=now_expr(dialect))


async def list_events(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID, *, after_id: int | None, limit: int
) -> Sequence[RowMapping]:
    """A page of a tenant's run's events, oldest first (keyset on ``event_id``).

    ``tenant_id`` is the run's own tenant (``run["tenant_id"]`` of the loaded run), which
    is not the caller's on an admin's ``?tenant=`` read.
    """
    stmt = select(events).where(events.c.run_id == run_id, events.c.tenant_id == tenant_id)
    if after_id is not None:
        stmt = stmt.where(events.c.event_id > after_id)
    return (await conn.execute(stmt.order_by(events.c.event_id).limit(limit))).mappings().all()


async def append_claims(
    conn: AsyncConnection, claimed: Sequence[RowMapping], *, worker_id: str
) -> None:
    """Record ``run_claimed`` for a batch of claimed runs in one multi-row INSERT."""
    # ``updated_at`` of a freshly claimed row is the database clock at claim time.
    await conn.execute(
        insert(events),
        [
            {
                "run_id": row["run_id"],
                "tenant_id": row["tenant_id"],
                "at": row["updated_at"],
                "kind": EventKind.RUN_CLAIMED.value,
                "step_id": None,
                "actor": None,
                "data": json.dumps(
                    {"worker_id": worker_id, "attempt": row["attempt"], "fence": row["fence"]}
                ),
            }
            for row in claimed
        ],
    )


async def count_for_run(conn: AsyncConnection, run_id: uuid.UUID) -> int:
    """Number of events in a run's timeline (range scan of ``ix_events_run_id_event_id``)."""
    stmt = select(func.count()).select_from(events).where(events.c.run_id == run_id)
    return int((await conn.execute(stmt)).scalar_one())
