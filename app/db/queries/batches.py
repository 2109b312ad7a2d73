"""Durable batches of bulk run actions: creation, claim with a fenced lease, chunk progress.

docs/adr/0023-durable-batches.md. The runs a batch acts on are fixed in ``batch_items``
when it is created; a worker leases the batch (``fence`` advanced on every claim, so a
worker whose lease expired can never commit a chunk again) and walks its items in
``run_id`` order behind ``batches.cursor``, each chunk's actions and its progress update in
one transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, bindparam, func, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.queries.run_filters import RunListFilters, list_filters
from app.db.queries.runs import visible_to
from app.db.tables import batch_items, batches, runs


async def count_matching(
    conn: AsyncConnection, tenant_id: str, filters: RunListFilters, *, owner: str | None
) -> int:
    """How many of the tenant's runs (visible to ``owner``) the ``GET /runs`` filters match."""
    stmt = (
        select(func.count()).select_from(runs).where(*list_filters(tenant_id, filters, owner=owner))
    )
    return int((await conn.execute(stmt)).scalar_one())


async def sample_matching(
    conn: AsyncConnection,
    tenant_id: str,
    filters: RunListFilters,
    *,
    owner: str | None,
    limit: int,
) -> list[uuid.UUID]:
    """Up to ``limit`` matching run ids, oldest first (the order a batch acts in)."""
    stmt = (
        select(runs.c.run_id)
        .where(*list_filters(tenant_id, filters, owner=owner))
        .order_by(runs.c.run_id)
        .limit(limit)
    )
    return [uuid.UUID(str(r)) for r in (await conn.execute(stmt)).scalars()]


async def visible_run_ids(
    conn: AsyncConnection, tenant_id: str, run_ids: Sequence[uuid.UUID], *, owner: str | None
) -> list[uuid.UUID]:
    """Those of ``run_ids`` that are the tenant's runs visible to ``owner`` (a dry run's count)."""
    stmt = select(runs.c.run_id).where(
        runs.c.tenant_id == tenant_id, visible_to(owner), runs.c.run_id.in_(list(run_ids))
    )
    return [uuid.UUID(str(r)) for r in (await conn.execute(stmt)).scalars()]


