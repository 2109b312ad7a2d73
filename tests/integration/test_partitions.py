"""Time partitions (docs/adr/0036-time-partitions.md): created ahead, dropped whole.

PostgreSQL partitions ``steps``, ``events`` and ``runs_archive`` by UUIDv7 run id;
SQLite keeps plain tables and the row-by-row maintenance.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError

from app.core.errors import RunArchived
from app.db.database import Database
from app.db.partitions import bound, is_partition, partition_name, time_of
from app.db.queries import maintenance as qmaint
from app.db.queries import partitions as qp
from app.db.queries import runs as qruns
from app.db.tables import events, runs, runs_archive, steps
from app.engine.maintenance import Tier, create_partitions_ahead, run_maintenance
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]


def v7_at(at: datetime) -> uuid.UUID:
    """A random UUIDv7 of the instant ``at`` (what app.core.ids mints at that time)."""
    rand = int.from_bytes(secrets.token_bytes(10))
    low = (rand & ((1 << 12) - 1)) << 64 | (rand >> 12) & ((1 << 62) - 1)
    return uuid.UUID(int=bound(at).int | 7 << 76 | 2 << 62 | low)


def test_bounds_order_like_run_ids() -> None:
    """A run id minted at ``t`` sorts within [bound(t'), bound(t'')) iff t' <= t < t''."""
    from app.core.ids import new_run_id

    minted = new_run_id()
    at = time_of(minted)
    assert bound(at) <= minted < bound(at + timedelta(milliseconds=1))
    assert time_of(bound(at)) == at
    assert minted.version == 7
    assert partition_name("events", at) == f"events_p{at:%Y%m%d}"
    assert is_partition("events_default") and is_partition("steps_p20261130")
    assert not is_partition("steps") and not is_partition("events_p1")


def _pg(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("time partitions are PostgreSQL's; SQLite keeps plain tables")


async def _names(db: Database, table: str) -> list[str]:
    async with db.read() as conn:
        return [p.name for p in await qp.list_partitions(conn, table)]


async def test_migration_leaves_weekly_partitions_and_a_default(db: Database) -> None:
    _pg(db)
    now = await db.now()
    async with db.read() as conn:
        for table in ("steps", "events", "runs_archive"):
            assert await qp.is_partitioned(conn, table)
            parts = await qp.list_partitions(conn, table)
            assert parts[-1].is_default
            ranges = parts[:-1]
            assert ranges[0].starts is not None and ranges[0].starts <= now
            assert ranges[-1].ends is not None and ranges[-1].ends >= now + timedelta(days=14)
            # Contiguous, 7 days each, starting on a Monday.
            for a, b in itertools.pairwise(ranges):
                assert a.upper == b.lower
            for p in ranges:
                assert p.starts is not None and p.ends is not None
                assert p.starts.weekday() == 0 and p.ends - p.starts == timedelta(days=7)


async def test_sqlite_keeps_plain_tables(db: Database, tmp_path: Path) -> None:
    if db.dialect != "sqlite":
        pytest.skip("SQLite only")
    async with db.read() as conn:
        names = {
            r[0]
            for r in await conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))
        }
        assert not any(is_partition(n) for n in names)
        assert not await qp.is_partitioned(conn, "steps")
    report = await run_maintenance(db, make_settings(db.url, tmp_path))
    assert report.partitions_created == []


async def test_partitions_created_ahead_and_default_rows_moved(
    db: Database, tmp_path: Path
) -> None:
    _pg(db)
    now = await db.now()
    before = await _names(db, "events")
    # A run created beyond every partition lands in the default partition ...
    far = now + timedelta(days=40)
    run_id = v7_at(far)
    await _insert_run(db, run_id, created=now, finished=None, status="running")
    await _insert_children(db, [run_id], at=now)
    async with db.read() as conn:
        n = await conn.execute(text("SELECT count(*) FROM events_default"))
        assert n.scalar_one() == 1
    # ... and moves into its partition when maintenance creates it.
    settings = make_settings(db.url, tmp_path, partitions_ahead_days=60, partition_days=3)
    created = await create_partitions_ahead(db.write, settings, now)
    after = await _names(db, "events")
    new_events = [n for n in after if n not in before]
    assert new_events and {n for n in created if n.startswith("events_")} == set(new_events)
    assert any(n.startswith("steps_p") for n in created)
    assert any(n.startswith("runs_archive_p") for n in created)
    async with db.read() as conn:
        parts = [p for p in await qp.list_partitions(conn, "events") if not p.is_default]
        # Contiguous, the new ones 3 days wide, the last covering now + 60 days.
        for a, b in itertools.pairwise(parts):
            assert a.upper == b.lower
        assert parts[-1].ends is not None and parts[-1].ends > now + timedelta(days=60)
        assert parts[-1].starts is not None
        assert parts[-1].ends - parts[-1].starts == timedelta(days=3)
        assert (await conn.execute(text("SELECT count(*) FROM events_default"))).scalar_one() == 0
        home = next(p for p in parts if p.lower is not None and p.lower <= run_id < p.upper)  # type: ignore[operator]
        moved = await conn.execute(text(f"SELECT run_id FROM {home.name}"))
        assert [r[0] for r in moved] == [run_id]
        # The moved rows keep their foreign key to runs (the partition inherited it).
        with pytest.raises(IntegrityError):
            async with db.write() as w:
                await w.execute(
                    insert(events).values(
                        run_id=v7_at(far), tenant_id="acme", at=now, kind="step_started"
                    )
                )
    # Idempotent: nothing more to create.
    assert await create_partitions_ahead(db.write, settings, now) == []


async def _insert_run(
    db: Database,
    run_id: uuid.UUID,
    *,
    created: datetime,
    finished: datetime | None,
    status: str = "completed",
) -> None:
    async with db.write() as conn:
        await conn.execute(
            insert(runs).values(
                run_id=run_id,
                tenant_id="acme",
                workflow="wf",
                version="1",
                status=status,
                input=json.dumps({"n": 1}),
                created_by="seed",
                created_at=created,
                updated_at=finished or created,
                finished_at=finished,
            )
        )


async def _insert_children(
    db: Database, run_ids: list[uuid.UUID], *, at: datetime, steps_per_run: int = 2
) -> None:
    async with db.write() as conn:
        await conn.execute(
            insert(steps),
            [
                {
                    "run_id": rid,
                    "step_id": f"s{k}",
                    "tenant_id": "acme",
                    "seq": k,
                    "kind": "step",
                    "name": "act",
                    "status": "succeeded",
                    "attempt": 1,
                    "max_attempts": 3,
                    "output": '"r"',
                    "created_at": at,
                    "fence": 1,
                }
                for rid in run_ids
                for k in range(steps_per_run)
            ],
        )
        await conn.execute(
            insert(events),
            [
                {"run_id": rid, "tenant_id": "acme", "at": at, "kind": "step_succeeded"}
                for rid in run_ids
            ],
        )


async def _old_week(db: Database, weeks_ago: int) -> tuple[datetime, datetime]:
    """Create (in all three tables) the partition of the week ``weeks_ago`` weeks back."""
    now = await db.now()
    async with db.read() as conn:
        first = (await qp.list_partitions(conn, "steps"))[0].starts
    assert first is not None
    lo = first - timedelta(days=7 * weeks_ago)
    hi = lo + timedelta(days=7)
    async with db.write() as conn:
        for table in ("steps", "events", "runs_archive"):
            await qp.create_partition(conn, table, lo, hi)
    assert lo < now
    return lo, hi


async def test_archival_drops_whole_partitions_and_deletes_rows_of_partial_ones(
    db: Database, tmp_path: Path
) -> None:
    _pg(db)
    now = await db.now()
    # Week A (10 weeks back): every run finished 50 days ago -> its partitions are dropped.
    a_lo, _ = await _old_week(db, 10)
    # Week B (9 weeks back): finished runs and one still running -> rows deleted one by one.
    b_lo, _ = await _old_week(db, 9)
    finished = now - timedelta(days=50)
    week_a = [v7_at(a_lo + timedelta(hours=i)) for i in range(20)]
    week_b = [v7_at(b_lo + timedelta(hours=i)) for i in range(10)]
    live = v7_at(b_lo + timedelta(hours=30))
    for rid in week_a + week_b:
        await _insert_run(db, rid, created=a_lo, finished=finished)
    await _insert_run(db, live, created=b_lo, finished=None, status="running")
    await _insert_children(db, [*week_a, *week_b, live], at=finished)

    report = await run_maintenance(db, make_settings(db.url, tmp_path), tiers=[Tier.ARCHIVAL])
    archival = report.tiers[0].touched
    assert archival["partitions"] == 2  # steps and events of week A
    assert archival["runs"] == 30
    assert archival["steps"] == 60 and archival["events"] == 30
    names = await _names(db, "steps") + await _names(db, "events")
    assert partition_name("steps", a_lo) not in names
    assert partition_name("events", a_lo) not in names
    assert partition_name("steps", b_lo) in names  # the live run keeps week B
    assert partition_name("runs_archive", a_lo) in await _names(db, "runs_archive")
    async with db.read() as conn:
        archived = await conn.execute(select(func.count()).select_from(runs_archive))
        assert archived.scalar_one() == 30
        kept = await conn.execute(select(steps.c.run_id).where(steps.c.run_id.in_([*week_b, live])))
        assert {r[0] for r in kept} == {live}
        left = await conn.execute(select(runs.c.run_id).where(runs.c.run_id.in_(week_a + week_b)))
        assert left.all() == []
    # Idempotent.
    again = await run_maintenance(db, make_settings(db.url, tmp_path), tiers=[Tier.ARCHIVAL])
    assert again.tiers[0].touched.get("partitions", 0) == 0


async def test_dry_run_counts_rows_and_drops_nothing(db: Database, tmp_path: Path) -> None:
    _pg(db)
    now = await db.now()
    lo, _ = await _old_week(db, 10)
    ids = [v7_at(lo + timedelta(hours=i)) for i in range(5)]
    for rid in ids:
        await _insert_run(db, rid, created=lo, finished=now - timedelta(days=50))
    await _insert_children(db, ids, at=now - timedelta(days=50))
    before = await _names(db, "steps")
    dry = await run_maintenance(
        db, make_settings(db.url, tmp_path), tiers=[Tier.ARCHIVAL], dry_run=True
    )
    assert await _names(db, "steps") == before
    assert dry.tiers[0].touched["steps"] == 10 and "partitions" not in dry.tiers[0].touched
    assert dry.partitions_created == []


async def test_audit_drops_an_events_partition_of_finished_runs(
    db: Database, tmp_path: Path
) -> None:
    _pg(db)
    now = await db.now()
    lo, _ = await _old_week(db, 20)
    old = now - timedelta(days=120)
    ids = [v7_at(lo + timedelta(hours=i)) for i in range(8)]
    for rid in ids:
        await _insert_run(db, rid, created=lo, finished=old)
    await _insert_children(db, ids, at=old)
    # Archival beyond the audit window: audit alone trims the events.
    settings = make_settings(db.url, tmp_path, archival_after_days=400)
    report = await run_maintenance(db, settings, tiers=[Tier.AUDIT])
    assert report.tiers[0].touched["events"] == 8
    assert report.tiers[0].touched["partitions"] == 1
    assert partition_name("events", lo) not in await _names(db, "events")
    assert partition_name("steps", lo) in await _names(db, "steps")
    async with db.read() as conn:
        n = await conn.execute(
            select(func.count()).select_from(steps).where(steps.c.run_id.in_(ids))
        )
        assert n.scalar_one() == 16  # the journal stays: only the timeline is trimmed


async def test_audit_keeps_a_partition_with_a_recent_event(db: Database, tmp_path: Path) -> None:
    _pg(db)
    now = await db.now()
    lo, _ = await _old_week(db, 20)
    old = now - timedelta(days=120)
    ids = [v7_at(lo + timedelta(hours=i)) for i in range(3)]
    for rid in ids:
        await _insert_run(db, rid, created=lo, finished=old)
    await _insert_children(db, ids, at=old)
    async with db.write() as conn:  # one event younger than the audit window
        await conn.execute(
            insert(events).values(run_id=ids[0], tenant_id="acme", at=now, kind="run_requeued")
        )
    settings = make_settings(db.url, tmp_path, archival_after_days=400)
    report = await run_maintenance(db, settings, tiers=[Tier.AUDIT])
    assert "partitions" not in report.tiers[0].touched
    assert report.tiers[0].touched["events"] == 3  # the old ones, row by row
    assert partition_name("events", lo) in await _names(db, "events")


async def test_cli_creates_and_lists_partitions(db: Database, tmp_path: Path) -> None:
    """``treadle maintenance partitions``: PostgreSQL lists ranges and defaults; SQLite none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(
        {
            "TREADLE_DATABASE_URL": db.url,
            "TREADLE_DATA_DIR": str(tmp_path),
            "TREADLE_PARTITIONS_AHEAD_DAYS": "45",
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "maintenance", "partitions", "-o", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    if db.dialect == "sqlite":
        assert doc == {"created": [], "partitions": []}
        return
    tables = {p["table"] for p in doc["partitions"]}
    assert tables == {"steps", "events", "runs_archive"}
    assert {p["name"] for p in doc["partitions"] if p["starts"] is None} == {
        "steps_default", "events_default", "runs_archive_default",
    }  # fmt: skip
    assert doc["created"], "45 days ahead needs more than the migration's 14"
    now = await db.now()
    last = max(datetime.fromisoformat(p["ends"]) for p in doc["partitions"] if p["ends"])
    assert last > now + timedelta(days=45)
    again = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "maintenance", "partitions"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("created 0 partition(s)\n")
    assert "steps_default" in again.stdout and "runs created" in again.stdout


async def test_a_drop_that_cannot_get_its_lock_is_left_for_the_next_run(
    db: Database, tmp_path: Path
) -> None:
    """A long reader on ``steps`` makes the partition drop give up (lock_timeout), not wait.

    The runs are archived row by row instead, and the next run, once the reader is gone,
    drops the emptied partitions.
    """
    _pg(db)
    now = await db.now()
    lo, _ = await _old_week(db, 10)
    ids = [v7_at(lo + timedelta(hours=i)) for i in range(4)]
    for rid in ids:
        await _insert_run(db, rid, created=lo, finished=now - timedelta(days=50))
    await _insert_children(db, ids, at=now - timedelta(days=50))
    settings = make_settings(db.url, tmp_path)
    async with db.engine.connect() as reader:
        await reader.execute(text("SELECT count(*) FROM steps"))  # ACCESS SHARE until rollback
        started = await db.now()
        report = await run_maintenance(db, settings, tiers=[Tier.ARCHIVAL])
        waited = (await db.now() - started).total_seconds()
        await reader.rollback()
    touched = report.tiers[0].touched
    assert "partitions" not in touched
    assert (touched["runs"], touched["steps"], touched["events"]) == (4, 8, 4)
    assert partition_name("steps", lo) in await _names(db, "steps")
    assert waited < 30, "the drop waited for the reader instead of giving up"
    again = await run_maintenance(db, settings, tiers=[Tier.ARCHIVAL])
    assert again.tiers[0].touched["partitions"] == 2
    assert again.tiers[0].touched["runs"] == 0
    assert partition_name("steps", lo) not in await _names(db, "steps")


async def test_a_table_with_no_range_left_starts_again_today(db: Database, tmp_path: Path) -> None:
    _pg(db)
    now = await db.now()
    async with db.write() as conn:
        for p in await qp.list_partitions(conn, "runs_archive"):
            if not p.is_default:
                await qp.drop_partition(conn, p)
    created = await create_partitions_ahead(db.write, make_settings(db.url, tmp_path), now)
    mine = sorted(n for n in created if n.startswith("runs_archive_"))
    assert mine[0] == partition_name("runs_archive", now)
    async with db.read() as conn:
        ranges = [p for p in await qp.list_partitions(conn, "runs_archive") if not p.is_default]
    assert ranges[0].starts == now.replace(hour=0, minute=0, second=0, microsecond=0)
    assert ranges[-1].ends is not None and ranges[-1].ends > now + timedelta(days=14)


async def test_archive_reads_use_its_tenant_leading_key(db: Database) -> None:
    """The archive's two lookups go through ``(tenant_id, run_id)`` (revision 0026).

    ``get_run``'s ``run_archived`` check names the tenant; archival's check of what it
    moved is driven from ``runs`` by id into the archive's key. Both read one partition by
    index, never a sequential scan (docs/adr/0034-tenant-leading-keys.md).
    """
    _pg(db)
    now = await db.now()
    ids = [v7_at(now - timedelta(seconds=s)) for s in range(2000)]
    async with db.write() as conn:
        await conn.execute(
            insert(runs_archive),
            [
                {
                    "run_id": r,
                    "tenant_id": f"t{i % 20}",
                    "workflow": "w",
                    "version": "v1",
                    "status": "succeeded",
                    "input": "{}",
                    "created_by": "alice",
                    "created_at": now,
                    "archived_at": now,
                }
                for i, r in enumerate(ids)
            ],
        )
        await conn.execute(text("ANALYZE runs_archive"))
        await conn.execute(text("ANALYZE runs"))
        # Sequential scans are what would show a key that cannot be used.
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        statements: list[tuple[str, Any]] = []

        def record(conn_: object, cursor: object, sql: str, params: Any, *a: object) -> None:
            if "runs_archive" in sql and sql.lstrip().upper().startswith("SELECT"):
                statements.append((sql, params))

        sync = conn.sync_connection
        assert sync is not None
        sa_event.listen(sync, "before_cursor_execute", record)
        try:
            with pytest.raises(RunArchived):
                await qruns.get_run(conn, "t5", ids[5])
            await qmaint.archive_runs(conn, [("t7", ids[7])])
        finally:
            sa_event.remove(sync, "before_cursor_execute", record)
        assert len(statements) == 2, statements
        for sql, params in statements:
            plan = "\n".join(r[0] for r in await conn.exec_driver_sql("EXPLAIN " + sql, params))
            assert "Seq Scan" not in plan, plan
            # The archive is reached through its key: an index condition on both columns.
            # (Only the archive's scans: ``runs``, empty here, may be read by any index now
            # that archival names the tenant too.)
            conds, scan = [], ""
            for ln in plan.splitlines():
                if " on " in ln and "Scan" in ln:
                    scan = ln.split(" on ", 1)[1].split()[0]
                elif "Index Cond" in ln and scan.startswith("runs_archive"):
                    conds.append(ln)
            assert conds and all("tenant_id" in ln and "run_id" in ln for ln in conds), plan


async def _insert_archived(db: Database, run_ids: list[uuid.UUID], *, finished: datetime) -> None:
    async with db.write() as conn:
        await conn.execute(
            insert(runs_archive),
            [
                {
                    "run_id": rid,
                    "tenant_id": "acme",
                    "workflow": "wf",
                    "version": "1",
                    "status": "completed",
                    "input": "null",
                    "created_by": "seed",
                    "created_at": time_of(rid),
                    "finished_at": finished,
                    "archived_at": finished,
                }
                for rid in run_ids
            ],
        )


async def test_audit_drops_runs_archive_partitions_past_the_window(
    db: Database, tmp_path: Path
) -> None:
    """Archived summaries older than the audit window go with their whole partition.

    Week A: every summary finished 120 days ago -> its runs_archive partition is dropped.
    Week B: one summary finished inside the window -> the partition stays, its old rows go
    row by row. Week C: old summaries, but a run of that week is still in ``runs`` (live)
    -> the partition stays, the old summaries go row by row.
    """
    _pg(db)
    now = await db.now()
    old = now - timedelta(days=120)
    (a_lo, _), (b_lo, _), (c_lo, _) = [await _old_week(db, w) for w in (22, 21, 20)]
    week_a = [v7_at(a_lo + timedelta(hours=i)) for i in range(12)]
    week_b = [v7_at(b_lo + timedelta(hours=i)) for i in range(4)]
    week_c = [v7_at(c_lo + timedelta(hours=i)) for i in range(3)]
    young = v7_at(b_lo + timedelta(hours=50))
    live = v7_at(c_lo + timedelta(hours=60))
    await _insert_archived(db, week_a + week_b + week_c, finished=old)
    await _insert_archived(db, [young], finished=now - timedelta(days=10))
    await _insert_run(db, live, created=c_lo, finished=None, status="running")
    names = await _names(db, "runs_archive")
    assert {partition_name("runs_archive", lo) for lo in (a_lo, b_lo, c_lo)} <= set(names)

    settings = make_settings(db.url, tmp_path, maintenance_batch_size=2)
    dry = await run_maintenance(db, settings, tiers=[Tier.AUDIT], dry_run=True)
    assert dry.tiers[0].touched["runs_archive"] == 19 and "partitions" not in dry.tiers[0].touched
    assert await _names(db, "runs_archive") == names

    report = await run_maintenance(db, settings, tiers=[Tier.AUDIT])
    audit = report.tiers[0].touched
    # runs_archive of week A, and the (empty) events partitions of weeks A and B, whose
    # ranges hold no live run; week C's live run keeps its events partition.
    assert audit["partitions"] == 3
    assert audit["runs_archive"] == 19  # 12 with the partition, 4 + 3 row by row
    left_names = await _names(db, "runs_archive")
    assert partition_name("runs_archive", a_lo) not in left_names
    assert partition_name("runs_archive", b_lo) in left_names
    assert partition_name("runs_archive", c_lo) in left_names
    async with db.read() as conn:
        left = set((await conn.execute(select(runs_archive.c.run_id))).scalars())
        still_live = (await conn.execute(select(runs.c.run_id))).scalars().all()
    assert left == {young}
    assert still_live == [live]
    again = await run_maintenance(db, settings, tiers=[Tier.AUDIT])
    assert again.tiers[0].touched.get("partitions", 0) == 0
    assert again.tiers[0].touched["runs_archive"] == 0
