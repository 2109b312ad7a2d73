"""Hot statements on the raw driver (app/db/raw.py), against a real PostgreSQL.

A :class:`RawStatement` runs on the asyncpg connection under a pooled SQLAlchemy one, so
what SQLAlchemy did around a failed statement is ours to do: these tests provoke each
case on the server (a terminated backend, a deadlock SQLSTATE raised by the server, a
value the driver cannot encode, a caller's error) and check what the caller sees, what
:func:`app.db.faults.classify` names it, and what the pool does next. They also pin that
the positional binding matches the names, through PgBouncer in transaction mode as well
(unnamed statements there).
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from sqlalchemy import Uuid, bindparam, text

from app.core.settings import Settings
from app.db.database import Database
from app.db.faults import DbFault, classify, describe
from app.db.raw import RawStatement
from app.db.types import UtcDateTime
from tests.conftest import WITH_PGBOUNCER
from tests.helpers import wait_for

PG_ONLY = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

ECHO = RawStatement.of(
    text(
        "SELECT i.n, i.label, CAST(:tag AS text) AS tag"
        " FROM unnest(CAST(:n AS int[]), CAST(:label AS text[])) AS i(n, label)"
        " ORDER BY i.n"
    )
)


def test_compiles_to_positional_placeholders_in_the_order_of_their_names() -> None:
    assert ECHO.names == ("tag", "n", "label")
    assert "$1" in ECHO.sql and "$3" in ECHO.sql and ":n" not in ECHO.sql
    assert ECHO.arguments({"n": [1], "label": ["a"], "tag": "t"}) == ["t", [1], ["a"]]
    with pytest.raises(KeyError):
        ECHO.arguments({"n": [1], "label": ["a"]})


def test_refuses_a_clause_whose_parameters_need_bind_processing() -> None:
    # A TypeDecorator converts its values before the driver sees them; an expanding
    # parameter is rendered into the SQL at execution. Neither can run raw.
    typed = text("SELECT :at").bindparams(bindparam("at", type_=UtcDateTime()))
    expanding = text("SELECT 1 WHERE 1 IN :ids").bindparams(bindparam("ids", expanding=True))
    for clause in (typed, expanding):
        with pytest.raises(ValueError, match="bind processing"):
            RawStatement.of(clause)
    # A type asyncpg encodes itself needs nothing: allowed.
    assert RawStatement.of(text("SELECT :r").bindparams(bindparam("r", type_=Uuid()))).names == (
        "r",
    )


@WITH_PGBOUNCER
async def test_rows_come_back_bound_by_name(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("the raw driver is the PostgreSQL path")
    async with db.autocommit() as conn:
        # Twice on one connection: the second call reuses the prepared statement (or,
        # behind the pooler, Parses the unnamed one again).
        for _ in range(2):
            rows = await ECHO.fetch(conn, {"n": [2, 1], "label": ["b", "a"], "tag": "ünï\u200b"})
            assert [tuple(r) for r in rows] == [(1, "a", "ünï\u200b"), (2, "b", "ünï\u200b")]


@PG_ONLY
async def test_server_errors_are_classified_as_sqlalchemys_are(db: Database) -> None:
    deadlock = RawStatement.of(
        text("DO $$ BEGIN RAISE EXCEPTION 'provoked' USING ERRCODE = '40P01'; END $$")
    )
    caller = RawStatement.of(text("SELECT CAST(:v AS int) / 0"))
    async with db.autocommit() as conn:
        with pytest.raises(asyncpg.PostgresError) as raised:
            await deadlock.fetch(conn, {})
        assert classify(raised.value) == DbFault.DEADLOCK
        assert describe(raised.value) == "provoked (SQLSTATE 40P01)"
        # The caller's own mistakes are not faults: division by zero, a value the
        # driver cannot encode for an int parameter.
        with pytest.raises(asyncpg.PostgresError) as raised:
            await caller.fetch(conn, {"v": 1})
        assert raised.value.sqlstate == "22012" and classify(raised.value) is None
        with pytest.raises(asyncpg.DataError) as bad_value:
            await caller.fetch(conn, {"v": "one"})
        assert classify(bad_value.value) is None
        # The connection is still good after errors that were not disconnects.
        assert [tuple(r) for r in await ECHO.fetch(conn, {"n": [7], "label": ["x"], "tag": ""})]


@PG_ONLY
async def test_a_disconnect_invalidates_the_connection_and_the_older_pooled_ones(
    settings: Settings,
) -> None:
    # Without pre-ping, as workers run: a dead pooled connection is met by the first
    # statement on it, and that statement is a raw one here.
    db = Database(settings, pre_ping=False)
    try:
        async with db.autocommit() as first, db.autocommit() as second:
            pids = [
                (await c.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                for c in (first, second)
            ]
        admin = await asyncpg.connect(db.url.replace("postgresql+asyncpg", "postgresql"))
        try:
            await admin.execute("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p", pids)

            async def gone() -> bool:
                left = await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids
                )
                return bool(left == 0)

            await wait_for(gone, what="the two backends to exit")
        finally:
            await admin.close()
        async with db.autocommit() as conn:
            with pytest.raises(Exception) as raised:
                await ECHO.fetch(conn, {"n": [1], "label": ["a"], "tag": ""})
            assert classify(raised.value) == DbFault.UNAVAILABLE
            assert conn.invalidated
        # The other connection opened before the failure is recycled at its next
        # checkout too (SQLAlchemy's reaction to a disconnect): both answer, from fresh
        # backends, never from a terminated one.
        seen = set()
        async with db.autocommit() as a, db.autocommit() as b:
            for c in (a, b):
                seen.add((await c.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                rows = await ECHO.fetch(c, {"n": [1], "label": ["a"], "tag": ""})
                assert [tuple(r) for r in rows] == [(1, "a", "")]
        assert len(seen) == 2 and not seen & set(pids)
    finally:
        await db.dispose()


@PG_ONLY
async def test_a_closed_connection_is_a_fault_not_a_bug(db: Database) -> None:
    async with db.autocommit() as conn:
        fairy = await conn.get_raw_connection()
        driver = fairy.driver_connection
        assert driver is not None
        await driver.close()  # closed under the pool's feet
        with pytest.raises(asyncpg.InterfaceError) as raised:
            await ECHO.fetch(conn, {"n": [1], "label": ["a"], "tag": ""})
        assert classify(raised.value) == DbFault.UNAVAILABLE
        assert conn.invalidated
    run_id = uuid.uuid4()
    async with db.autocommit() as conn:  # the pool hands out a working connection again
        assert (
            await conn.execute(text("SELECT CAST(:r AS uuid)"), {"r": run_id})
        ).scalar() == run_id


@PG_ONLY
async def test_refuses_a_connection_in_a_transaction(db: Database) -> None:
    # The adapter's BEGIN would come after the raw statement: it would commit on its own.
    async with db.write() as conn:
        with pytest.raises(ValueError, match="autocommit"):
            await ECHO.fetch(conn, {"n": [1], "label": ["a"], "tag": ""})
