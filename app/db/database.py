"""Connection factory: async engines for PostgreSQL (asyncpg) and SQLite (aiosqlite, WAL).

One :class:`Database` per process, built from settings by the composition root. The engine
owns transaction boundaries: query functions in ``app.db.queries`` take a connection and
never begin or commit.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog
from sqlalchemy import event, select
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from app.core import metrics
from app.core.settings import DbPooler, Settings
from app.db.dialect import now_expr
from app.db.faults import pooler_mistake, retry_conflicts
from app.db.replica import CONNECT_TIMEOUT_SECONDS, ReplicaGate
from app.db.sqlite import RollbackOnCloseConnection
from app.db.wakeups import WakeCoalescer

T = TypeVar("T")

LEASE_POOL_SIZE = 1
"""Connections of the lease pool (:meth:`Database.lease_write`): heartbeats and releases."""


def _sqlite_path(url: str) -> Path | None:
    database = make_url(url).database
    if not database or database == ":memory:":
        return None
    return Path(database)


@functools.cache
def _pool_metrics(pool: str) -> tuple[Any, Any]:
    # Label children looked up once per pool name, not on every checkout: a checkpoint
    # checks a connection out per statement, and ``labels()`` takes a lock each time.
    return metrics.DB_POOL_WAITING.labels(pool), metrics.DB_POOL_WAIT.labels(pool)


def _unnamed_statement() -> str:
    # asyncpg's name for the unnamed prepared statement, which the next Parse replaces.
    return ""


def pg_connect_args(settings: Settings) -> dict[str, Any]:
    """``connect_args`` of a PostgreSQL engine (asyncpg through SQLAlchemy's adapter).

    Direct connections (``TREADLE_DB_POOLER=none``): asyncpg's and SQLAlchemy's
    prepared statement caches stay on, and every connection carries ``statement_timeout``
    = ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS`` as a startup parameter.

    ``TREADLE_DB_POOLER=transaction`` (PgBouncer ``pool_mode=transaction``): both caches
    off and every statement the unnamed one, which asyncpg then Parses again in the same
    message as its Bind and Execute. A transaction pooler may hand each round trip
    outside a transaction to a different server connection, so a named statement
    prepared in one (asyncpg's ``__asyncpg_stmt_N__``, or the uuid names of SQLAlchemy's
    recipe) is missing in the next: measured with PgBouncer 1.18, 80 of 200 concurrent
    autocommit statements failed with the uuid recipe and none with this
    (docs/adr/0032-transaction-pooler.md). No ``statement_timeout`` startup parameter:
    PgBouncer refuses the connection ("unsupported startup parameter"); the role carries
    it instead (docs/deployment.md, "Behind PgBouncer").

    Returns:
        Keyword arguments for ``create_async_engine(connect_args=...)``.
    """
    if settings.db_pooler == DbPooler.TRANSACTION:
        return {
            "statement_cache_size": 0,  # asyncpg's own cache
            "prepared_statement_cache_size": 0,  # SQLAlchemy adapter's cache
            "prepared_statement_name_func": _unnamed_statement,
        }
    timeout_ms = int(settings.db_statement_timeout_seconds * 1000)
    # The server's statement_timeout rather than asyncpg's command_timeout: the server
    # cancels the statement and frees its locks, the connection stays usable, and the
    # error (SQLSTATE 57014) cannot be mistaken for the TimeoutError of a step's own
    # timeout.
    return {"server_settings": {"statement_timeout": str(timeout_ms)}}


_log = structlog.get_logger("treadle.db")
_pooler_mistake_logged = False


def note_pooler_mistake(exc: BaseException) -> None:
    """Log one error naming ``TREADLE_DB_POOLER=transaction`` if ``exc`` is a pooler's mistake.

    A pooler put in front after start, or one told to ignore the ``statement_timeout``
    startup parameter, shows only as scattered prepared-statement errors (see
    :func:`app.db.faults.pooler_mistake`); the first one a process meets is logged as one
    error naming the setting, once per process, so the fix is not buried in per-request
    503s or released runs. Called for every failed statement, by SQLAlchemy's
    ``handle_error`` hook and by the raw driver's statements (app/db/raw.py); never raises.
    """
    global _pooler_mistake_logged
    if _pooler_mistake_logged:
        return
    mistake = pooler_mistake(exc)
    if mistake is not None:
        _pooler_mistake_logged = True
        _log.error(mistake)


def _name_pooler_mistake(context: ExceptionContext) -> None:
    """SQLAlchemy ``handle_error`` hook: :func:`note_pooler_mistake`; the error propagates."""
    note_pooler_mistake(context.original_exception)


class Database:
    """Async engines plus the dialect name.

    ``write()`` opens a transaction that takes the write lock up front on SQLite
    (``BEGIN IMMEDIATE``, so two writers never deadlock upgrading a read lock); ``read()``
    opens a plain transaction that WAL lets run beside a writer. On PostgreSQL both share
    one pool. ``write_retrying(fn)`` is ``write()`` re-run after a deadlock, serialization
    failure or SQLite lock (:mod:`app.db.faults`).

    Pools are bounded (``TREADLE_DB_POOL_SIZE``, no overflow): a caller that finds every
    connection checked out queues for one, up to ``TREADLE_DB_POOL_TIMEOUT_SECONDS``, then
    gets ``sqlalchemy.exc.TimeoutError`` (the API's 503 ``database_busy``). On PostgreSQL
    every connection carries ``statement_timeout`` = ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS``
    (behind a transaction pooler, the role does: :func:`pg_connect_args`).

    ``lease_write()`` uses a pool of its own, one connection (:data:`LEASE_POOL_SIZE`)
    opened on first use, for a worker's heartbeats and lease releases only: no step,
    however long its transaction, can starve them of a connection, and a live worker's
    leases are renewed whatever its main pool is doing (docs/deployment.md, pool sizing).

    ``lagging_read()`` is ``read()`` for reads whose answer may trail the primary (lists,
    counts, reports, gauges: docs/adr/0033-lag-tolerant-reads-on-a-replica.md): with
    ``TREADLE_READ_DATABASE_URL`` set they run on that streaming replica, in a pool of its
    own (``TREADLE_DB_POOL_SIZE`` connections, built on first use), unless it is unreachable
    or too far behind (:class:`app.db.replica.ReplicaGate`); without it they are plain
    ``read()``. Nothing that decides anything may use it.

    Each pool reports its size, connections in use, callers waiting and their wait
    (``treadle_db_pool_*``, label ``pool`` = ``main``, ``read`` (SQLite readers),
    ``lease`` or ``replica``).

    Args:
        settings: URL, pool sizes and timeouts.
        pre_ping: test each pooled PostgreSQL connection with a round trip at checkout
            (the API keeps it, so a request after a server restart does not fail; the
            worker process turns it off, see :func:`app.worker.worker.run_worker`).

    Attributes:
        dialect: ``"postgresql"`` or ``"sqlite"``.
        engine: the writer engine (also used by Alembic and LISTEN).
    """

    def __init__(self, settings: Settings, *, pre_ping: bool = True) -> None:
        self.settings = settings
        self.url = settings.database_url
        url = make_url(self.url)
        self.dialect = url.get_backend_name()
        if self.dialect == "sqlite":
            path = _sqlite_path(self.url)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = self._sqlite_engine(immediate=True)
            self.read_engine = self._sqlite_engine(immediate=False)
        elif self.dialect == "postgresql":
            self.engine = self._pg_engine(settings.db_pool_size, pre_ping=pre_ping)
            self.read_engine = self.engine
        else:
            raise ValueError(
                f"TREADLE_DATABASE_URL: unsupported database {self.dialect!r}; "
                "use postgresql+asyncpg:// or sqlite+aiosqlite://"
            )
        self._pools: dict[str, AsyncEngine] = {"main": self.engine}
        if self.read_engine is not self.engine:
            self._pools["read"] = self.read_engine
        self._replica: ReplicaGate | None = None
        self._sizes: dict[str, int] = {}
        for name, engine in self._pools.items():
            self._instrument(name, engine)
        self.wakeups: WakeCoalescer | None = (
            WakeCoalescer(self.autocommit, settings.notify_coalesce_ms / 1000.0)
            if self.dialect == "postgresql"
            else None
        )

    @property
    def has_replica(self) -> bool:
        """True when ``TREADLE_READ_DATABASE_URL`` gives :meth:`lagging_read` a replica."""
        return bool(self.settings.read_database_url)

    def _replica_gate(self) -> ReplicaGate:
        """The replica pool's gate, its engine built on first use (workers never need it)."""
        if self._replica is None:
            # The settings refuse a replica unless both URLs are PostgreSQL.
            engine = self._pg_engine(
                self.settings.db_pool_size,
                pre_ping=True,  # a standby restarted behind our back: fall back, not fail
                url=self.settings.read_database_url,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
            )
            self._pools["replica"] = engine
            self._instrument("replica", engine)
            self._replica = ReplicaGate(engine, self.settings.read_max_lag_seconds)
        return self._replica

    def _lease_engine(self) -> AsyncEngine:
        """The lease pool's engine, built on first use (API processes never need one)."""
        engine = self._pools.get("lease")
        if engine is not None:
            return engine
        if self.dialect == "postgresql":
            # Pre-pinged: one round trip per heartbeat is nothing, and after a server
            # restart the first heartbeat must not be the statement that finds out.
            engine = self._pg_engine(LEASE_POOL_SIZE, pre_ping=True)
        elif _sqlite_path(self.url) is not None:
            # A second writer connection, serialized with the first by SQLite's own lock
            # (the busy timeout) rather than queued behind it in our pool.
            engine = self._sqlite_engine(immediate=True, writers=LEASE_POOL_SIZE)
        else:
            return self.engine  # an in-memory database exists on its one connection only
        self._pools["lease"] = engine
        self._instrument("lease", engine)
        return engine

    def _pg_engine(
        self,
        pool_size: int,
        *,
        pre_ping: bool,
        url: str | None = None,
        connect_timeout: float | None = None,
    ) -> AsyncEngine:
        connect_args = pg_connect_args(self.settings)
        if connect_timeout is not None:
            connect_args["timeout"] = connect_timeout  # asyncpg.connect's, in seconds
            # Client-side, beyond the server's statement_timeout: only for a host that
            # stops answering (app.db.replica.CONNECT_TIMEOUT_SECONDS).
            connect_args["command_timeout"] = (
                self.settings.db_statement_timeout_seconds + connect_timeout
            )
        engine = create_async_engine(
            self.url if url is None else url,
            pool_size=pool_size,
            max_overflow=0,
            pool_timeout=self.settings.db_pool_timeout_seconds,
            # A SELECT 1 round trip per checkout (SQLAlchemy "pessimistic" disconnect
            # handling). Workers turn it off: a connection that died with a server
            # restart fails its first statement instead, before anything reached the
            # server, SQLAlchemy then drops every older pooled connection, and workers
            # already give the run back after such a fault and retry claims.
            pool_pre_ping=pre_ping,
            connect_args=connect_args,
        )
        if self.settings.db_pooler == DbPooler.NONE:
            event.listen(engine.sync_engine, "handle_error", _name_pooler_mistake)
        return engine

    def _instrument(self, name: str, engine: AsyncEngine) -> None:
        # Pool events fire on checkout and on return (also of an invalidated connection),
        # so the gauge counts exactly the connections handed out and not yet returned.
        in_use = metrics.DB_POOL_IN_USE.labels(name)
        event.listen(engine.sync_engine, "checkout", lambda *_: in_use.inc())
        event.listen(engine.sync_engine, "checkin", lambda *_: in_use.dec())
        size = getattr(engine.sync_engine.pool, "size", None)
        if callable(size):
            self._sizes[name] = int(size())
            metrics.DB_POOL_SIZE.labels(name).inc(self._sizes[name])

    def _sqlite_engine(self, *, immediate: bool, writers: int = 1) -> AsyncEngine:
        busy_ms = int(self.settings.sqlite_busy_timeout_seconds * 1000)
        pool: dict[str, Any] = {}
        if _sqlite_path(self.url) is not None:
            # One writer connection per process: SQLite has one writer anyway, and queueing
            # in our pool beats spinning on the busy timeout.
            pool = {
                # Named, not left to the default: SQLAlchemy 2.0 gives a file-based
                # aiosqlite engine a NullPool (2.1 a queue pool), and the dependency
                # range admits both (docs/adr/0014-packaging.md).
                "poolclass": AsyncAdaptedQueuePool,
                "pool_size": writers if immediate else self.settings.db_pool_size,
                "max_overflow": 0,
                "pool_timeout": self.settings.db_pool_timeout_seconds,
            }
        engine = create_async_engine(
            self.url,
            connect_args={
                "timeout": self.settings.sqlite_busy_timeout_seconds,
                # A connection closed mid-transaction must not keep the write lock.
                "factory": RollbackOnCloseConnection,
            },
            **pool,
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take over transaction control from the sqlite3 module (SQLAlchemy's
            # documented recipe) so BEGIN IMMEDIATE is ours to issue.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    @contextlib.asynccontextmanager
    async def _connect(self, pool: str) -> AsyncIterator[AsyncConnection]:
        """Check a connection out of ``pool`` (timing the wait), return it on exit."""
        waiting, wait = _pool_metrics(pool)
        waiting.inc()
        started = time.perf_counter()
        try:
            engine = self._lease_engine() if pool == "lease" else self._pools[pool]
            conn = await engine.connect()
        finally:
            waiting.dec()
            wait.observe(time.perf_counter() - started)
        try:
            yield conn
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """Open a write transaction; commits on success, rolls back on any exception."""
        async with self._connect("main") as conn, conn.begin():
            yield conn

    @contextlib.asynccontextmanager
    async def lease_write(self) -> AsyncIterator[AsyncConnection]:
        """:meth:`write` on the lease pool: heartbeats and lease releases, nothing else.

        Its connection is never used by steps or requests, so a worker's main pool held
        by long transactional steps cannot delay the heartbeat that keeps their leases.
        """
        async with self._connect("lease") as conn, conn.begin():
            yield conn

    async def lease_write_retrying(
        self, fn: Callable[[AsyncConnection], Awaitable[T]], *, what: str = "lease"
    ) -> T:
        """:meth:`write_retrying` on the lease pool (see :meth:`lease_write`).

        Returns:
            What ``fn`` returned in the attempt that committed.

        Raises:
            Whatever ``fn`` or the commit raised; a conflict once the attempts ran out.
        """

        async def once() -> T:
            async with self.lease_write() as conn:
                return await fn(conn)

        return await retry_conflicts(once, attempts=self.settings.db_retry_attempts, what=what)

    async def write_retrying(
        self, fn: Callable[[AsyncConnection], Awaitable[T]], *, what: str = "transaction"
    ) -> T:
        """Run ``fn(conn)`` in a write transaction, re-run after a transient conflict.

        A deadlock (SQLSTATE 40P01), serialization failure (40001) or locked SQLite
        database rolls the whole transaction back; it is run again from the start, up to
        ``TREADLE_DB_RETRY_ATTEMPTS`` attempts in all, with jittered exponential backoff
        (:func:`app.db.faults.retry_conflicts`). ``fn`` must therefore keep no state
        outside the database between calls (count metrics after this returns).

        Args:
            fn: the transaction's statements; receives the open connection.
            what: names the transaction in the retry log line.

        Returns:
            What ``fn`` returned in the attempt that committed.

        Raises:
            Whatever ``fn`` or the commit raised; a conflict once the attempts ran out.
        """

        async def once() -> T:
            async with self.write() as conn:
                return await fn(conn)

        return await retry_conflicts(once, attempts=self.settings.db_retry_attempts, what=what)

    async def autocommit_retrying(
        self, fn: Callable[[AsyncConnection], Awaitable[T]], *, what: str = "statement"
    ) -> T:
        """Run ``fn(conn)`` on an :meth:`autocommit` connection, re-run after a conflict.

        For work that is one self-contained statement (each statement commits on its
        own), with the same retries as :meth:`write_retrying`. PostgreSQL only.

        Returns:
            What ``fn`` returned in the attempt that succeeded.

        Raises:
            Whatever ``fn`` raised; a conflict once ``TREADLE_DB_RETRY_ATTEMPTS`` ran out.
        """

        async def once() -> T:
            async with self.autocommit() as conn:
                return await fn(conn)

        return await retry_conflicts(once, attempts=self.settings.db_retry_attempts, what=what)

    @contextlib.asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection in autocommit: each statement is its own transaction.

        For single-statement checkpoints (app/db/queries/checkpoints.py), which need no
        ``BEGIN``/``COMMIT`` round trips. PostgreSQL only; the isolation level is reset
        when the connection returns to the pool (SQLAlchemy's per-connection option).
        """
        async with self._connect("main") as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    @contextlib.asynccontextmanager
    async def read_statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one read statement on the primary, with no transaction around it.

        On PostgreSQL an :meth:`autocommit` connection: the statement is its own
        transaction, so a one-row read is one round trip instead of three (``BEGIN``, the
        statement, ``COMMIT``); for the executor's per-step reads (its pause check). On
        SQLite a :meth:`read` transaction, which costs no round trip there. Use
        :meth:`read` for more than one statement that must see one snapshot.
        """
        if self.dialect == "postgresql":
            async with self.autocommit() as conn:
                yield conn
        else:
            async with self.read() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """Open a read-only-by-convention transaction (rolled back at the end)."""
        pool = "read" if "read" in self._pools else "main"
        async with self._connect(pool) as conn, conn.begin():
            yield conn

    @contextlib.asynccontextmanager
    async def lagging_read(self) -> AsyncIterator[AsyncConnection]:
        """:meth:`read` for a read whose answer may trail the primary's latest commits.

        On the replica of ``TREADLE_READ_DATABASE_URL`` when one is set, reachable and no
        further behind than ``TREADLE_READ_MAX_LAG_SECONDS``; on the primary otherwise
        (counted in ``treadle_db_replica_fallbacks_total``). Only for reads that decide
        nothing and lead to no write: lists, counts, reports, gauges
        (docs/adr/0033-lag-tolerant-reads-on-a-replica.md). A caller's own write of a
        moment ago may be missing from it.

        Raises:
            sqlalchemy.exc.TimeoutError: the replica pool stayed full (503 in the API).
        """
        conn = await self._replica_checkout(self._replica_gate()) if self.has_replica else None
        if conn is None:
            async with self.read() as primary:
                yield primary
            return
        try:
            async with conn.begin():
                yield conn
        finally:
            await conn.close()

    async def _replica_checkout(self, gate: ReplicaGate) -> AsyncConnection | None:
        # The replica pool's wait is timed as every pool's is (treadle_db_pool_wait_seconds).
        waiting, wait = _pool_metrics("replica")
        waiting.inc()
        started = time.perf_counter()
        try:
            return await gate.connect()
        finally:
            waiting.dec()
            wait.observe(time.perf_counter() - started)

    async def now(self) -> datetime:
        """Return the database clock as an aware UTC datetime."""
        async with self.read() as conn:
            return await fetch_now(conn, self.dialect)

    def wake_workers(self) -> None:
        """Ask for a coalesced NOTIFY to wake listening workers; call after commit.

        PostgreSQL: :class:`app.db.wakeups.WakeCoalescer` (at most one NOTIFY per
        ``TREADLE_NOTIFY_COALESCE_MS`` from this process, outside the caller's
        transaction). SQLite: a no-op (workers poll; ``treadle dev`` wakes its in-process
        worker through the API's ``on_wake``). Never raises.
        """
        if self.wakeups is not None:
            self.wakeups.request()

    async def dispose(self) -> None:
        """Close every pooled connection (each pool stops counting in ``treadle_db_pool_*``).

        A pending coalesced wake-up is sent first.
        """
        if self.wakeups is not None:
            await self.wakeups.flush()
        for name, size in self._sizes.items():
            metrics.DB_POOL_SIZE.labels(name).dec(size)
        self._sizes = {}
        for engine in {id(e): e for e in self._pools.values()}.values():
            await engine.dispose()


async def fetch_now(conn: AsyncConnection, dialect: str) -> datetime:
    """Return the database clock through an open connection (aware UTC)."""
    value = (await conn.execute(select(now_expr(dialect)))).scalar_one()
    assert isinstance(value, datetime)
    return value
