"""Checks for running behind a transaction pooler (``TREADLE_DB_POOLER=transaction``).

Behind PgBouncer in transaction mode a connection cannot carry ``statement_timeout`` as
a startup parameter (PgBouncer refuses it, see :func:`app.db.database.pg_connect_args`),
so the server must apply it, from the role or the database (``ALTER ROLE … SET
statement_timeout``, docs/deployment.md "Behind PgBouncer"). Nothing would tell an
operator that this step was missed until a runaway statement held its locks for good:
processes look at start-up and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from sqlalchemy import text

from app.core.settings import DbPooler
from app.db.database import Database


async def statement_timeout_mismatch(db: Database) -> str | None:
    """Why the server's ``statement_timeout`` differs from the setting, or None.

    Only behind a transaction pooler (on direct connections the setting is sent at
    connect and cannot differ). One read through the pooler: the value a server
    connection starts with, which is the role's or the database's default.

    Returns:
        A one-line warning naming both values and the fix; None when they agree or
        there is no transaction pooler.
    """
    if db.dialect != "postgresql" or db.settings.db_pooler != DbPooler.TRANSACTION:
        return None
    wanted = int(db.settings.db_statement_timeout_seconds * 1000)
    async with db.read() as conn:
        # pg_settings gives milliseconds as an integer; SHOW would give "30s".
        row = await conn.execute(
            text("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'")
        )
        actual = int(row.scalar_one())
    if actual == wanted:
        return None
    return (
        f"the server's statement_timeout is {actual} ms, "
        f"TREADLE_DB_STATEMENT_TIMEOUT_SECONDS asks for {wanted} ms: behind "
        "TREADLE_DB_POOLER=transaction it is not sent at connect; set it on the role "
        f"(ALTER ROLE <user> SET statement_timeout = {wanted}), see docs/deployment.md"
    )


LISTEN_PROBE_CHANNEL = "treadle_listen_probe"
"""Channel of :func:`notifications_arrive`'s test notification (nobody else listens)."""


async def notifications_arrive(listen_conn: Any, db: Database, timeout: float) -> bool:
    """Whether a NOTIFY sent through ``db`` reaches ``listen_conn`` within ``timeout`` s.

    A worker's LISTEN connection (``TREADLE_LISTEN_DATABASE_URL``) must be a session of
    its own on the primary. Pointed at a transaction-mode pooler, the LISTEN succeeds
    but lands on a server connection the pooler lends to others after the statement, so
    no notification ever reaches the worker; pointed at another server or database, the
    same. Both look healthy, and workers silently fall back to polling. So the worker
    sends one notification on :data:`LISTEN_PROBE_CHANNEL` through its main pool and
    waits for it on ``listen_conn`` (docs/deployment.md, "Behind PgBouncer").

    Args:
        listen_conn: an open ``asyncpg.Connection`` (the LISTEN connection).
        db: the process's database (the NOTIFY goes through its writer pool).
        timeout: seconds to wait for the notification.

    Returns:
        True once it arrived; False after ``timeout``.

    Raises:
        Whatever the LISTEN or the NOTIFY raised (a fault: the caller reconnects).
    """
    token = uuid.uuid4().hex
    arrived = asyncio.Event()

    def heard(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == token:
            arrived.set()

    await listen_conn.add_listener(LISTEN_PROBE_CHANNEL, heard)
    try:
        async with db.autocommit() as conn:
            await conn.execute(
                text("SELECT pg_notify(:channel, :token)"),
                {"channel": LISTEN_PROBE_CHANNEL, "token": token},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), timeout)
        return arrived.is_set()
    finally:
        with contextlib.suppress(Exception):
            await listen_conn.remove_listener(LISTEN_PROBE_CHANNEL, heard)
