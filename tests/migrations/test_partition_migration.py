"""Revision 0023 on a populated PostgreSQL database: 1,000,000 rows, none lost.

docs/adr/0036-time-partitions.md. The rows are made by ``generate_series`` in SQL (a few
seconds), then 0022 → 0023 runs while another connection watches ``pg_locks`` for the
``ACCESS EXCLUSIVE`` locks on the old tables and a third keeps reading ``steps``: the test
prints the migration's time, how long the exclusive locks were held and the longest a
read waited (the figures in docs/scaling.md, "Time partitions").
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from alembic import command
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import alembic_config, check_schema
from app.db.queries import partitions as qp
from app.db.tables import events, steps
from tests.conftest import DEV_SECRET

RUNS = 50_000
PER_RUN = 10  # steps and events each: 2 x 500,000 rows
DAYS = 90  # run ids spread over the last 90 days: ~14 weekly partitions hold them
STRAYS = 200  # runs with version-4 ids: their rows must land in the default partition

# A UUIDv7 in SQL: 48 bits of Unix milliseconds, version 7, 12 bits, variant 10, 62 bits.
_SEED = """
INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, created_by,
                  created_at, updated_at, finished_at)
SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       't' || (i % 7), 'wf', '1', 'completed', '{{}}', 'seed', at, at, at
FROM (
    SELECT i, md5(i::text) AS h,
           now() - interval '{DAYS} days' + (i * interval '{DAYS} days') / {RUNS} AS at,
           (extract(epoch FROM now() - interval '{DAYS} days') * 1000)::bigint
             + (i::bigint * {DAYS} * 86400000) / {RUNS} AS ms
    FROM generate_series(1, {RUNS}) i
) s;
INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, created_by,
                  created_at, updated_at)
SELECT gen_random_uuid(), 'stray', 'wf', '1', 'running', '{{}}', 'seed', now(), now()
FROM generate_series(1, {STRAYS});
INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt,
                   max_attempts, output, created_at, fence)
SELECT r.run_id, 's' || k, r.tenant_id, k, 'step', 'act', 'succeeded', 1, 3,
       '"result ' || k || '"', r.created_at, 1
FROM runs r, generate_series(1, {PER_RUN}) k;
INSERT INTO events (run_id, tenant_id, at, kind, step_id, data)
SELECT r.run_id, r.tenant_id, r.created_at + k * interval '1 second', 'step_succeeded',
       's' || k, '{{"k": ' || k || '}}'
FROM runs r, generate_series(1, {PER_RUN}) k;
INSERT INTO runs_archive (run_id, tenant_id, workflow, version, status, input, created_by,
                          created_at, archived_at)
SELECT run_id, tenant_id, workflow, version, status, input, created_by, created_at, now()
FROM runs WHERE tenant_id = 't0' AND run_id < (SELECT run_id FROM runs ORDER BY run_id
                                               OFFSET {archived_window} LIMIT 1);
