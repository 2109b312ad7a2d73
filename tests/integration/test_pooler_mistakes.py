"""PgBouncer in transaction mode without ``TREADLE_DB_POOLER=transaction``: one clear line.

Without the setting, every connection carries ``statement_timeout`` as a startup
parameter, which PgBouncer refuses (SQLSTATE 08P01, a class the fault rules call
``unavailable``, so it used to be retried as an outage); later, named prepared
statements go missing (26000) or collide (42P05). ``treadle serve`` and ``treadle
worker`` refuse to start at once naming the setting (exit 2), and a process that meets
such an error later logs it once (docs/deployment.md, "Behind PgBouncer").
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.core.settings import DbPooler
from app.db import database as database_module
from app.db.database import Database
from app.db.faults import POOLER_HINT, pooler_mistake
from app.db.pooler import notifications_arrive
from tests.acceptance.conftest import ROOT, cli_run, free_port
from tests.conftest import DEV_SECRET, POOLED, make_settings

PGBOUNCER_ONLY = pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)


@PGBOUNCER_ONLY
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_serve_and_worker_refuse_to_start_naming_the_setting(
    database_url: str, command: str, tmp_path: Path
) -> None:
    args = {
        "serve": ["serve", "--port", str(free_port())],
        "worker": ["worker", "--handlers", "tests.acceptance.handlers"],
    }[command]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")},
        "TREADLE_DATABASE_URL": database_url,  # through PgBouncer, no TREADLE_DB_POOLER
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_DATA_DIR": str(tmp_path / "data"),
        "TREADLE_LOG_FORMAT": "json",
        "PYTHONPATH": str(ROOT),
    }
    done = cli_run(env, *args, timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "database fault at start; retrying" not in done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("refusing to start: TREADLE_DATABASE_URL looks like a "), last
    assert "TREADLE_DB_POOLER=transaction" in last
    assert "unsupported startup parameter" in last


@PGBOUNCER_ONLY
async def test_a_pooler_error_met_later_is_logged_once_naming_the_setting(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database_module, "_pooler_mistake_logged", False)
    db = Database(make_settings(database_url, tmp_path, db_pooler=DbPooler.NONE))
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                with pytest.raises(DBAPIError):
                    async with db.read() as conn:
                        await conn.execute(text("SELECT 1"))
        named = [e for e in logs if e["event"].startswith(POOLER_HINT)]
        assert len(named) == 1, logs
        assert named[0]["log_level"] == "error"
    finally:
        await db.dispose()


@PGBOUNCER_ONLY
async def test_missing_and_duplicate_prepared_statements_are_recognized(
    database_url: str,
) -> None:
    # The two later symptoms, produced for real on one direct connection.
    conn = await asyncpg.connect(POOLED[database_url].replace("+asyncpg", ""))
    try:
        with pytest.raises(asyncpg.InvalidSQLStatementNameError) as missing:
            await conn.execute("EXECUTE __asyncpg_stmt_1__")
        await conn.execute("PREPARE __asyncpg_stmt_2__ AS SELECT 1")
        with pytest.raises(asyncpg.DuplicatePreparedStatementError) as duplicate:
            await conn.execute("PREPARE __asyncpg_stmt_2__ AS SELECT 1")
    finally:
        await conn.close()
    for err in (missing.value, duplicate.value):
        hint = pooler_mistake(err)
        assert hint is not None and hint.startswith(POOLER_HINT), err
    assert pooler_mistake(asyncpg.UndefinedTableError("relation x does not exist")) is None


@PGBOUNCER_ONLY
async def test_a_listen_through_the_pooler_is_told_apart_from_a_direct_one(
    database_url: str, tmp_path: Path
) -> None:
    db = Database(make_settings(database_url, tmp_path))  # pooled, TREADLE_DB_POOLER set
    direct = await asyncpg.connect(POOLED[database_url].replace("+asyncpg", ""))
    pooled = await asyncpg.connect(database_url.replace("+asyncpg", ""), statement_cache_size=0)
    try:
        assert await notifications_arrive(direct, db, timeout=30)
        # The pooler's LISTEN succeeded and hears nothing.
        assert not await notifications_arrive(pooled, db, timeout=2)
    finally:
        await direct.close()
        await pooled.close()
        await db.dispose()
