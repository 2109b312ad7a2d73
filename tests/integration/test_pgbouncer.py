"""Treadle behind PgBouncer 1.18 in transaction pooling mode (docs/adr/0032-transaction-pooler.md).

The engine's own paths run through PgBouncer in the tests marked ``WITH_PGBOUNCER``
(submit, claim, checkpoints, waits, timers, worker processes over HTTP). These tests pin
what makes that work and show it is really pooled: many client connections share
:data:`tests.conftest.PGBOUNCER_POOL_SIZE` server connections, the direct settings fail
through the pooler, the migrations run through it, and a missing role setting is named.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.core.settings import DbPooler
from app.db.database import Database
from app.db.migrations import check_schema, upgrade_to_head
from app.db.pooler import statement_timeout_mismatch
from tests.conftest import (
    PG_SERVER,
    PGBOUNCER_POOL_SIZE,
    POOLED,
    PgBouncer,
    make_settings,
    pg_url,
)

CLIENTS = 10
"""Client connections of the pooled burst: five times the server connections."""


async def _burst(db: Database, n: int) -> None:
    """``n`` concurrent statements, half in autocommit and half in transactions.

    Each statement text differs and each returns its own parameter, so a statement run
    on a server connection that holds another one's unnamed statement, or none, shows.
    """

    async def one(i: int) -> None:
        sql = text(f"SELECT CAST(:x AS int) + {i % 7}, pg_sleep(0.005)")
        if i % 2:
            async with db.autocommit() as conn:
                got = (await conn.execute(sql, {"x": i})).scalar_one()
        else:
            async with db.write() as conn:
                got = (await conn.execute(sql, {"x": i})).scalar_one()
        assert got == i + i % 7

    await asyncio.gather(*(one(i) for i in range(n)))


def _pool_row(bouncer: PgBouncer, command: str, database: str) -> dict[str, str]:
    rows = [r for r in bouncer.admin(command) if r["database"] == database]
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)
async def test_clients_share_few_server_connections(
    database_url: str, tmp_path: Path, pgbouncer: PgBouncer
) -> None:
    settings = make_settings(database_url, tmp_path, db_pool_size=CLIENTS)
    assert settings.db_pooler == DbPooler.TRANSACTION
    name = make_url(database_url).database or ""
    db = Database(settings)
    try:
        await _burst(db, 20 * CLIENTS)
        clients = [c for c in pgbouncer.admin("SHOW CLIENTS") if c["database"] == name]
        servers = [s for s in pgbouncer.admin("SHOW SERVERS") if s["database"] == name]
        # The pool kept every client connection it opened; PgBouncer served them all
        # from its few server connections.
        assert len(clients) == CLIENTS
        assert 1 <= len(servers) <= PGBOUNCER_POOL_SIZE
        stats = _pool_row(pgbouncer, "SHOW STATS", name)
        assert int(stats["total_xact_count"]) >= 20 * CLIENTS
        assert _pool_row(pgbouncer, "SHOW POOLS", name)["pool_mode"] == "transaction"
    finally:
        await db.dispose()
    # The server agrees: no more backends on the database than PgBouncer's pool.
    admin = await asyncpg.connect(f"postgresql://{PG_SERVER}/postgres")
    try:
        backends = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
        )
    finally:
        await admin.close()
    assert backends <= PGBOUNCER_POOL_SIZE


@pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)
async def test_direct_connection_settings_fail_through_the_pooler(
    database_url: str, tmp_path: Path
) -> None:
    # What TREADLE_DB_POOLER=transaction changes, shown failing without it: the startup
    # parameter is refused at connect...
    direct = Database(make_settings(database_url, tmp_path, db_pooler=DbPooler.NONE))
    try:
        with pytest.raises(DBAPIError, match="unsupported startup parameter: statement_timeout"):
            async with direct.read() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await direct.dispose()
    # ...and named prepared statements (asyncpg's default) go missing when the next round
    # trip outside a transaction lands on another server connection. Whether a burst
    # trips over it depends on scheduling, so bursts run until one does (it took the
    # first burst in every trial).
    engine = create_async_engine(database_url, pool_size=CLIENTS, max_overflow=0)
    deadline = time.monotonic() + 60
    missing = ""
    try:
        while not missing:
            assert time.monotonic() < deadline, "named statements never went missing"

            async def one(i: int) -> None:
                nonlocal missing
                sql = text(f"SELECT CAST(:x AS int) + {i % 7}, pg_sleep(0.005)")
                try:
                    async with engine.connect() as conn:
                        auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                        await auto.execute(sql, {"x": i})
                except DBAPIError as exc:
                    assert "prepared statement" in str(exc) and "does not exist" in str(exc)
                    missing = str(exc)

            await asyncio.gather(*(one(i) for i in range(20 * CLIENTS)))
    finally:
        await engine.dispose()


async def test_migrations_run_through_the_pooler(
    pgbouncer: PgBouncer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One transaction with a transaction-scoped advisory lock (alembic/env.py): nothing
    # in it needs a session, so `treadle migrate` may use the pooled URL.
    name = f"t_mig_{int(time.time() * 1000)}"
    admin = await asyncpg.connect(f"postgresql://{PG_SERVER}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        pooled = pgbouncer.url(name)
        monkeypatch.setenv("TREADLE_DB_POOLER", "transaction")
        await asyncio.to_thread(upgrade_to_head, pooled)
        db = Database(make_settings(pooled, tmp_path, db_pooler=DbPooler.TRANSACTION))
        try:
            await check_schema(db)
        finally:
            await db.dispose()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)
async def test_statement_timeout_comes_from_the_database(database_url: str, tmp_path: Path) -> None:
    name = make_url(database_url).database or ""
    # Before any pooled connection: PgBouncer opens its server connections after this, so
    # every one of them starts with the database's default.
    admin = await asyncpg.connect(pg_url(name, driver="postgresql"))
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 30000')
    finally:
        await admin.close()
    assert POOLED[database_url] == pg_url(name)
    agreeing = Database(make_settings(database_url, tmp_path))
    differing = Database(make_settings(database_url, tmp_path, db_statement_timeout_seconds=5))
    try:
        assert await statement_timeout_mismatch(agreeing) is None
        warning = await statement_timeout_mismatch(differing)
        assert warning is not None
        assert "30000 ms" in warning and "5000 ms" in warning and "ALTER ROLE" in warning
    finally:
        await agreeing.dispose()
        await differing.dispose()
