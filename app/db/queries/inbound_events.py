"""Queries on ``inbound_events`` and a post's side of ``event_waits`` (docs/adr/0029).

``inbound_events`` holds what ``POST /events`` recorded; ``event_waits`` the mailbox of
each ``ctx.wait_for_event``. A post and a wait that starts meet under one lock per
(tenant, event name), :func:`lock_name`, so each sees what the other committed. The
waiting run's own mailbox writes (open, time out) are in :mod:`app.db.queries.event_waits`,
called by the journal only.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import RowMapping, exists, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.queries.event_waits import still_waiting
from app.db.queries.runs import visible_to
from app.db.tables import event_waits, inbound_events, runs, workflow_definitions


def name_lock_id(tenant_id: str, name: str) -> int:
    """The PostgreSQL advisory-lock id of one (tenant, event name): signed 64-bit BLAKE2b."""
    digest = hashlib.blake2b(
        "\x1f".join(("treadle-event-name", tenant_id, name)).encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


async def lock_name(conn: AsyncConnection, tenant_id: str, name: str) -> None:
    """Serialise posts of, and waits starting on, one event name until the transaction ends.

    PostgreSQL: ``pg_advisory_xact_lock`` on :func:`name_lock_id`; every later statement
    (READ COMMITTED) sees what earlier holders committed, so a post sees every wait that
    started before it and a wait sees every event posted before it. SQLite: the
    ``BEGIN IMMEDIATE`` write lock already serialises both.
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(:k)"), {"k": name_lock_id(tenant_id, name)}
        )


async def insert_event(
    conn: AsyncConnection,
    *,
    event_id: uuid.UUID,
    tenant_id: str,
    name: str,
    data: str,
    key: str | None,
    request_hash: str,
    sent_by: str,
    sent_by_admin: bool,
) -> RowMapping | None:
    """Record a posted event; None when its ``key`` is already taken in the tenant.

    ``sent_by_admin``: the sender holds ``admin`` (kept for the look-back of waits that
    start later: the owner policy). ``started_run_ids`` starts as ``[]``
    (:func:`set_started` fills it in the same transaction).
    """
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = (
        dialect.insert(inbound_events)
        .values(
            event_id=event_id,
            tenant_id=tenant_id,
            name=name,
            data=data,
            key=key,
            request_hash=request_hash,
            sent_by=sent_by,
            sent_by_admin=int(sent_by_admin),
            received_at=now_expr(conn.dialect.name),
            started_run_ids="[]",
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "key"])
        .returning(*inbound_events.c)
    )
    return (await conn.execute(stmt)).mappings().first()


async def set_started(conn: AsyncConnection, event_id: uuid.UUID, started_run_ids: str) -> None:
    """Store the JSON list of run ids the event's triggers started."""
    await conn.execute(
        update(inbound_events)
        .where(inbound_events.c.event_id == event_id)
        .values(started_run_ids=started_run_ids)
    )


async def get_by_key(conn: AsyncConnection, tenant_id: str, key: str) -> RowMapping | None:
    """The tenant's event posted with this idempotency key (unique per tenant)."""
    stmt = select(inbound_events).where(
        inbound_events.c.tenant_id == tenant_id, inbound_events.c.key == key
    )
    return (await conn.execute(stmt)).mappings().first()


async def get_event(
    conn: AsyncConnection, tenant_id: str, event_id: uuid.UUID
) -> RowMapping | None:
    """One of the tenant's events (None for an unknown id or another tenant's)."""
    stmt = select(inbound_events).where(
        inbound_events.c.tenant_id == tenant_id, inbound_events.c.event_id == event_id
    )
    return (await conn.execute(stmt)).mappings().first()


async def list_events(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    name: str | None,
    before_event_id: uuid.UUID | None,
    limit: int,
) -> Sequence[RowMapping]:
    """The tenant's events newest first, keyset-paged on the UUIDv7 event id."""
    stmt = select(inbound_events).where(inbound_events.c.tenant_id == tenant_id)
    if name is not None:
        stmt = stmt.where(inbound_events.c.name == name)
    if before_event_id is not None:
        stmt = stmt.where(inbound_events.c.event_id < before_event_id)
    stmt = stmt.order_by(inbound_events.c.event_id.desc()).limit(limit)
    return (await conn.execute(stmt)).mappings().all()


