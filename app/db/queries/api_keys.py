"""Queries on ``api_keys``: insert, look up by prefix, list, revoke, touch, the claim's check."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import ColumnElement, RowMapping, and_, exists, insert, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr, now_plus
from app.db.tables import api_keys, runs


async def insert_key(
    conn: AsyncConnection,
    *,
    key_id: uuid.UUID,
    tenant_id: str,
    name: str,
    prefix: str,
    secret_hash: str,
    scopes: str,
    created_by: str,
) -> RowMapping:
    """Store a new key (its hash only) and return the row."""
    stmt = (
        insert(api_keys)
        .values(
            key_id=key_id,
            tenant_id=tenant_id,
            name=name,
            prefix=prefix,
            secret_hash=secret_hash,
            scopes=scopes,
            created_by=created_by,
            created_at=now_expr(conn.dialect.name),
        )
        .returning(*api_keys.c)
    )
    return (await conn.execute(stmt)).mappings().one()


async def by_prefix(conn: AsyncConnection, prefix: str) -> RowMapping | None:
    """The key with this public prefix (unique index), of any tenant: the key names it."""
    stmt = select(api_keys).where(api_keys.c.prefix == prefix)
    return (await conn.execute(stmt)).mappings().first()


async def list_keys(
    conn: AsyncConnection, tenant_id: str, *, include_revoked: bool
) -> Sequence[RowMapping]:
    """A tenant's keys, oldest first."""
    stmt = select(api_keys).where(api_keys.c.tenant_id == tenant_id)
    if not include_revoked:
        stmt = stmt.where(api_keys.c.revoked_at.is_(None))
    return (await conn.execute(stmt.order_by(api_keys.c.created_at))).mappings().all()


async def get_key(conn: AsyncConnection, tenant_id: str, key_id: uuid.UUID) -> RowMapping | None:
    """One key of this tenant (another tenant's id is simply not found)."""
    stmt = select(api_keys).where(api_keys.c.key_id == key_id, api_keys.c.tenant_id == tenant_id)
    return (await conn.execute(stmt)).mappings().first()


async def revoke(conn: AsyncConnection, tenant_id: str, key_id: uuid.UUID, actor: str) -> None:
    """Mark a live key revoked (a no-op for one already revoked)."""
    await conn.execute(
        update(api_keys)
        .where(
            api_keys.c.key_id == key_id,
            api_keys.c.tenant_id == tenant_id,
            api_keys.c.revoked_at.is_(None),
        )
        .values(revoked_at=now_expr(conn.dialect.name), revoked_by=actor)
    )


async def touch(conn: AsyncConnection, key_id: uuid.UUID, *, min_interval: float) -> None:
    """Set ``last_used_at`` unless it was set within ``min_interval`` seconds (DB clock)."""
    dialect = conn.dialect.name
    await conn.execute(
        update(api_keys)
        .where(
            api_keys.c.key_id == key_id,
            or_(
                api_keys.c.last_used_at.is_(None),
                api_keys.c.last_used_at < now_plus(dialect, -min_interval),
            ),
        )
        .values(last_used_at=now_expr(dialect))
    )


async def revoked_among(
    conn: AsyncConnection, key_ids: Sequence[uuid.UUID]
) -> frozenset[uuid.UUID]:
    """Which of ``key_ids`` are revoked or gone (one indexed read, any tenant).

    Used where work is started for a principal outside a request: each schedule fire
    re-checks the key its schedule was created with (app/engine/authority.py).
    """
    wanted = set(key_ids)
    if not wanted:
        return frozenset()
    stmt = select(api_keys.c.key_id).where(
        api_keys.c.key_id.in_(list(wanted)), api_keys.c.revoked_at.is_(None)
    )
    live = set((await conn.execute(stmt)).scalars().all())
    return frozenset(wanted - live)


def run_api_key_revoked() -> ColumnElement[bool]:
    """SQL: was the ``runs`` row's submitting key revoked (or is it gone)? False without one.

    Selected by the claim (:func:`app.db.queries.runs.claim_runs`): each worker attempt
    re-checks the key in the statement that starts it, with no extra round trip. One
    primary-key probe, only for runs submitted with a key.
    """
    live = exists().where(api_keys.c.key_id == runs.c.api_key_id, api_keys.c.revoked_at.is_(None))
    return and_(runs.c.api_key_id.is_not(None), not_(live))
