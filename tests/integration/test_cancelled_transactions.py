"""A task cancelled inside a write transaction leaves no lock and no write behind.

Workers cancel tasks in the middle of transactions: a step whose lease was lost, the
heartbeat and the other helpers when a worker stops. SQLAlchemy then terminates the
connection. On SQLite (Python 3.11's ``sqlite3``) a connection closed with its transaction
open, while the cancelled frames still hold its cursor, used to keep the database's write
lock until a garbage collection: every other writer waited out its busy timeout
(``app/db/sqlite.py``). The cancelled frames are kept alive here on purpose, as a
traceback kept for logging would keep them.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.db.database import Database
from tests.conftest import make_settings

SLOW = {
    # About a second of work on SQLite's connection thread; cancellation cannot stop it.
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
    "WHERE x < 3000000) SELECT count(*) FROM c",
    "postgresql": "SELECT pg_sleep(1)",
}


@pytest.fixture
async def short_db(database_url: str, tmp_path: Path) -> AsyncIterator[Database]:
    """A database whose writers give up on a held SQLite lock after 2 s, not 30 s.

    The garbage collector is off meanwhile: what a cancellation leaves in reference cycles
    (frames, the cursor they hold) stays, as it does between two collections.
    """
    database = Database(make_settings(database_url, tmp_path, sqlite_busy_timeout_seconds=2.0))
    async with database.write() as conn:
        await conn.execute(text("CREATE TABLE cancel_probe (k VARCHAR(10) PRIMARY KEY)"))
    gc.disable()
    try:
        yield database
    finally:
        gc.enable()
        await database.dispose()


async def _keys(db: Database) -> list[str]:
    async with db.read() as conn:
        return [r[0] for r in await conn.execute(text("SELECT k FROM cancel_probe ORDER BY k"))]


async def _insert(db: Database, key: str) -> None:
    async with db.write() as conn:
        await conn.execute(text("INSERT INTO cancel_probe (k) VALUES (:k)"), {"k": key})


async def test_cancelled_mid_statement_after_a_write(short_db: Database) -> None:
    db = short_db
    caught: list[BaseException] = []
    wrote = asyncio.Event()

    async def writer() -> None:
        try:
            async with db.write() as conn:
                await conn.execute(text("INSERT INTO cancel_probe (k) VALUES ('a')"))
                wrote.set()
                await conn.execute(text(SLOW[db.dialect]))
        except BaseException as exc:
            caught.append(exc)  # keeps the cancelled frames, and the cursor, alive
            raise

    task = asyncio.create_task(writer())
    await wrote.wait()  # the slow statement is on the connection now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught
    # The same key again: blocked by a kept lock, refused if the first insert committed.
    await _insert(db, "a")
    await _insert(db, "b")
    assert await _keys(db) == ["a", "b"]


class _Abandoned(Exception):
    """The exception a cancelled transaction's body ends with, in the test below."""


@pytest.mark.parametrize("pool", ["main", "lease"])
async def test_a_connection_terminated_mid_transaction_keeps_no_lock(
    short_db: Database, pool: str
) -> None:
    """The mechanism itself, on each SQLite pool: terminate with a live statement.

    ``invalidate()`` is what SQLAlchemy does to a connection whose statement was
    cancelled; the open cursor stands for the one the cancelled frames keep.
    """
    db = short_db
    if db.dialect != "sqlite":
        pytest.skip("a closed PostgreSQL connection ends its session, and its locks, at once")
    write = db.write if pool == "main" else db.lease_write
    with pytest.raises(_Abandoned):
        async with write() as conn:
            await conn.execute(text("INSERT INTO cancel_probe (k) VALUES ('a')"))
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            cursor = await driver.execute(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                "WHERE x < 100) SELECT x FROM c"
            )
            assert await cursor.fetchone() == (1,)  # a statement stepped, not finished
            await conn.invalidate()
            raise _Abandoned  # as the cancellation would propagate
    await _insert(db, "a")
    async with db.lease_write() as conn:
        await conn.execute(text("INSERT INTO cancel_probe (k) VALUES ('b')"))
    assert await _keys(db) == ["a", "b"]
    del cursor
