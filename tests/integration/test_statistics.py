"""Statistics that keep up with a young database (docs/adr/0043-statistics-of-a-young-database.md).

The defect class: a plan PostgreSQL cached while a table was small (a prepared
statement's generic plan, a foreign-key check's) reads it by a sequential scan after it
has grown, until the table is analyzed. These tests show the cached plan going stale,
and :mod:`app.db.statistics` replanning it on every connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.database import Database
from app.db.statistics import (
    ANALYZE_MIN_ROWS,
    STATISTICS_LOCK_KEY,
    StatisticsKeeper,
    refresh_statistics,
    stale_tables,
)
from tests.helpers import wait_for

# What PostgreSQL's foreign-key check of a ``runs`` child reads (ri_triggers.c).
FK_CHECK = (
    "PREPARE fk_check(text, uuid) AS "
    "SELECT 1 FROM ONLY runs x WHERE tenant_id = $1 AND run_id = $2 FOR KEY SHARE OF x"
)


def _pg(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("PostgreSQL caches generic plans; SQLite plans every statement anew")


async def add_runs(db: Database, n: int) -> None:
    """Insert ``n`` finished runs in one statement (no worker will claim them)."""
    async with db.write() as conn:
        await conn.execute(
            text(
                "INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, "
                "created_by, created_at, updated_at) "
                "SELECT gen_random_uuid(), 'stats', 'w', '1', 'succeeded', '{}', 't', now(), "
                "now() FROM generate_series(1, :n)"
            ),
            {"n": n},
        )


@pytest.fixture
async def cached_plan(db: Database) -> AsyncIterator[AsyncConnection]:
    """A connection holding the generic plan of the FK check, made while ``runs`` was small."""
    _pg(db)
    await add_runs(db, 20)
    async with db.write() as conn:
        await conn.execute(text("ANALYZE runs"))  # what autovacuum does to a small table
    # Autocommit: like the service's, each statement is its own transaction, and a new
    # transaction is where a connection reads other sessions' invalidations.
    async with db.engine.connect() as plain:
        conn = await plain.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        await conn.exec_driver_sql(FK_CHECK)
        yield conn
        await conn.exec_driver_sql("DEALLOCATE fk_check")
        await conn.execute(text("RESET plan_cache_mode"))


async def plan(conn: AsyncConnection) -> str:
    rows = await conn.exec_driver_sql(
        "EXPLAIN EXECUTE fk_check('stats', '00000000-0000-0000-0000-000000000000')"
    )
    return "\n".join(r[0] for r in rows)


async def wait_for_counters(db: Database, table: str) -> None:
    """Until ``table``'s change counters show what was committed (they lag by <= 1 s)."""

    async def stale() -> bool:
        async with db.write() as conn:
            await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            return table in await stale_tables(conn)

    await wait_for(stale, timeout=30, what=f"{table}'s changes counted")


async def test_a_plan_cached_while_runs_was_small_is_replanned_on_every_connection(
    db: Database, cached_plan: AsyncConnection
) -> None:
    assert "Seq Scan on runs" in await plan(cached_plan)
    await add_runs(db, 5 * ANALYZE_MIN_ROWS)
    # The defect: grown 250-fold, and the cached plan still scans every row.
    assert "Seq Scan on runs" in await plan(cached_plan)

    await wait_for_counters(db, "runs")
    analyzed = await refresh_statistics(db)
    assert analyzed is not None and "runs" in analyzed
    assert "Index Scan" in await plan(cached_plan)

    # Nothing changed since: nothing to analyze.
    assert "runs" not in (await refresh_statistics(db) or [])


async def test_a_table_that_changed_by_less_than_it_holds_is_left_to_autovacuum(
    db: Database,
) -> None:
    _pg(db)
    await add_runs(db, 3 * ANALYZE_MIN_ROWS)
    await wait_for_counters(db, "runs")
    assert "runs" in (await refresh_statistics(db) or [])
    # Half its size again: autovacuum's 10 % rule will see to it; the keeper does not.
    await add_runs(db, 3 * ANALYZE_MIN_ROWS // 2)
    await wait_for_changes(db, 3 * ANALYZE_MIN_ROWS // 2)
    async with db.read() as conn:
        assert "runs" not in await stale_tables(conn)
    assert "runs" not in (await refresh_statistics(db) or [])


async def wait_for_changes(db: Database, n: int) -> None:
    """Until ``runs`` counts ``n`` changes since its last ANALYZE.

    A backend flushes its counters at most once a second, and an idle one only 10 s
    later (``PGSTAT_IDLE_INTERVAL``), so each look is a new transaction, which may be on
    the connection that wrote.
    """

    async def counted() -> bool:
        async with db.write() as conn:
            await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            got = await conn.execute(
                text("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'runs'")
            )
            return int(got.scalar_one()) >= n

    await wait_for(counted, timeout=30, what=f"{n} changes of runs counted")


async def test_a_never_analyzed_table_below_the_floor_is_not_analyzed(db: Database) -> None:
    _pg(db)
    await add_runs(db, ANALYZE_MIN_ROWS - 1)
    await wait_for_changes(db, ANALYZE_MIN_ROWS - 1)
    async with db.read() as conn:
        assert "runs" not in await stale_tables(conn)


async def test_partitions_of_treadle_tables_are_looked_after(db: Database) -> None:
    _pg(db)
    await add_runs(db, 2 * ANALYZE_MIN_ROWS)
    async with db.write() as conn:
        await conn.execute(
            text(
                "INSERT INTO events (tenant_id, run_id, kind, at) "
                "SELECT tenant_id, run_id, 'run_submitted', now() FROM runs"
            )
        )
    await wait_for_counters(db, "runs")
    analyzed = set(await refresh_statistics(db) or [])
    assert "runs" in analyzed
    # The partition the events went to was analyzed with it.
    assert any(name.startswith("events_") for name in analyzed), analyzed
    assert "events" not in analyzed  # the parent holds no rows of its own


async def test_one_process_analyzes_at_a_time(db: Database) -> None:
    _pg(db)
    await add_runs(db, 2 * ANALYZE_MIN_ROWS)
    await wait_for_counters(db, "runs")
    async with db.write() as other:
        await other.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": STATISTICS_LOCK_KEY})
        assert await refresh_statistics(db) is None
    assert "runs" in (await refresh_statistics(db) or [])


async def test_the_keeper_analyzes_on_its_own_and_stops(db: Database) -> None:
    _pg(db)
    keeper = StatisticsKeeper(db, interval_seconds=0.05)
    stopping = asyncio.Event()
    task = asyncio.create_task(keeper.run(stopping))
    await add_runs(db, 2 * ANALYZE_MIN_ROWS)

    async def analyzed() -> bool:
        return keeper.analyzed > 0

    await wait_for(analyzed, timeout=20, what="the keeper's ANALYZE")
    async with db.read() as conn:
        last = await conn.execute(
            text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'runs'")
        )
        assert last.scalar_one() is not None
    stopping.set()
    await asyncio.wait_for(task, timeout=10)


async def test_the_keeper_is_a_no_op_on_sqlite_and_when_turned_off(db: Database) -> None:
    stopping = asyncio.Event()
    # Returns at once: SQLite has nothing to keep; an interval of 0 turns it off.
    await asyncio.wait_for(StatisticsKeeper(db, interval_seconds=0).run(stopping), timeout=5)
    if db.dialect == "sqlite":
        assert await refresh_statistics(db) is None
        await asyncio.wait_for(StatisticsKeeper(db, 0.05).run(stopping), timeout=5)
