"""Hot statements on the raw driver: a ``TextClause`` run by asyncpg itself, on a pooled connection.

A statement executed through SQLAlchemy's ``AsyncConnection.execute`` pays, per call, for
the cache-key walk of the clause, an execution context, the greenlet bridge into the
synchronous core, the adapter's cursor and a result object, about as much CPU again as
asyncpg's own bind and execute (docs/benchmarks.md, "Where the time goes now"). For the
few statements a worker sends for every step (the group-committed checkpoint batches of
app/db/group_commit.py) that is paid here once, at import: :class:`RawStatement`
compiles the clause for the asyncpg dialect (``$n`` placeholders and the order of their
names) and each call hands the SQL text and the positional values straight to
``asyncpg.Connection.fetch``, whose statement cache prepares it once per connection
(named statements; unnamed, Parsed with every call, behind a transaction pooler, as
``app.db.database.pg_connect_args`` configures the connection).
(docs/adr/0045-raw-driver-hot-statements.md)

The connection still comes from, and goes back to, SQLAlchemy's pool, so pool sizing,
``statement_timeout``, the pool metrics and checkout queueing are unchanged. What
SQLAlchemy would otherwise do on a failed statement is done here:

- a disconnect (the asyncpg connection is closed after the error, the test SQLAlchemy's
  asyncpg dialect makes) invalidates the connection and every pooled connection opened
  before it, as ``Connection._handle_dbapi_exception`` does, so a worker without
  pre-ping meets a restarted server once, not once per pooled connection;
- a transaction pooler's signature errors are named once per process
  (:func:`app.db.database.note_pooler_mistake`);
- the error itself propagates as asyncpg raised it: :func:`app.db.faults.classify`
  names asyncpg's own errors as it names SQLAlchemy's wrapped ones.

Only clauses whose parameters need no bind processing qualify (untyped ``:name``
parameters whose values asyncpg encodes itself, given CASTs in the SQL where the server
could not infer a type); :meth:`RawStatement.of` refuses any other at import time.
PostgreSQL only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.database import note_pooler_mistake

_DIALECT = PGDialect_asyncpg()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class RawStatement:
    """One SQL statement compiled for asyncpg: its text and the names of ``$1 … $n``.

    Attributes:
        sql: the statement with asyncpg's ``$n`` placeholders.
        names: the parameter name bound to each placeholder, in order (a name used twice
            in the clause appears once per placeholder SQLAlchemy rendered for it).
    """

    sql: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, clause: TextClause) -> RawStatement:
        """Compile ``clause`` for asyncpg.

        Raises:
            ValueError: a parameter of ``clause`` has a type with a bind processor (a
                ``TypeDecorator``, a typed ``bindparam``): its value would reach asyncpg
                unconverted, so the clause must stay on SQLAlchemy's path.
        """
        compiled = clause.compile(dialect=_DIALECT)
        processors = compiled._bind_processors
        if processors or "POSTCOMPILE" in compiled.string:
            raise ValueError(
                f"RawStatement: parameters {sorted(processors)} need bind processing (or "
                "an expanding one, rendering at execution); bind them untyped, with a "
                "CAST in the SQL, and pass a list as one array parameter"
            )
        return cls(compiled.string, tuple(compiled.positiontup or ()))

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional values for ``params`` (by name); KeyError names a missing one."""
        return [params[name] for name in self.names]

    async def fetch(
        self, conn: AsyncConnection, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        """Run the statement on ``conn``'s asyncpg connection and return its rows.

        ``conn`` must be in autocommit (``Database.autocommit``): the statement is its own
        transaction. Inside ``conn.begin()`` it would not join that transaction, since
        SQLAlchemy's asyncpg adapter sends its ``BEGIN`` lazily, with its own first
        statement, so that is refused rather than left to chance.

        Returns:
            asyncpg ``Record`` rows (index them by position or column name).

        Raises:
            ValueError: ``conn`` is not in autocommit.
            asyncpg's error, unwrapped (:func:`app.db.faults.classify` names its fault);
            on a disconnect the connection is invalidated first (see the module).
        """
        if conn.sync_connection is None or (
            conn.sync_connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT"
        ):
            raise ValueError("RawStatement.fetch needs an autocommit connection")
        fairy = await conn.get_raw_connection()
        driver = fairy.driver_connection
        assert driver is not None  # a checked-out connection always has one
        try:
            rows: Sequence[Sequence[Any]] = await driver.fetch(self.sql, *self.arguments(params))
        except Exception as exc:
            if driver.is_closed():
                # SQLAlchemy's own reaction to a disconnect (is_disconnect of its asyncpg
                # dialect is this same test): the pooled connections opened before this
                # one are recycled at their next checkout (the pool's private call its
                # Connection makes; pinned by tests/integration/test_raw_statements.py),
                # and this one is discarded.
                conn.sync_engine.pool._invalidate(fairy, exc, _checkin=False)
                await conn.invalidate(exc)
            note_pooler_mistake(exc)
            raise
        return rows
