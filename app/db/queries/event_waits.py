"""A waiting run's own side of its ``ctx.wait_for_event`` mailbox (``event_waits``).

Written only under the run's lease, by the journal
(:class:`app.engine.wait_journal.WaitJournal`, docs/adr/0038-one-writer-of-leased-run-state.md):
the mailbox opened with its wait, the look-back's exclusions, a timeout. What a post does
to a mailbox (finding open waits, delivering into one) is in
:mod:`app.db.queries.inbound_events`, beside the events themselves
(docs/adr/0029-event-triggers.md).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ColumnElement, RowMapping, and_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import event_waits


async def insert_wait(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    step_id: str,
    tenant_id: str,
    name: str,
    match: str,
    since: datetime,
) -> None:
    """Open a run's mailbox for one ``ctx.wait_for_event`` (status ``waiting``)."""
    await conn.execute(
        event_waits.insert().values(
            run_id=run_id,
            step_id=step_id,
            tenant_id=tenant_id,
            name=name,
            match=match,
            since=since,
            status="waiting",
        )
    )


async def get_wait(
    conn: AsyncConnection, run_id: uuid.UUID, step_id: str, *, tenant_id: str
) -> RowMapping | None:
    """One wait's mailbox row."""
    stmt = select(event_waits).where(
        event_waits.c.tenant_id == tenant_id,
        event_waits.c.run_id == run_id,
        event_waits.c.step_id == step_id,
    )
    return (await conn.execute(stmt)).mappings().first()


def still_waiting(tenant_id: str, run_id: uuid.UUID, step_id: str) -> ColumnElement[bool]:
    """The condition ``WHERE`` one mailbox is still ``waiting``.

    Both compare-and-sets that decide a wait test it: :func:`time_out` here, ``deliver``
    in :mod:`app.db.queries.inbound_events`.
    """
    return and_(
        event_waits.c.tenant_id == tenant_id,
        event_waits.c.run_id == run_id,
        event_waits.c.step_id == step_id,
        event_waits.c.status == "waiting",
    )


async def time_out(
    conn: AsyncConnection, run_id: uuid.UUID, step_id: str, *, tenant_id: str
) -> bool:
    """Close a waiting mailbox as ``timed_out``; False if an event was delivered first."""
    result = await conn.execute(
        update(event_waits)
        .where(still_waiting(tenant_id, run_id, step_id))
        .values(status="timed_out")
    )
    return result.rowcount == 1


async def delivered_to_run(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str
) -> set[uuid.UUID]:
    """Ids of the events already delivered to one of the run's waits (each at most once)."""
    stmt = select(event_waits.c.event_id).where(
        event_waits.c.tenant_id == tenant_id,
        event_waits.c.run_id == run_id,
        event_waits.c.event_id.is_not(None),
    )
    return {row[0] for row in (await conn.execute(stmt)).all()}
