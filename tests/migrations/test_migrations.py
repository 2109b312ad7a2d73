"""Alembic head equals tables.py; concurrent migrations are safe; mismatches refuse to start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Uuid, bindparam, insert, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from alembic import command
from app.core.errors import SchemaVersionMismatch
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import alembic_config, check_schema, head_revision
from app.db.partitions import include_name, include_object_for
from app.db.queries import schedules as sched_q
from app.db.tables import (
    batch_items,
    metadata,
    runs,
    runs_archive,
    schedule_fires,
    webhook_attempts,
)
from app.db.types import UtcDateTime
from tests.conftest import DEV_SECRET, _pg_admin, pg_url

ROOT = Path(__file__).resolve().parents[2]


async def test_head_matches_tables(database_url: str) -> None:
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.read() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync,
                        opts={
                            "compare_type": True,
                            "include_name": include_name,
                            "include_object": include_object_for(sync.dialect.name),
                        },
                    ),
                    metadata,
                )
            )
            # Alembic does not compare primary keys: each table's is checked here, with
            # PostgreSQL's own where tables.py names one (events, docs/adr/0036).
            keys = await conn.run_sync(
                lambda sync: {
                    name: inspect(sync).get_pk_constraint(name)["constrained_columns"]
                    for name in metadata.tables
                }
            )
        assert diff == []
        dialect = database_url.split("+")[0].split(":")[0]
        expected = {
            name: list(
                table.info.get(f"{dialect}_primary_key")
                or [c.name for c in table.primary_key.columns]
            )
            for name, table in metadata.tables.items()
        }
        assert keys == expected
        await check_schema(db)  # at head: no error
    finally:
        await db.dispose()


async def test_refuses_schema_behind_and_ahead(database_url: str) -> None:
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.write() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed'"))
        with pytest.raises(SchemaVersionMismatch, match="ahead"):
            await check_schema(db)
        async with db.write() as conn:
            await conn.execute(text("DELETE FROM alembic_version"))
        with pytest.raises(SchemaVersionMismatch, match="treadle migrate"):
            await check_schema(db)
    finally:
        await db.dispose()


def _migrate_concurrently(url: str, tmp: Path) -> None:
    env = {**os.environ, "TREADLE_DATABASE_URL": url, "TREADLE_DATA_DIR": str(tmp)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "migrate"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].decode() for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
        assert f"database at revision {head_revision()}" in out


async def test_concurrent_migrations_postgresql(tmp_path: Path) -> None:
    name = f"mig_{os.getpid()}_{tmp_path.name[-8:]}".replace("-", "_")
    await _pg_admin(f'DROP DATABASE IF EXISTS "{name}"')
    await _pg_admin(f'CREATE DATABASE "{name}"')
    try:
        _migrate_concurrently(pg_url(name), tmp_path)
        db = Database(Settings(database_url=pg_url(name), dev_secret=DEV_SECRET))
        try:
            await check_schema(db)
        finally:
            await db.dispose()
    finally:
        await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_concurrent_migrations_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    _migrate_concurrently(url, tmp_path)
    db = Database(Settings(database_url=url, dev_secret=DEV_SECRET))
    try:
        await check_schema(db)
    finally:
        await db.dispose()


def test_worker_refuses_unmigrated_database(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TREADLE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}",
        "TREADLE_DATA_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "worker", "--handlers", "examples.orders"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert b"refusing to start" in proc.stderr
    assert b"treadle migrate" in proc.stderr


def test_serve_refuses_unmigrated_database(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TREADLE_DATA_DIR": str(tmp_path),  # default database: <data_dir>/treadle.db
        "TREADLE_DEV_SECRET": DEV_SECRET,
    }
    env.pop("TREADLE_DATABASE_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "serve", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert b"refusing to start" in proc.stderr
    assert (tmp_path / "treadle.db").exists()


async def test_0009_gives_active_keyed_runs_slot_one(database_url: str) -> None:
    """Upgrading 0008 → 0009 gives every active keyed run slot 1; downgrade guards data."""
    cfg = alembic_config(database_url)
    await asyncio.to_thread(command.downgrade, cfg, "0008")
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    ids = {name: uuid.uuid4() for name in ("active", "finished", "unkeyed", "second")}

    def values(name: str, status: str, key: str | None) -> dict[str, object]:
        now = datetime.now(UTC)
        return {
            "run_id": ids[name],
            "tenant_id": "t",
            "workflow": "w",
            "version": "1",
            "status": status,
            "input": "{}",
            "concurrency_key": key,
            "created_by": "s",
            "created_at": now,
            "updated_at": now,
        }

    try:
        async with db.write() as conn:
            for name, status, key in [
                ("active", "waiting_timer", "k"),
                ("finished", "completed", "k"),
                ("unkeyed", "queued", None),
            ]:
                await conn.execute(insert(runs).values(values(name, status, key)))
        await asyncio.to_thread(command.upgrade, cfg, "head")
        async with db.read() as conn:
            rows = (await conn.execute(select(runs.c.run_id, runs.c.concurrency_slot))).all()
        slots = {run_id: slot for run_id, slot in rows}
        assert slots == {ids["active"]: 1, ids["finished"]: None, ids["unkeyed"]: None}

        # Two active runs of one key cannot go back to "one active run per key".
        async with db.write() as conn:
            await conn.execute(insert(runs).values(values("second", "queued", "k")))
            await conn.execute(
                update(runs).where(runs.c.run_id == ids["second"]).values(concurrency_slot=2)
            )
        with pytest.raises(RuntimeError, match="1 concurrency keys have more than one active"):
            await asyncio.to_thread(command.downgrade, cfg, "0008")
        async with db.write() as conn:
            await conn.execute(
                update(runs).where(runs.c.run_id == ids["second"]).values(status="cancelled")
            )
        await asyncio.to_thread(command.downgrade, cfg, "0008")
        await asyncio.to_thread(command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


async def test_0022_backfills_tenant_and_keeps_children(database_url: str) -> None:
    """0021 → 0022 copies each child's tenant from its parent and loses no row (both ways).

    On SQLite a parent's rebuild would cascade-delete its children (foreign_keys=ON), so
    this also guards the migration's stash of them (docs/adr/0034-tenant-leading-keys.md).
    """
    cfg = alembic_config(database_url)
    await asyncio.to_thread(command.downgrade, cfg, "0021")
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    batch, run, delivery, endpoint = (uuid.uuid4() for _ in range(4))
    now = datetime.now(UTC)
    typed = [
        bindparam("b", type_=Uuid),
        bindparam("r", type_=Uuid),
        bindparam("d", type_=Uuid),
        bindparam("e", type_=Uuid),
        bindparam("now", type_=UtcDateTime),
    ]
    ids = {"b": batch, "r": run, "d": delivery, "e": endpoint, "now": now}
    try:
        async with db.write() as conn:
            for sql in (
                "INSERT INTO batches (batch_id, tenant_id, action, selection, params, "
                "created_by, state, matched, created_at, updated_at) VALUES "
                "(:b, 'acme', 'cancel', '{}', '{}', 's', 'running', 1, :now, :now)",
                "INSERT INTO batch_items (batch_id, run_id, outcome) VALUES (:b, :r, 'done')",
                "INSERT INTO webhook_deliveries (delivery_id, tenant_id, endpoint_id, run_id, "
                "workflow, run_status, finished_at, state, created_at, updated_at) VALUES "
                "(:d, 'acme', :e, :r, 'w', 'completed', :now, 'pending', :now, :now)",
                "INSERT INTO webhook_attempts (delivery_id, attempt, started_at, http_status) "
                "VALUES (:d, 1, :now, 500)",
            ):
                used = [p for p in typed if f":{p.key}" in sql]
                await conn.execute(text(sql).bindparams(*used), {p.key: ids[p.key] for p in used})
        await asyncio.to_thread(command.upgrade, cfg, "head")
        async with db.read() as conn:
            items = (await conn.execute(select(batch_items))).mappings().all()
            attempts = (await conn.execute(select(webhook_attempts))).mappings().all()
        assert [(i["tenant_id"], i["batch_id"], i["run_id"], i["outcome"]) for i in items] == [
            ("acme", batch, run, "done")
        ]
        assert [(a["tenant_id"], a["delivery_id"], a["http_status"]) for a in attempts] == [
            ("acme", delivery, 500)
        ]
        # The composite foreign keys cascade as the single-column ones did.
        async with db.write() as conn:
            await conn.execute(text("DELETE FROM batches"))
            assert (await conn.execute(select(batch_items))).first() is None
        await asyncio.to_thread(command.downgrade, cfg, "0021")
        async with db.read() as conn:
            kept = (await conn.execute(text("SELECT attempt FROM webhook_attempts"))).all()
        assert [tuple(r) for r in kept] == [(1,)]
        await asyncio.to_thread(command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


async def _index_sql(db: Database, name: str) -> str:
    """The ``CREATE INDEX`` text the database holds for ``name`` (either dialect)."""
    sql = (
        "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
        if db.dialect == "postgresql"
        else "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
    )
    async with db.read() as conn:
        return str((await conn.execute(text(sql), {"n": name})).scalar_one())


async def _migrate(db: Database, step: Any, cfg: Any, target: str) -> None:
    """Close ``db``'s pooled connections, then run ``step`` (upgrade/downgrade) to ``target``.

    A SQLite connection prepares against the schema it last read, so one opened before
    a table was rebuilt would refuse ``ON CONFLICT`` on the new key; processes never see
    that (they refuse to start on another revision), only a test that spans a migration.
    """
    await db.dispose()
    await asyncio.to_thread(step, cfg, target)


async def test_0024_keeps_fires_and_takes_the_schedules_tenant(database_url: str) -> None:
    """0024 and back keep every fire, each with its schedule's tenant; keys cascade as before.

    On SQLite the schedules' rebuild would cascade-delete their fires (foreign_keys=ON),
    so this also guards the migration's stash of them; one fire carries a tenant that
    disagrees with its schedule's (only a hand edit could write it) and must come out
    with the schedule's, or the composite foreign key could not hold
    (docs/adr/0034-tenant-leading-keys.md, revision 0024).
    """
    cfg = alembic_config(database_url)
    before = "0024-1"  # the revision 0024 upgrades from, however the chain is numbered
    await asyncio.to_thread(command.downgrade, cfg, before)
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    acme, globex, run = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
    ticks = [now - timedelta(minutes=m) for m in (2, 1)]
    typed = [
        bindparam("s", type_=Uuid),
        bindparam("r", type_=Uuid),
        bindparam("tick", type_=UtcDateTime),
        bindparam("now", type_=UtcDateTime),
    ]
    schedule = (
        "INSERT INTO schedules (schedule_id, tenant_id, name, workflow, input, cron, "
        "timezone, overlap, catchup_window_seconds, jitter_seconds, state, buffered_tick_at, "
        "created_by, created_at, updated_at) VALUES (:s, :t, 'nightly', 'w', '{}', "
        "'* * * * *', 'UTC', 'buffer_one', 60, 0, 'active', :tick, 'alice', :now, :now)"
    )
    fire = (
        "INSERT INTO schedule_fires (schedule_id, tick, tenant_id, kind, outcome, run_id, "
        "fired_at, fired_by) VALUES (:s, :tick, :t, 'cron', 'started', :r, :now, 'sched')"
    )
    rows = [
        (schedule, {"s": acme, "t": "acme", "tick": ticks[1]}),
        (schedule, {"s": globex, "t": "globex", "tick": None}),
        (fire, {"s": acme, "t": "acme", "tick": ticks[0], "r": run}),
        (fire, {"s": acme, "t": "acme", "tick": ticks[1], "r": None}),
        (fire, {"s": globex, "t": "acme", "tick": ticks[0], "r": None}),  # disagrees
    ]
    try:
        async with db.write() as conn:
            for sql, values in rows:
                used = [p for p in typed if f":{p.key}" in sql]
                await conn.execute(text(sql).bindparams(*used), {"now": now, **values})
        await _migrate(db, command.upgrade, cfg, "head")
        async with db.read() as conn:
            fires = (await conn.execute(select(schedule_fires))).mappings().all()
        assert sorted(
            (f["tenant_id"], f["schedule_id"], f["tick"], f["run_id"]) for f in fires
        ) == sorted(
            [
                ("acme", acme, ticks[0], run),
                ("acme", acme, ticks[1], None),
                ("globex", globex, ticks[0], None),
            ]
        )
        # The rebuild kept both partial predicates (the scheduler's scans depend on them).
        assert "WHERE" in (await _index_sql(db, "ix_schedules_due"))
        assert "buffered_tick_at IS NOT NULL" in (await _index_sql(db, "ix_schedules_buffered"))
        async with db.write() as conn:
            # A tick still fires once: ON CONFLICT now arbitrates on the new primary key.
            again = await sched_q.insert_fire(
                conn,
                schedule_id=acme,
                tenant_id="acme",
                tick=ticks[0],
                kind="cron",
                outcome="started",
                fired_at=now,
                fired_by="sched",
            )
            assert again is False
            # The composite foreign key cascades as the single-column one did.
            await conn.execute(
                text("DELETE FROM schedules WHERE schedule_id = :s").bindparams(typed[0]),
                {"s": globex},
            )
            left = (await conn.execute(select(schedule_fires.c.schedule_id))).scalars().all()
            assert sorted(left) == [acme, acme]
        await _migrate(db, command.downgrade, cfg, before)
        async with db.read() as conn:
            kept = (await conn.execute(text("SELECT tenant_id FROM schedule_fires"))).all()
        assert [tuple(r) for r in kept] == [("acme",), ("acme",)]
        await _migrate(db, command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


async def test_0026_keeps_the_archive_under_its_tenant_leading_key(database_url: str) -> None:
    """0026 and back keep every archived run; the new key refuses a second (tenant, run).

    On PostgreSQL the archive is partitioned (revision 0023), so the key must come out on
    every partition, the default one included, with the rows that were in it
    (docs/adr/0034-tenant-leading-keys.md, revision 0026).
    """
    cfg = alembic_config(database_url)
    before = "0026-1"  # the revision 0026 upgrades from, however the chain is numbered
    await asyncio.to_thread(command.downgrade, cfg, before)
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    now = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
    archived = [(uuid.uuid4(), "acme"), (uuid.uuid4(), "acme"), (uuid.uuid4(), "globex")]
    row = text(
        "INSERT INTO runs_archive (run_id, tenant_id, workflow, version, status, input, "
        "created_by, created_at, archived_at) VALUES (:r, :t, 'w', 'v1', 'succeeded', '{}', "
        "'alice', :now, :now)"
    ).bindparams(bindparam("r", type_=Uuid), bindparam("now", type_=UtcDateTime))

    async def kept() -> list[tuple[uuid.UUID, str]]:
        async with db.read() as conn:
            got = await conn.execute(select(runs_archive.c.run_id, runs_archive.c.tenant_id))
            return sorted((r[0], r[1]) for r in got)

    try:
        async with db.write() as conn:
            for run_id, tenant in archived:
                await conn.execute(row, {"r": run_id, "t": tenant, "now": now})
        await _migrate(db, command.upgrade, cfg, "head")
        assert await kept() == sorted(archived)
        async with db.read() as conn:
            key = await conn.run_sync(
                lambda sync: inspect(sync).get_pk_constraint("runs_archive")["constrained_columns"]
            )
            assert key == ["tenant_id", "run_id"]
            if database_url.startswith("postgresql"):
                # Every partition carries the new key (ALTER TABLE on the parent reaches them).
                parts = (
                    await conn.execute(
                        text(
                            "SELECT c.relname, pg_get_constraintdef(k.oid) FROM pg_inherits i "
                            "JOIN pg_class c ON c.oid = i.inhrelid "
                            "JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'p' "
                            "WHERE i.inhparent = 'runs_archive'::regclass"
                        )
                    )
                ).all()
                assert parts
                assert {d for _, d in parts} == {"PRIMARY KEY (tenant_id, run_id)"}
        with pytest.raises(IntegrityError):
            async with db.write() as conn:
                await conn.execute(row, {"r": archived[0][0], "t": "acme", "now": now})
        await _migrate(db, command.downgrade, cfg, before)
        assert await kept() == sorted(archived)
        await _migrate(db, command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


# Every table with a foreign key to runs (revision 0027), with an INSERT of one row of it
# for run :r of tenant :t, and the columns that identify a row across the migration.
_RUN_CHILDREN: dict[str, tuple[str, tuple[str, ...]]] = {
    "run_labels": (
        "INSERT INTO run_labels (run_id, tenant_id, key, value) VALUES (:r, :t, :n, 'v')",
        ("key", "value"),
    ),
    "steps": (
        "INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt, "
        "max_attempts, created_at, fence) VALUES (:r, :n, :t, :s, 'activity', 'f', "
        "'completed', 1, 3, :now, 1)",
        ("step_id", "seq"),
    ),
    "events": (
        "INSERT INTO events (run_id, tenant_id, at, kind, data) VALUES (:r, :t, :now, "
        "'run_started', :n)",
        ("event_id", "data"),
    ),
    "dead_letters": (
        "INSERT INTO dead_letters (dead_letter_id, run_id, tenant_id, workflow, reason, "
        "status, created_at) VALUES (:d, :r, :t, 'w', :n, 'pending', :now)",
        ("dead_letter_id", "reason"),
    ),
    "signals": (
        "INSERT INTO signals (run_id, tenant_id, name, sent_by, received_at) VALUES "
        "(:r, :t, :n, 'alice', :now)",
        ("signal_id", "name"),
    ),
    "approval_decisions": (
        "INSERT INTO approval_decisions (run_id, step_id, tenant_id, decided_by, decision, "
        "decided_at) VALUES (:r, 'gate', :t, :n, 'approve', :now)",
        ("step_id", "decided_by"),
    ),
    "run_logs": (
        "INSERT INTO run_logs (tenant_id, run_id, seq, origin, at, level, message) VALUES "
        "(:t, :r, :s, :n, :now, 'info', '\"hi\"')",
        ("id", "seq", "origin"),
    ),
    "event_waits": (
        "INSERT INTO event_waits (run_id, step_id, tenant_id, name, match, since, status) "
        "VALUES (:r, :n, :t, 'paid', '{}', :now, 'waiting')",
        ("step_id", "status"),
    ),
}


async def test_0027_keeps_every_run_child_under_its_runs_tenant(database_url: str) -> None:
    """0027 and back keep every run and child row, each with its run's tenant; keys hold.

    On SQLite the rebuild of ``runs`` would cascade-delete every child (foreign_keys=ON),
    so this also guards the migration's stash of them. One child row of each table
    carries a tenant that disagrees with its run's (only a hand edit could write it) and
    must come out with the run's, or the composite foreign key could not hold
    (docs/adr/0034-tenant-leading-keys.md, revision 0027).
    """
    from app.core.ids import new_run_id
    from app.db.queries import approvals as approvals_q
    from app.db.queries import run_labels as labels_q

    cfg = alembic_config(database_url)
    before = "0027-1"  # the revision 0027 upgrades from, however the chain is numbered
    await asyncio.to_thread(command.downgrade, cfg, before)
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    now = datetime(2026, 12, 3, 11, 0, tzinfo=UTC)
    acme, globex = new_run_id(), new_run_id()
    typed = [
        bindparam("r", type_=Uuid),
        bindparam("d", type_=Uuid),
        bindparam("now", type_=UtcDateTime),
    ]
    run_sql = (
        "INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, created_by, "
        "created_at, updated_at) VALUES (:r, :t, 'w', 'v1', 'running', '{}', 'alice', :now, "
        ":now)"
    )
    # (run, the tenant the child row says, a distinguishing value); the last disagrees.
    rows = [(acme, "acme", "a1"), (acme, "acme", "a2"), (globex, "globex", "g1")]
    rows.append((globex, "acme", "g2"))

    async def children() -> dict[str, list[tuple[Any, ...]]]:
        async with db.read() as conn:
            out: dict[str, list[tuple[Any, ...]]] = {}
            for table, (_, cols) in _RUN_CHILDREN.items():
                got = await conn.execute(
                    text(f"SELECT tenant_id, run_id, {', '.join(cols)} FROM {table}").columns(
                        run_id=Uuid
                    )
                )
                out[table] = sorted((tuple(map(str, r)) for r in got), key=str)
            return out

    try:
        async with db.write() as conn:
            for run_id, tenant in ((acme, "acme"), (globex, "globex")):
                stmt = text(run_sql).bindparams(typed[0], typed[2])
                await conn.execute(stmt, {"r": run_id, "t": tenant, "now": now})
            for sql, _ in _RUN_CHILDREN.values():
                used = [p for p in typed if f":{p.key}" in sql]
                for seq, (run_id, tenant, n) in enumerate(rows, start=1):
                    values = {"r": run_id, "t": tenant, "n": n, "d": uuid.uuid4(), "now": now}
                    values["s"] = seq
                    await conn.execute(
                        text(sql).bindparams(*used),
                        {k: v for k, v in values.items() if f":{k}" in sql},
                    )
        seen = await children()
        # What each row must say after the upgrade: its run's tenant.
        fixed = {
            table: sorted(
                (("globex" if r[1] == str(globex) else "acme", *r[1:]) for r in got), key=str
            )
            for table, got in seen.items()
        }
        assert all(len(got) == len(rows) for got in seen.values())
        assert fixed != seen  # the disagreeing rows are there to be fixed
        await _migrate(db, command.upgrade, cfg, "head")
        assert await children() == fixed
        async with db.read() as conn:
            keys = await conn.run_sync(
                lambda sync: {
                    t: inspect(sync).get_pk_constraint(t)["constrained_columns"]
                    for t in ("runs", *_RUN_CHILDREN)
                }
            )
            foreign = await conn.run_sync(
                lambda sync: {
                    t: [
                        (fk["constrained_columns"], fk["referred_columns"])
                        for fk in inspect(sync).get_foreign_keys(t)
                    ]
                    for t in _RUN_CHILDREN
                }
            )
        assert keys["runs"] == ["tenant_id", "run_id"]
        assert all(k[0] == "tenant_id" for t, k in keys.items() if t not in _ROWID), keys
        for table, fks in foreign.items():
            assert fks == [(["tenant_id", "run_id"], ["tenant_id", "run_id"])], table
        if database_url.startswith("postgresql"):
            # Every partition of steps and events carries the new key.
            async with db.read() as conn:
                parts = (
                    await conn.execute(
                        text(
                            "SELECT i.inhparent::regclass::text, pg_get_constraintdef(k.oid) "
                            "FROM pg_inherits i JOIN pg_constraint k ON k.conrelid = "
                            "i.inhrelid AND k.contype = 'p' WHERE i.inhparent IN "
                            "('steps'::regclass, 'events'::regclass)"
                        )
                    )
                ).all()
            assert {p for p, _ in parts} == {"steps", "events"}
            assert {(p, d) for p, d in parts} == {
                ("steps", "PRIMARY KEY (tenant_id, run_id, step_id)"),
                ("events", "PRIMARY KEY (tenant_id, run_id, event_id)"),
            }
        async with db.write() as conn:
            # The upserts arbitrate on the new keys: a second decision is refused, a label
            # replaced (an ON CONFLICT naming another key would raise).
            again = await approvals_q.insert_decision(
                conn,
                run_id=acme,
                step_id="gate",
                tenant_id="acme",
                decided_by="a1",
                decision="reject",
                payload=None,
                comment=None,
            )
            assert again is False
            await labels_q.set_label(conn, run_id=acme, tenant_id="acme", key="a1", value="b")
        # A second row for one (tenant, run, key) is refused (the seq is new, the key not).
        for sql, _ in (_RUN_CHILDREN["steps"], _RUN_CHILDREN["run_labels"]):
            used = [p for p in typed if f":{p.key}" in sql]
            again_values = {"r": acme, "t": "acme", "n": "a1", "s": 9, "now": now}
            with pytest.raises(IntegrityError):
                async with db.write() as conn:
                    await conn.execute(
                        text(sql).bindparams(*used),
                        {k: v for k, v in again_values.items() if f":{k}" in sql},
                    )
        # The composite foreign keys cascade as the single-column ones did.
        async with db.write() as conn:
            await conn.execute(
                text("DELETE FROM runs WHERE run_id = :r").bindparams(typed[0]), {"r": globex}
            )
        left = await children()
        assert all({r[1] for r in got} == {str(acme)} for got in left.values()), left
        await _migrate(db, command.downgrade, cfg, before)
        kept = await children()
        assert {t: len(got) for t, got in kept.items()} == {t: 2 for t in _RUN_CHILDREN}
        assert all({r[0] for r in got} == {"acme"} for got in kept.values())
        await _migrate(db, command.upgrade, cfg, "head")
        await check_schema(db)
    finally:
        await db.dispose()


# The children whose SQLite key is the autoincrement rowid (PostgreSQL's leads with tenant).
_ROWID = {"events": "event_id", "signals": "signal_id", "run_logs": "id"}