"""


def _seed_sql(runs: int, strays: int) -> list[str]:
    """The seeding statements for ``runs`` version-7 runs and ``strays`` version-4 ones."""
    sql = _SEED.format(
        RUNS=runs, STRAYS=strays, DAYS=DAYS, PER_RUN=PER_RUN, archived_window=runs // 10
    )
    return [s for s in sql.split(";\n") if s.strip()]


# Row count and an order-independent checksum of every row's full text, per table.
_CENSUS = """
SELECT '{t}', count(*), coalesce(sum(hashtext(x::text)::bigint), 0) FROM {t} x
"""


async def _acl_and_options(conn: AsyncConnection, name: str) -> tuple[str | None, Any]:
    """``"=r/"`` if PUBLIC may SELECT ``name`` (else None), and its storage parameters."""
    acl, options = (
        await conn.execute(
            text("SELECT relacl::text, reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
            {"t": name},
        )
    ).one()
    return ("=r/" if acl is not None and "=r/" in acl else None), options


async def _census(db: Database) -> dict[str, tuple[int, int]]:
    async with db.read() as conn:
        out = {}
        for table in ("runs", "steps", "events", "runs_archive"):
            row = (await conn.execute(text(_CENSUS.format(t=table)))).one()
            out[table] = (int(row[1]), int(row[2]))
        return out


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_0023_on_a_million_rows(make_pg_database: Callable[[], str]) -> None:
    url = make_pg_database()
    cfg = alembic_config(url)
    await asyncio.to_thread(command.downgrade, cfg, "0022")
    db = Database(Settings(database_url=url, dev_secret=DEV_SECRET))
    try:
        started = time.perf_counter()
        async with db.write() as conn:
            for statement in _seed_sql(RUNS, STRAYS):
                await conn.execute(text(statement))
            await conn.execute(text("ANALYZE"))
        seeded_in = time.perf_counter() - started
        before = await _census(db)
        assert before["steps"][0] + before["events"][0] == 2 * (RUNS + STRAYS) * PER_RUN
        assert before["steps"][0] + before["events"][0] >= 1_000_000
        async with db.read() as conn:
            oids = [
                int((await conn.execute(text(f"SELECT '{t}'::regclass::oid"))).scalar_one())
                for t in ("steps", "events", "runs_archive")
            ]
            top_event = int(
                (await conn.execute(text("SELECT max(event_id) FROM events"))).scalar_one()
            )
            probe = (
                await conn.execute(text("SELECT run_id FROM runs WHERE tenant_id = 't3' LIMIT 1"))
            ).scalar_one()

        done = asyncio.Event()
        held: list[float] = []
        waits: list[float] = []

        async def watch_locks() -> None:
            # The first and last instant an ACCESS EXCLUSIVE lock on an old table is seen.
            async with db.engine.connect() as conn:
                while not done.is_set():
                    n = (
                        await conn.execute(
                            text(
                                "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' "
                                "AND mode = 'AccessExclusiveLock' AND granted "
                                "AND relation = ANY(CAST(:oids AS oid[]))"
                            ),
                            {"oids": oids},
                        )
                    ).scalar_one()
                    await conn.rollback()
                    if n:
                        held.append(time.perf_counter())
                    await asyncio.sleep(0.002)

        async def read_steps() -> None:
            # A dashboard reading one run's journal all along: the longest it waited.
            async with db.engine.connect() as conn:
                while not done.is_set():
                    t0 = time.perf_counter()
                    await conn.execute(
                        text("SELECT count(*) FROM steps WHERE run_id = :r"), {"r": probe}
                    )
                    await conn.rollback()
                    waits.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.005)

        watchers = [asyncio.create_task(watch_locks()), asyncio.create_task(read_steps())]
        started = time.perf_counter()
        try:
            await asyncio.to_thread(command.upgrade, cfg, "0023")
        finally:
            migrated_in = time.perf_counter() - started
            done.set()
            await asyncio.gather(*watchers)
        exclusive = (held[-1] - held[0]) if held else 0.0
        rows = before["steps"][0] + before["events"][0] + before["runs_archive"][0]
        print(
            f"\n0023 on {rows:,} rows (steps {before['steps'][0]:,}, events "
            f"{before['events'][0]:,}, runs_archive {before['runs_archive'][0]:,}; seeded in "
            f"{seeded_in:.1f} s): migration {migrated_in:.2f} s "
            f"({migrated_in / rows * 1e6:.2f} s per 1M rows), ACCESS EXCLUSIVE held "
            f"{exclusive * 1000:.0f} ms (seen {len(held)} times), longest read wait "
            f"{max(waits) * 1000:.0f} ms over {len(waits)} reads"
        )
        assert held, "the swap's exclusive locks were never seen: the watcher saw nothing"

        # No row lost, none changed (same counts, same checksums of every row's text).
        assert await _census(db) == before
        async with db.read() as conn:
            for table in ("steps", "events", "runs_archive"):
                assert await qp.is_partitioned(conn, table)
                parts = await qp.list_partitions(conn, table)
                assert len(parts) >= DAYS // 7 + 2
            strays = await conn.execute(
                text("SELECT count(*) FROM steps_default"),
            )
            assert strays.scalar_one() == STRAYS * PER_RUN
            # A run's journal is read from its one partition (pruning).
            plan = "\n".join(
                r[0]
                for r in await conn.execute(
                    text("EXPLAIN SELECT * FROM steps WHERE run_id = :r"), {"r": probe}
                )
            )
            assert len(set(re.findall(r"steps_p\d{8}|steps_default", plan))) == 1, plan
            journal = await conn.execute(
                select(steps.c.step_id).where(steps.c.run_id == probe).order_by(steps.c.seq)
            )
            assert [r[0] for r in journal] == [f"s{k}" for k in range(1, PER_RUN + 1)]
        # The sequence goes on where it was; the foreign keys hold and cascade.
        async with db.write() as conn:
            new = await conn.execute(
                insert(events)
                .values(run_id=probe, tenant_id="t3", at=text("now()"), kind="run_resumed")
                .returning(events.c.event_id)
            )
            assert new.scalar_one() == top_event + 1
            await conn.execute(text("DELETE FROM runs WHERE run_id = :r"), {"r": probe})
            left = await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM steps WHERE run_id = :r) "
                    "+ (SELECT count(*) FROM events WHERE run_id = :r)"
                ),
                {"r": probe},
            )
            assert left.scalar_one() == 0
        with pytest.raises(IntegrityError):
            async with db.write() as conn:
                await conn.execute(
                    insert(steps).values(
                        run_id=probe, step_id="x", tenant_id="t3", seq=1, kind="step",
                        name="a", status="succeeded", attempt=1, max_attempts=1,
                        created_at=text("now()"), fence=1,
                    )
                )  # fmt: skip
        await asyncio.to_thread(command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


async def test_0023_down_and_up_keeps_rows(make_pg_database: Callable[[], str]) -> None:
    """0023 → 0022 → 0023 on a small populated database keeps every row both ways.

    Plain tables again after the downgrade (no partition or twin left), partitioned
    after the upgrade; the version-4 strays kept too.
    """
    url = make_pg_database()
    cfg = alembic_config(url)
    await asyncio.to_thread(command.downgrade, cfg, "0022")
    db = Database(Settings(database_url=url, dev_secret=DEV_SECRET))
    try:
        async with db.write() as conn:
            for statement in _seed_sql(300, 7):
                await conn.execute(text(statement))
            # An operator's grant and autovacuum setting, which the conversion must keep.
            await conn.execute(text("GRANT SELECT ON steps TO PUBLIC"))
            await conn.execute(
                text("ALTER TABLE steps SET (autovacuum_vacuum_scale_factor = 0.02)")
            )
        before = await _census(db)
        assert before["steps"][0] == 307 * PER_RUN
        await asyncio.to_thread(command.upgrade, cfg, "0023")
        assert await _census(db) == before
        async with db.read() as conn:
            assert await _acl_and_options(conn, "steps") == ("=r/", None)
            for p in await qp.list_partitions(conn, "steps"):
                assert (await _acl_and_options(conn, p.name))[1] == [
                    "autovacuum_vacuum_scale_factor=0.02"
                ]
        async with db.write() as conn:  # and a partition made later takes them too
            made = await qp.create_partition(
                conn, "steps", datetime(2030, 1, 7, tzinfo=UTC), datetime(2030, 1, 14, tzinfo=UTC)
            )
            assert (await _acl_and_options(conn, made))[1] == [
                "autovacuum_vacuum_scale_factor=0.02"
            ]
        await asyncio.to_thread(command.downgrade, cfg, "0022")
        assert await _census(db) == before
        async with db.read() as conn:
            assert await _acl_and_options(conn, "steps") == (
                "=r/",
                ["autovacuum_vacuum_scale_factor=0.02"],
            )
            for table in ("steps", "events", "runs_archive"):
                assert not await qp.is_partitioned(conn, table)
            stray = await conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relname LIKE 'steps\\_%'")
            )
            assert stray.scalar_one() == 0  # no partition and no twin left behind
            key = await conn.execute(
                text(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conname = 'pk_events'"
                )
            )
            assert key.scalar_one() == "PRIMARY KEY (event_id)"
        await asyncio.to_thread(command.upgrade, cfg, "0023")
        assert await _census(db) == before
        # Later revisions may add columns (0025's runs.lost_claims), which changes a row's
        # text and so its hash; the rows themselves were proved kept at 0023.
        await asyncio.to_thread(command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()
