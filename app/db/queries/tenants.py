"""Queries on ``tenants``: suspend, resume, read, list, and the claim's suspension check.

A tenant without a row is active: rows exist only for tenants an operator acted on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, exists, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.tables import runs, tenants

ACTIVE = "active"
SUSPENDED = "suspended"


def _insert(conn: AsyncConnection) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(tenants)


async def get_tenant(conn: AsyncConnection, tenant_id: str) -> RowMapping | None:
    """The tenant's row, or None (a tenant without a row is active)."""
    stmt = select(tenants).where(tenants.c.tenant_id == tenant_id)
    return (await conn.execute(stmt)).mappings().first()


async def list_tenants(
    conn: AsyncConnection, *, status: str | None, after: str | None, limit: int
) -> Sequence[RowMapping]:
    """Tenants with a row, by id (keyset: those after ``after``), at most ``limit``."""
    stmt = select(tenants)
    if status is not None:
        stmt = stmt.where(tenants.c.status == status)
    if after is not None:
        stmt = stmt.where(tenants.c.tenant_id > after)
    stmt = stmt.order_by(tenants.c.tenant_id).limit(limit)
    return (await conn.execute(stmt)).mappings().all()


async def suspend(conn: AsyncConnection, *, tenant_id: str, reason: str, actor: str) -> None:
    """Mark the tenant suspended (creating its row); a no-op if it is suspended already.

    Why an upsert with a ``WHERE``: two operators suspending at once both succeed, and
    the first one's reason, subject and time stay (suspending twice changes nothing).
    """
    now = now_expr(conn.dialect.name)
    stmt = _insert(conn).values(
        tenant_id=tenant_id,
        status=SUSPENDED,
        reason=reason,
        changed_by=actor,
        changed_at=now,
        created_at=now,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["tenant_id"],
        set_={
            "status": SUSPENDED,
            "reason": stmt.excluded.reason,
            "changed_by": stmt.excluded.changed_by,
            "changed_at": now,
        },
        where=tenants.c.status != SUSPENDED,
    )
    await conn.execute(stmt)


async def resume(conn: AsyncConnection, *, tenant_id: str, actor: str) -> None:
    """Mark a suspended tenant active again (clearing the reason); otherwise a no-op.

    A tenant without a row is active already and gets none.
    """
    await conn.execute(
        update(tenants)
        .where(tenants.c.tenant_id == tenant_id, tenants.c.status == SUSPENDED)
        .values(
            status=ACTIVE, reason=None, changed_by=actor, changed_at=now_expr(conn.dialect.name)
        )
    )


async def is_suspended(conn: AsyncConnection, tenant_id: str) -> bool:
    """True if the tenant is suspended now (one primary-key read)."""
    stmt = select(tenants.c.status).where(tenants.c.tenant_id == tenant_id)
    return (await conn.execute(stmt)).scalar() == SUSPENDED


async def suspended_among(conn: AsyncConnection, tenant_ids: Sequence[str]) -> frozenset[str]:
    """Which of ``tenant_ids`` are suspended now (primary-key reads)."""
    if not tenant_ids:
        return frozenset()
    stmt = select(tenants.c.tenant_id).where(
        tenants.c.tenant_id.in_(sorted(set(tenant_ids))), tenants.c.status == SUSPENDED
    )
    return frozenset((await conn.execute(stmt)).scalars().all())


async def suspended_ids(conn: AsyncConnection) -> frozenset[str]:
    """Every suspended tenant's id: what an API process caches (few rows, by design)."""
    stmt = select(tenants.c.tenant_id).where(tenants.c.status == SUSPENDED)
    return frozenset((await conn.execute(stmt)).scalars().all())


def run_tenant_suspended() -> ColumnElement[bool]:
    """SQL: is the tenant of the ``runs`` row at hand suspended? (a correlated EXISTS).

    Selected by the claim (:func:`app.db.queries.runs.claim_runs`) so that each worker
    attempt re-checks its tenant in the statement that starts it: no extra round trip.
    One primary-key probe per claimed run.
    """
    return exists().where(tenants.c.tenant_id == runs.c.tenant_id, tenants.c.status == SUSPENDED)
