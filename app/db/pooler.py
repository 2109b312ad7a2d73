"""Checks for running behind a transaction pooler (``TREADLE_DB_POOLER=transaction``).

Behind PgBouncer in transaction mode a connection cannot carry ``statement_timeout`` as
a startup parameter (PgBouncer refuses it, see :func:`app.db.database.pg_connect_args`),
so the server must apply it, from the role or the database (``ALTER ROLE … SET
statement_timeout``, docs/deployment.md "Behind PgBouncer"). Nothing would tell an
operator that this step was missed until a runaway statement held its locks for good:
processes look at start-up and say so.
"""

from __future__ import annotations

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
