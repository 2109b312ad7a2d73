"""Queries on ``rate_limit_buckets``: GCRA theoretical arrival times per bucket."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import rate_limit_buckets as buckets


async def load_tats(
    conn: AsyncConnection, *, workflow: str, bucket_ids: Iterable[str]
) -> dict[str, datetime]:
    """``{bucket: tat}`` for the buckets of ``workflow`` that exist (UTC datetimes).

    The caller serializes access (app/engine/claims.py holds the workflow's advisory lock
    on PostgreSQL; SQLite's BEGIN IMMEDIATE), so a plain read is enough.
    """
    wanted = list(bucket_ids)
    if not wanted:
        return {}
    stmt = select(buckets.c.bucket, buckets.c.tat).where(
        buckets.c.workflow == workflow, buckets.c.bucket.in_(wanted)
    )
    return {row[0]: row[1] for row in (await conn.execute(stmt)).all()}


async def store_tats(conn: AsyncConnection, *, workflow: str, tats: dict[str, datetime]) -> None:
    """Upsert ``{bucket: tat}`` for ``workflow``."""
    if not tats:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(buckets).values(
        [{"workflow": workflow, "bucket": b, "tat": t} for b, t in tats.items()]
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["workflow", "bucket"], set_={"tat": stmt.excluded.tat}
    )
    await conn.execute(stmt)
