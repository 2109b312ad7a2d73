"""Queries on ``events``, each run's append-only timeline."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, bindparam, case, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import EventKind
from app.db.dialect import now_expr
from app.db.tables import events, runs
from app.db.types import UtcDateTime


async def append(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    kind: EventKind,
    step_id: str | None = None,
    actor: str | None = None,
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    """Append one event stamped with the database clock (or ``at``, aware UTC).

    ``at`` is for an event recorded after the fact (the start of an attempt journaled
    once it finished, docs/adr/0040-one-commit-per-step.md). Events are never updated.
    """
    params: dict[str, Any] = {
        "run_id": run_id,
        "tenant_id": tenant_id,
        "kind": kind.value,
        "step_id": step_id,
        "actor": actor,
        "data": None if data is None else json.dumps(data),
    }
    if at is not None:
        params["b_at"] = at  # an INSERT refuses a parameter it does not consume
    await conn.execute(_append_stmt(conn.dialect.name, at is not None), params)


@functools.cache
def _append_stmt(dialect: str, at_given: bool) -> Any:
    # Twice per step attempt: built once per dialect (statement construction showed up
    # in worker profiles); the values arrive as execute() parameters.
    at = bindparam("b_at", type_=UtcDateTime()) if at_given else now_expr(dialect)
    return insert(events).values(at=at)


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


@dataclass(frozen=True, slots=True)
class Emit:
    """One ``ctx.emit`` waiting to be appended as an ``emitted`` event.

    Attributes:
        at: the database clock when it was made (estimated by the worker).
        data: the event's data as JSON object text (``{"name", "data", "attempt"}``).
        step_id: the step whose attempt emitted it, None for workflow code.
    """

    at: datetime
    data: str
    step_id: str | None


async def append_emits(
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, emits: Sequence[Emit]
) -> None:
    """Append ``emits`` as ``emitted`` events, in order, in one multi-row INSERT.

    Call inside a fenced write, after the fence check: the run row lock it takes is what
    keeps one run's event ids in commit order (every writer of a run's timeline holds
    it), so a follower reading ``event_id > cursor`` never skips a late commit
    (docs/adr/0028-live-event-streams.md).
    """
    if not emits:
        return
    await conn.execute(
        insert(events),
        [
            {
                "run_id": run_id,
                "tenant_id": tenant_id,
                "at": emit.at,
                "kind": EventKind.EMITTED.value,
                "step_id": emit.step_id,
                "actor": None,
                "data": emit.data,
            }
            for emit in emits
        ],
    )


async def counts_for_run(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str
) -> tuple[int, int]:
    """``(events, emitted events)`` of a tenant's run's timeline, one range scan of its index."""
    emitted = func.coalesce(
        func.sum(case((events.c.kind == EventKind.EMITTED.value, 1), else_=0)), 0
    )
    stmt = (
        select(func.count(), emitted)
        .select_from(events)
        .where(events.c.tenant_id == tenant_id, events.c.run_id == run_id)
    )
    row = (await conn.execute(stmt)).one()
    return int(row[0]), int(row[1])


async def follow_position(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID
) -> tuple[str, str | None, int | None] | None:
    """The run's status, reason and highest event id, read in one statement; None if gone.

    What a follower polls (``GET /runs/{run_id}/events?follow=true``): the status is read
    before (or with) the events it then lists, so "terminal, and nothing after my cursor"
    means every event of the run was sent. The id is a backward scan of the events' key
    ``(tenant_id, run_id, event_id)`` (one index entry; SQLite's unique twin of it,
    revision 0027), the run a primary-key lookup.
    """
    top = (
        select(func.max(events.c.event_id))
        .where(events.c.tenant_id == tenant_id, events.c.run_id == run_id)
        .scalar_subquery()
    )
    stmt = select(runs.c.status, runs.c.reason, top).where(
        runs.c.run_id == run_id, runs.c.tenant_id == tenant_id
    )
    row = (await conn.execute(stmt)).one_or_none()
    if row is None:
        return None
    return str(row[0]), row[1], None if row[2] is None else int(row[2])


async def requeue_horizon(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> int:
    """The ``budget_seq`` of the run's latest ``dead_letter_requeued`` event; 0 if none.

    Where the budget of a requeued run's ``max_transitions`` begins (the requeue records
    it, docs/adr/0050-an-attempt-counts-when-it-starts.md). One backward scan of the
    run's events key, filtered by kind.
    """
    data = (
        await conn.execute(
            select(events.c.data)
            .where(
                events.c.tenant_id == tenant_id,
                events.c.run_id == run_id,
                events.c.kind == EventKind.DEAD_LETTER_REQUEUED.value,
            )
            .order_by(events.c.event_id.desc())
            .limit(1)
        )
    ).scalar_one_or_none()
    loaded = json.loads(data) if data else None
    return int(loaded.get("budget_seq", 0)) if isinstance(loaded, dict) else 0