async def events_since(
    conn: AsyncConnection,
    tenant_id: str,
    name: str,
    *,
    since: datetime,
    after_event_id: uuid.UUID | None,
    limit: int,
) -> Sequence[RowMapping]:
    """A page of the tenant's events of ``name`` received at or after ``since``, oldest first.

    Served by ``ix_inbound_events_tenant_id_name_event_id``; ``after_event_id`` pages on.
    """
    stmt = select(inbound_events).where(
        inbound_events.c.tenant_id == tenant_id,
        inbound_events.c.name == name,
        inbound_events.c.received_at >= since,
    )
    if after_event_id is not None:
        stmt = stmt.where(inbound_events.c.event_id > after_event_id)
    stmt = stmt.order_by(inbound_events.c.event_id).limit(limit)
    return (await conn.execute(stmt)).mappings().all()


async def trigger_definitions(conn: AsyncConnection, name: str) -> Sequence[RowMapping]:
    """Every version of every workflow with some version declaring ``on_event=name``.

    All versions, not only the triggering ones: the caller picks each workflow's version
    as a submit without a pinned version would (the latest) and starts it only if that
    version declares the trigger.
    """
    named = (
        select(workflow_definitions.c.name)
        .where(workflow_definitions.c.on_event == name)
        .scalar_subquery()
    )
    stmt = (
        select(workflow_definitions)
        .where(workflow_definitions.c.name.in_(named))
        .order_by(workflow_definitions.c.name)
    )
    return (await conn.execute(stmt)).mappings().all()


async def open_waits(
    conn: AsyncConnection, tenant_id: str, name: str, *, owner: str | None
) -> Sequence[RowMapping]:
    """The tenant's waits on ``name`` still ``waiting`` in runs ``owner`` may act on.

    ``owner`` is the sender's owner filter (None: an admin, every run): another
    subject's ``access="owner"`` runs are left out, as a signal to them is ``404``
    (:func:`app.db.queries.runs.visible_to`, docs/security.md). By run then step; served
    by ``ix_event_waits_tenant_id_name_status`` (and the runs key for the policy).
    """
    stmt = (
        select(event_waits)
        .where(
            event_waits.c.tenant_id == tenant_id,
            event_waits.c.name == name,
            event_waits.c.status == "waiting",
        )
        .order_by(event_waits.c.run_id, event_waits.c.step_id)
    )
    if owner is not None:
        stmt = stmt.where(
            exists().where(
                runs.c.tenant_id == event_waits.c.tenant_id,
                runs.c.run_id == event_waits.c.run_id,
                visible_to(owner),
            )
        )
    return (await conn.execute(stmt)).mappings().all()


async def deliver(
    conn: AsyncConnection, run_id: uuid.UUID, step_id: str, event_id: uuid.UUID, *, tenant_id: str
) -> bool:
    """Deliver an event into a waiting mailbox; False if it was no longer ``waiting``.

    The one compare-and-set that decides a wait: a timeout
    (:func:`app.db.queries.event_waits.time_out`) or another event racing this one finds
    the row changed (PostgreSQL re-checks the condition on the row once the competing
    writer commits). A post delivers with it, and so does a starting wait's look-back.
    """
    result = await conn.execute(
        update(event_waits)
        .where(still_waiting(tenant_id, run_id, step_id))
        .values(status="delivered", event_id=event_id, delivered_at=now_expr(conn.dialect.name))
    )
    return result.rowcount == 1


async def deliveries(
    conn: AsyncConnection, tenant_id: str, event_id: uuid.UUID
) -> Sequence[RowMapping]:
    """The waits an event was delivered to (by run then step), for ``GET /events/{id}``."""
    stmt = (
        select(event_waits)
        .where(event_waits.c.tenant_id == tenant_id, event_waits.c.event_id == event_id)
        .order_by(event_waits.c.run_id, event_waits.c.step_id)
    )
    return (await conn.execute(stmt)).mappings().all()


async def visible_run_ids(
    conn: AsyncConnection, tenant_id: str, run_ids: Sequence[uuid.UUID], owner: str | None
) -> set[uuid.UUID]:
    """Which of the tenant's ``run_ids`` the subject ``owner`` may see (None: all).

    An event lists the runs it started and resumed; another subject's ``access="owner"``
    runs are left out, as every list leaves them out (docs/security.md).
    """
    if not run_ids or owner is None:
        return set(run_ids)
    stmt = select(runs.c.run_id).where(
        runs.c.tenant_id == tenant_id, runs.c.run_id.in_(list(run_ids)), visible_to(owner)
    )
    return {row[0] for row in (await conn.execute(stmt)).all()}