async def insert_batch(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """Insert a batch row (``matched`` as given; counters start at zero)."""
    await conn.execute(insert(batches).values(**values))


async def insert_items_from_filter(
    conn: AsyncConnection,
    batch_id: uuid.UUID,
    tenant_id: str,
    filters: RunListFilters,
    *,
    owner: str | None,
) -> int:
    """Snapshot the matching runs into ``batch_items`` in one statement; returns the count."""
    sel = select(
        literal(tenant_id, type_=batches.c.tenant_id.type),
        literal(batch_id, type_=batches.c.batch_id.type),
        runs.c.run_id,
    ).where(*list_filters(tenant_id, filters, owner=owner))
    result = await conn.execute(
        insert(batch_items).from_select(["tenant_id", "batch_id", "run_id"], sel)
    )
    return int(result.rowcount or 0)


async def insert_items(
    conn: AsyncConnection, tenant_id: str, batch_id: uuid.UUID, run_ids: Sequence[uuid.UUID]
) -> None:
    """The listed runs as items of the tenant's batch, as given.

    An id that is not the tenant's is skipped later as ``not_found`` by the tenant-scoped
    action itself, so nothing here reads another tenant's runs.
    """
    if run_ids:
        await conn.execute(
            insert(batch_items),
            [{"tenant_id": tenant_id, "batch_id": batch_id, "run_id": r} for r in run_ids],
        )


async def set_matched(conn: AsyncConnection, batch_id: uuid.UUID, matched: int) -> None:
    """Record the exact item count once the items are inserted."""
    await conn.execute(
        update(batches).where(batches.c.batch_id == batch_id).values(matched=matched)
    )


def _mine(tenant_id: str, owner: str | None) -> list[ColumnElement[bool]]:
    # A batch is its creator's, as an owner-policy run is (its selection may name runs
    # only the creator may see): ``owner`` None is an admin, who sees the tenant's all.
    where = [batches.c.tenant_id == tenant_id]
    if owner is not None:
        where.append(batches.c.created_by == owner)
    return where


async def get_batch(
    conn: AsyncConnection, tenant_id: str, batch_id: uuid.UUID, *, owner: str | None = None
) -> RowMapping | None:
    """A tenant's batch, or None (another tenant's, or with ``owner`` another subject's)."""
    stmt = select(batches).where(*_mine(tenant_id, owner), batches.c.batch_id == batch_id)
    return (await conn.execute(stmt)).mappings().first()


async def list_batches(
    conn: AsyncConnection,
    tenant_id: str,
    *,
    before: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> Sequence[RowMapping]:
    """A tenant's batches (with ``owner``, that subject's) newest first, keyset on the id."""
    stmt = select(batches).where(*_mine(tenant_id, owner))
    if before is not None:
        stmt = stmt.where(batches.c.batch_id < before)
    stmt = stmt.order_by(batches.c.batch_id.desc()).limit(limit)
    return (await conn.execute(stmt)).mappings().all()


async def cancel_batch(
    conn: AsyncConnection,
    tenant_id: str,
    batch_id: uuid.UUID,
    *,
    now: datetime,
    owner: str | None = None,
) -> bool:
    """Stop a running batch: its worker sees ``cancelled`` at its next chunk and stops.

    Returns:
        False when it was not running (already completed or cancelled).
    """
    stmt = (
        update(batches)
        .where(
            *_mine(tenant_id, owner),
            batches.c.batch_id == batch_id,
            batches.c.state == "running",
        )
        .values(state="cancelled", finished_at=now, updated_at=now, lease_owner=None)
    )
    return bool((await conn.execute(stmt)).rowcount)


async def any_claimable(conn: AsyncConnection) -> bool:
    """Whether some running batch has no live lease: a read, before a claim's write.

    Every worker polls for batches; on SQLite a claim is a write transaction that takes
    the database's one write lock, so an idle poll must not be one.
    """
    now = now_expr(conn.dialect.name)
    stmt = (
        select(batches.c.batch_id)
        .where(
            batches.c.state == "running",
            (batches.c.lease_until.is_(None)) | (batches.c.lease_until < now),
        )
        .limit(1)
    )
    return (await conn.execute(stmt)).first() is not None


async def claim_batch(
    conn: AsyncConnection, *, worker_id: str, now: datetime, lease_until: datetime
) -> RowMapping | None:
    """Lease one running batch nobody holds (or whose holder's lease expired).

    The fence advances with every claim, like a run's (app/db/queries/runs.py claim_runs):
    the previous holder's next chunk finds a different fence and commits nothing. ``SKIP
    LOCKED`` lets concurrent workers each take a different batch on PostgreSQL; SQLite's
    single writer serializes claims anyway.
    """
    pick = (
        select(batches.c.batch_id)
        .where(
            batches.c.state == "running",
            (batches.c.lease_until.is_(None)) | (batches.c.lease_until < now),
        )
        .order_by(batches.c.batch_id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    found = (await conn.execute(pick)).scalar_one_or_none()
    if found is None:
        return None
    stmt = (
        update(batches)
        .where(batches.c.batch_id == found)
        .values(
            lease_owner=worker_id,
            lease_until=lease_until,
            fence=batches.c.fence + 1,
            updated_at=now,
        )
        .returning(*batches.c)
    )
    return (await conn.execute(stmt)).mappings().one()


async def lock_leased(
    conn: AsyncConnection, batch_id: uuid.UUID, *, fence: int
) -> RowMapping | None:
    """The batch row locked for a chunk, or None when the fence moved on (lease lost)."""
    stmt = (
        select(batches)
        .where(batches.c.batch_id == batch_id, batches.c.fence == fence)
        .with_for_update()
    )
    return (await conn.execute(stmt)).mappings().first()


async def next_items(
    conn: AsyncConnection, batch_id: uuid.UUID, *, after: uuid.UUID | None, limit: int
) -> list[uuid.UUID]:
    """The next ``limit`` unprocessed items after the cursor (primary-key range scan)."""
    stmt = select(batch_items.c.run_id).where(batch_items.c.batch_id == batch_id)
    if after is not None:
        stmt = stmt.where(batch_items.c.run_id > after)
    stmt = stmt.order_by(batch_items.c.run_id).limit(limit)
    return [uuid.UUID(str(r)) for r in (await conn.execute(stmt)).scalars()]


async def set_outcomes(
    conn: AsyncConnection, batch_id: uuid.UUID, outcomes: dict[uuid.UUID, str]
) -> None:
    """Record each processed item's outcome (``done``, ``skipped:<reason>``, ``failed``).

    One executemany for the chunk: a single round trip, not one per item.
    """
    if not outcomes:
        return
    stmt = (
        update(batch_items)
        .where(
            batch_items.c.batch_id == bindparam("b_batch_id"),
            batch_items.c.run_id == bindparam("b_run_id"),
        )
        .values(outcome=bindparam("b_outcome"))
    )
    await conn.execute(
        stmt,
        [
            {"b_batch_id": batch_id, "b_run_id": run_id, "b_outcome": outcome}
            for run_id, outcome in outcomes.items()
        ],
    )


async def advance(
    conn: AsyncConnection,
    batch_id: uuid.UUID,
    *,
    fence: int,
    values: dict[str, Any],
) -> bool:
    """Write a chunk's progress (counters, cursor, lease extension) under the fence.

    Returns:
        False when the fence moved on (the caller raises LeaseLost; its transaction,
        with the chunk's actions, rolls back).
    """
    stmt = (
        update(batches)
        .where(batches.c.batch_id == batch_id, batches.c.fence == fence)
        .values(**values)
    )
    return bool((await conn.execute(stmt)).rowcount)
