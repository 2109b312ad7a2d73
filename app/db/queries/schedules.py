"""Queries on ``schedules`` and ``schedule_fires``.

Every query on one schedule or its fires filters on ``tenant_id`` as well as the id, so it
is served by the tenant-leading keys (revision 0024, docs/adr/0034-tenant-leading-keys.md)
and would route to one shard on Citus. Only the scheduler's two scans for due work
(:func:`due_schedules`) are across tenants, because one scheduler loop serves the whole
database; they return ``(tenant_id, schedule_id)`` so the pass that follows is keyed too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, delete, or_, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import ScheduleNameTaken, ScheduleNotFound
from app.core.status import TERMINAL_RUN_STATUSES
from app.db.dialect import now_expr
from app.db.tables import runs, schedule_fires, schedules

_TERMINAL = [s.value for s in TERMINAL_RUN_STATUSES]


def _insert(conn: AsyncConnection, table: Any) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)


async def insert_schedule(conn: AsyncConnection, values: dict[str, Any]) -> RowMapping:
    """Insert a schedule (``created_at``/``updated_at`` from the database clock).

    Raises:
        ScheduleNameTaken: the tenant already has a schedule with this name (409).
    """
    now = now_expr(conn.dialect.name)
    stmt = (
        _insert(conn, schedules)
        .values({**values, "created_at": now, "updated_at": now})
        .on_conflict_do_nothing(index_elements=["tenant_id", "name"])
        .returning(*schedules.c)
    )
    row = (await conn.execute(stmt)).mappings().first()
    if row is None:
        raise ScheduleNameTaken(
            f"a schedule named {values['name']!r} already exists", name=values["name"]
        )
    return row


def visible_to(owner: str | None) -> Any:
    """SQL condition: the schedule's access policy lets ``owner`` see and change it.

    An ``access='owner'`` schedule (its workflow is owner-policy) belongs to the subject
    that created it, whose name its runs are started in; None (the scheduler, admins)
    ignores the policy. The rule of runs (app/db/queries/runs.py ``visible_to``).
    """
    if owner is None:
        return true()
    return or_(schedules.c.access == "tenant", schedules.c.created_by == owner)


async def get_schedule(
    conn: AsyncConnection,
    tenant_id: str,
    schedule_id: uuid.UUID,
    *,
    lock: bool = False,
    owner: str | None = None,
) -> RowMapping:
    """Return one schedule of this tenant (``lock``: ``FOR UPDATE`` on PostgreSQL).

    ``owner``: the caller's subject (None for admins): another subject's owner-policy
    schedule is not found.

    Raises:
        ScheduleNotFound: no such schedule *for this tenant* (another tenant's id, or
            another subject's owner-policy schedule, too: the same 404).
    """
    stmt = select(schedules).where(
        schedules.c.schedule_id == schedule_id,
        schedules.c.tenant_id == tenant_id,
        visible_to(owner),
    )
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).mappings().first()
    if row is None:
        raise ScheduleNotFound(f"schedule {schedule_id} not found", schedule_id=str(schedule_id))
    return row


async def list_schedules(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    workflow: str | None,
    state: str | None,
    before_id: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> Sequence[RowMapping]:
    """A tenant's schedules visible to ``owner``, newest first, keyset on the UUIDv7 id."""
    stmt = select(schedules).where(schedules.c.tenant_id == tenant_id, visible_to(owner))
    if workflow is not None:
        stmt = stmt.where(schedules.c.workflow == workflow)
    if state is not None:
        stmt = stmt.where(schedules.c.state == state)
    if before_id is not None:
        stmt = stmt.where(schedules.c.schedule_id < before_id)
    stmt = stmt.order_by(schedules.c.schedule_id.desc()).limit(limit)
    return (await conn.execute(stmt)).mappings().all()


async def update_schedule(
    conn: AsyncConnection, tenant_id: str, schedule_id: uuid.UUID, values: dict[str, Any]
) -> RowMapping:
    """Update one schedule of this tenant (``updated_at`` from the database clock).

    The caller has just read (and on PostgreSQL locked) the row, so it exists.

    Returns:
        The new row.

    Raises:
        ScheduleNameTaken: a rename collides with another schedule of the tenant (409).
    """
    stmt = (
        update(schedules)
        .where(schedules.c.tenant_id == tenant_id, schedules.c.schedule_id == schedule_id)
        .values({**values, "updated_at": now_expr(conn.dialect.name)})
        .returning(*schedules.c)
    )
    try:
        async with conn.begin_nested():
            return (await conn.execute(stmt)).mappings().one()
    except IntegrityError as exc:
        # PostgreSQL names the constraint; SQLite names its columns (and would name
        # ``schedules.tenant_id, schedules.schedule_id`` for the primary key).
        message = str(exc.orig)
        if (
            "uq_schedules_tenant_id_name" in message
            or "schedules.tenant_id, schedules.name" in message
        ):
            raise ScheduleNameTaken(
                f"a schedule named {values.get('name')!r} already exists", name=values.get("name")
            ) from None
        raise


async def delete_schedule(
    conn: AsyncConnection, tenant_id: str, schedule_id: uuid.UUID, *, owner: str | None = None
) -> None:
    """Delete a schedule and its fire records (runs it started are kept).

    Raises:
        ScheduleNotFound: not this tenant's schedule (or not visible to ``owner``).
    """
    result = await conn.execute(
        delete(schedules).where(
            schedules.c.schedule_id == schedule_id,
            schedules.c.tenant_id == tenant_id,
            visible_to(owner),
        )
    )
    if result.rowcount == 0:
        raise ScheduleNotFound(f"schedule {schedule_id} not found", schedule_id=str(schedule_id))


ScheduleKey = tuple[str, uuid.UUID]
"""``(tenant_id, schedule_id)``: the primary key of a schedule (revision 0024)."""


async def due_schedules(conn: AsyncConnection, *, now: datetime, limit: int) -> list[ScheduleKey]:
    """Active schedules whose next fire time has come, or that hold a buffered tick.

    Across tenants (one scheduler loop serves them all): the due ones through the partial
    index ``ix_schedules_due``, oldest fire time first; those holding a ``buffer_one`` tick
    through ``ix_schedules_buffered``. Each at most ``limit``.

    Returns:
        ``(tenant_id, schedule_id)`` keys, due ones first, without repeats.
    """
    key = (schedules.c.tenant_id, schedules.c.schedule_id)
    due = (
        select(*key)
        .where(schedules.c.state == "active", schedules.c.next_fire_at <= now)
        .order_by(schedules.c.next_fire_at)
        .limit(limit)
    )
    buffered = (
        select(*key)
        .where(schedules.c.state == "active", schedules.c.buffered_tick_at.is_not(None))
        .limit(limit)
    )
    keys: list[ScheduleKey] = [(t, s) for t, s in (await conn.execute(due)).all()]
    for tenant_id, schedule_id in (await conn.execute(buffered)).all():
        if (tenant_id, schedule_id) not in keys:
            keys.append((tenant_id, schedule_id))
    return keys


async def lock_for_pass(
    conn: AsyncConnection, tenant_id: str, schedule_id: uuid.UUID
) -> RowMapping | None:
    """Lock one active schedule for a scheduler pass, or None if another pass holds it.

    PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so racing scheduler loops spread over
    schedules instead of queueing on one row. SQLite: the write transaction
    (``BEGIN IMMEDIATE``) already serialises passes. Neither lock is what guarantees a tick
    fires once: the ``schedule_fires`` primary key is (see :func:`insert_fire`).
    """
    stmt = select(schedules).where(
        schedules.c.tenant_id == tenant_id,
        schedules.c.schedule_id == schedule_id,
        schedules.c.state == "active",
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return (await conn.execute(stmt)).mappings().first()


async def open_run_ids(
    conn: AsyncConnection, tenant_id: str, schedule_id: uuid.UUID
) -> list[uuid.UUID]:
    """Runs started by this schedule that have not reached a terminal status, oldest first."""
    # The join names the tenant on both sides: a run a schedule started is its tenant's,
    # and a join on the distribution column is what stays on one shard.
    stmt = (
        select(schedule_fires.c.run_id)
        .join(
            runs,
            (runs.c.run_id == schedule_fires.c.run_id)
            & (runs.c.tenant_id == schedule_fires.c.tenant_id),
        )
        .where(
            schedule_fires.c.tenant_id == tenant_id,
            schedule_fires.c.schedule_id == schedule_id,
            runs.c.status.not_in(_TERMINAL),
        )
        .order_by(schedule_fires.c.tick)
    )
    return list((await conn.execute(stmt)).scalars().all())


async def insert_fire(
    conn: AsyncConnection,
    *,
    schedule_id: uuid.UUID,
    tenant_id: str,
    tick: datetime,
    kind: str,
    outcome: str,
    fired_at: datetime,
    fired_by: str,
    error: str | None = None,
) -> bool:
    """Record that ``tick`` fired; False if it already had (someone else fired it).

    ``ON CONFLICT DO NOTHING`` on the ``(tenant_id, schedule_id, tick)`` primary key: of
    any number of processes trying to fire one tick, exactly one inserts, whatever they
    believed (a schedule's tenant never changes, so the key is as narrow as the tick).
    """
    stmt = (
        _insert(conn, schedule_fires)
        .values(
            schedule_id=schedule_id,
            tenant_id=tenant_id,
            tick=tick,
            kind=kind,
            outcome=outcome,
            fired_at=fired_at,
            fired_by=fired_by,
            error=error,
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "schedule_id", "tick"])
    )
    result = await conn.execute(stmt)
    return bool(result.rowcount)


async def set_fire(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    schedule_id: uuid.UUID,
    tick: datetime,
    outcome: str,
    run_id: uuid.UUID | None = None,
    error: str | None = None,
    only_if_outcome: str | None = None,
) -> bool:
    """Update a fire record; with ``only_if_outcome``, only from that outcome.

    Returns:
        True if a row changed (used to start a buffered tick exactly once).
    """
    stmt = update(schedule_fires).where(
        schedule_fires.c.tenant_id == tenant_id,
        schedule_fires.c.schedule_id == schedule_id,
        schedule_fires.c.tick == tick,
    )
    if only_if_outcome is not None:
        stmt = stmt.where(schedule_fires.c.outcome == only_if_outcome)
    result = await conn.execute(stmt.values(outcome=outcome, run_id=run_id, error=error))
    return bool(result.rowcount)


async def get_fire(
    conn: AsyncConnection, tenant_id: str, schedule_id: uuid.UUID, tick: datetime
) -> RowMapping:
    """One fire record of this tenant's schedule (it must exist: the caller just wrote it)."""
    stmt = select(schedule_fires).where(
        schedule_fires.c.tenant_id == tenant_id,
        schedule_fires.c.schedule_id == schedule_id,
        schedule_fires.c.tick == tick,
    )
    return (await conn.execute(stmt)).mappings().one()


async def list_fires(
    conn: AsyncConnection,
    tenant_id: str,
    schedule_id: uuid.UUID,
    *,
    before_tick: datetime | None,
    limit: int,
) -> Sequence[RowMapping]:
    """A schedule's fire records, newest tick first (keyset on the tick).

    The caller has checked the schedule is the tenant's (and visible to it): ``tenant_id``
    here is what keeps the read on the primary key.
    """
    stmt = select(schedule_fires).where(
        schedule_fires.c.tenant_id == tenant_id, schedule_fires.c.schedule_id == schedule_id
    )
    if before_tick is not None:
        stmt = stmt.where(schedule_fires.c.tick < before_tick)
    stmt = stmt.order_by(schedule_fires.c.tick.desc()).limit(limit)
    return (await conn.execute(stmt)).mappings().all()
