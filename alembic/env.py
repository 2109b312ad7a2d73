"""Alembic environment: runs migrations through Treadle's own async engine.

Two processes migrating at once is safe: on PostgreSQL the migration transaction first
takes a transaction-scoped advisory lock; on SQLite the write engine begins with
``BEGIN IMMEDIATE``. The second process waits, then finds the schema at head and does
nothing.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.engine import Connection

from alembic import context
from app.core.settings import Settings
from app.db.database import Database
from app.db.partitions import include_name, include_object_for
from app.db.tables import metadata

# Any constant works; it only has to be the same in every Treadle process.
MIGRATION_LOCK_KEY = 0x74726561646C65  # "treadle"


def _run(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=False,
        compare_type=True,
        # Time partitions are not tables of tables.py (docs/adr/0036-time-partitions.md).
        include_name=include_name,
        # One dialect's constraints are not asked of the other (revision 0027).
        include_object=include_object_for(connection.dialect.name),
    )
    context.run_migrations()


async def _main() -> None:
    url = context.config.attributes.get("database_url") or Settings().database_url
    db = Database(Settings(database_url=url))
    try:
        async with db.write() as conn:
            await conn.run_sync(_run)
    finally:
        await db.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `treadle migrate`")

connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_main())
