"""Alembic head equals tables.py; concurrent migrations are safe; mismatches refuse to start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, select, text, update

from alembic import command
from app.core.errors import SchemaVersionMismatch
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import alembic_config, check_schema, head_revision
from app.db.tables import metadata, runs
from tests.conftest import DEV_SECRET, _pg_admin, pg_url

ROOT = Path(__file__).resolve().parents[2]


async def test_head_matches_tables(database_url: str) -> None:
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.read() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), metadata
                )
            )
        assert diff == []
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
