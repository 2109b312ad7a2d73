"""Transient database faults: naming them, and re-running transactions that conflicted.

A *transient* fault is one the database or the pool reports when nothing is wrong with
the request itself; the same request succeeds later. :func:`classify` names it by the
error's SQLSTATE **class** (PostgreSQL manual, Appendix A "PostgreSQL Error Codes"), or by
SQLite's primary result code, so that a fault nobody listed yet defaults to "503, and the
run waits" rather than to "the workflow failed":

========================== =================================================== ========
fault                      raised when                                         retried
========================== =================================================== ========
``unavailable``            the server cannot be reached or dropped the         no
                           connection: connection refused, class 08, class 57
                           but 57014 (57P01 admin shutdown, 57P02, 57P03,
                           57P04, 57P05), 53300 too many connections, 25006 a
                           read-only server (a failover in progress), 25P03, a
                           connection SQLAlchemy invalidated, no read-write
                           host of a multi-host URL, SQLite
                           ``SQLITE_CANTOPEN`` / ``SQLITE_READONLY``
``pool_timeout``           no pooled connection was freed within               no
                           ``TREADLE_DB_POOL_TIMEOUT_SECONDS``
                           (``sqlalchemy.exc.TimeoutError``)
``statement_timeout``      PostgreSQL cancelled a statement (57014: the        no
                           ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS`` timeout,
                           or an operator's ``pg_cancel_backend``)
``lock_timeout``           a lock was not granted in time (55P03, e.g.         no
                           ``lock_timeout``)
``object_state``           any other class 55 error (55006 object in use)      no
``insufficient_resources`` class 53 but 53300 (53100 disk full, 53200 out of   no
                           memory), SQLite ``SQLITE_FULL`` / ``SQLITE_NOMEM``
``system_error``           class 58 (I/O error), class XX (internal error,     no
                           corruption), SQLite ``SQLITE_IOERR`` /
                           ``SQLITE_CORRUPT`` / ``SQLITE_NOTADB``
``transaction_rollback``   class 40 but the three below and 40002 (40003       no
                           statement completion unknown)
``other``                  any other SQLSTATE or SQLite code that is not the   no
                           caller's fault (see below)
``deadlock``               PostgreSQL broke a lock cycle by aborting this      yes
                           transaction (40P01)
``serialization_failure``  a concurrent update made this transaction           yes
                           unserializable (40001)
``locked``                 SQLite's write lock stayed taken past the busy      yes
                           timeout (``SQLITE_BUSY`` / ``SQLITE_LOCKED``)
========================== =================================================== ========

The hot statements that run on asyncpg directly (app/db/raw.py) raise asyncpg's errors
unwrapped; :func:`classify` names those by the same rules (their SQLSTATE; asyncpg's
``connection is closed`` as a dropped connection).

What is **the caller's fault** is an explicit list (:data:`CALLER_FAULT_CLASSES`,
:data:`CALLER_FAULT_SQLSTATES`, :data:`CALLER_FAULT_SQLITE`): the statement or its data is
wrong (syntax, a missing table, a constraint violation, a bad value, a ``RAISE`` of
PL/pgSQL code, a program limit), so the same request fails again. Those are not faults:
they surface as they are (a 500 or a domain error in the API, a failed attempt in a
transactional step).

Only the last three are *conflicts*: the database rolled the whole transaction back
because of another transaction, so running it again from the start is correct (the
PostgreSQL manual, "Serialization Failure Handling", recommends exactly this).
:func:`retry_conflicts` does it a bounded number of times with jittered exponential
backoff. Other faults are not retried here: the cause lasts longer than a request should
wait, so the API answers 503 with ``Retry-After`` (``app.api.problems``) and a worker
releases its run and claims it again later.

Error texts: SQLAlchemy's message of a failed statement embeds the statement and its
parameters. :func:`describe` and :func:`redact` give the driver's message without them,
for anything a tenant can read (a run's or a step's error, a problem detail).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

import structlog
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.core import metrics

log = structlog.get_logger("treadle.db")

T = TypeVar("T")

# Backoff before conflict retry n (1-based): uniform in [0, min(CAP, BASE * 2**(n-1))]
# seconds ("full jitter"), so transactions that collided once do not collide again in step.
RETRY_BASE_SECONDS = 0.02
RETRY_CAP_SECONDS = 0.5


class DbFault(StrEnum):
    """A transient database fault (see the module docstring for when each is raised)."""

    UNAVAILABLE = "unavailable"
    POOL_TIMEOUT = "pool_timeout"
    STATEMENT_TIMEOUT = "statement_timeout"
    LOCK_TIMEOUT = "lock_timeout"
    OBJECT_STATE = "object_state"
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    SYSTEM_ERROR = "system_error"
    TRANSACTION_ROLLBACK = "transaction_rollback"
    OTHER = "other"
    DEADLOCK = "deadlock"
    SERIALIZATION_FAILURE = "serialization_failure"
    LOCKED = "locked"

    @property
    def is_conflict(self) -> bool:
        """True for faults that rolled the transaction back and a re-run may clear."""
        return self in _CONFLICTS

    @property
    def may_be_the_callers(self) -> bool:
        """True for faults the caller's own statements can provoke: waits and conflicts.

        A transactional step's function runs its own queries in the step's transaction:
        a statement or lock timeout, or a conflict past the retries, there may well be
        its own doing (a slow query, its own ``SET lock_timeout``), so it is a failed
        attempt under the step's ``RetryPolicy`` rather than a fault to wait out.
        """
        return self in _CALLER_PROVOKED


_CONFLICTS = frozenset({DbFault.DEADLOCK, DbFault.SERIALIZATION_FAILURE, DbFault.LOCKED})
_CALLER_PROVOKED = _CONFLICTS | {DbFault.STATEMENT_TIMEOUT, DbFault.LOCK_TIMEOUT}

# Faults named by exact SQLSTATE, before the class rules below.
_SQLSTATES = {
    "40P01": DbFault.DEADLOCK,
    "40001": DbFault.SERIALIZATION_FAILURE,
    "57014": DbFault.STATEMENT_TIMEOUT,  # query_canceled
    "55P03": DbFault.LOCK_TIMEOUT,  # lock_not_available
    "53300": DbFault.UNAVAILABLE,  # too_many_connections
    "25006": DbFault.UNAVAILABLE,  # read_only_sql_transaction: connected to a standby
    "25P03": DbFault.UNAVAILABLE,  # idle_in_transaction_session_timeout: connection closed
}

# The fault of each SQLSTATE class (the first two characters) that is a fault as a whole.
_CLASSES = {
    "08": DbFault.UNAVAILABLE,  # connection exception
    "40": DbFault.TRANSACTION_ROLLBACK,  # transaction rollback
    "53": DbFault.INSUFFICIENT_RESOURCES,  # insufficient resources
    "55": DbFault.OBJECT_STATE,  # object not in prerequisite state
    "57": DbFault.UNAVAILABLE,  # operator intervention (shutdown, crash, dropped)
    "58": DbFault.SYSTEM_ERROR,  # system error (errors external to PostgreSQL)
    "XX": DbFault.SYSTEM_ERROR,  # internal error (data or index corrupted)
}

CALLER_FAULT_CLASSES = frozenset(
    {
        "0A",  # feature not supported
        "0B",  # invalid transaction initiation
        "0F",  # locator exception
        "0L",  # invalid grantor
        "0P",  # invalid role specification
        "0Z",  # diagnostics exception
        "20",  # case not found
        "21",  # cardinality violation
        "22",  # data exception (bad value, division by zero, invalid text representation)
        "23",  # integrity constraint violation
        "24",  # invalid cursor state
        "25",  # invalid transaction state (but 25006 and 25P03, named above)
        "26",  # invalid SQL statement name
        "27",  # triggered data change violation
        "2B",  # dependent privilege descriptors still exist
        "2D",  # invalid transaction termination
        "2F",  # SQL routine exception
        "34",  # invalid cursor name
        "38",  # external routine exception
        "39",  # external routine invocation exception
        "3B",  # savepoint exception
        "3F",  # invalid schema name
        "42",  # syntax error or access rule violation (undefined table, column, ...)
        "44",  # WITH CHECK OPTION violation
        "54",  # program limit exceeded (statement too complex, row too big)
        "P0",  # PL/pgSQL: RAISE EXCEPTION, no data found, too many rows, assert
    }
)
"""SQLSTATE classes that are the caller's fault: the same statement fails again."""

CALLER_FAULT_SQLSTATES = frozenset(
    {
        "40002",  # transaction_integrity_constraint_violation (a deferred constraint)
        "55000",  # object_not_in_prerequisite_state (e.g. currval before nextval)
        "55P02",  # cant_change_runtime_param
        "55P04",  # unsafe_new_enum_value_usage
    }
)
"""SQLSTATEs of fault classes that are nevertheless the caller's fault."""

CALLER_FAULT_SQLITE = frozenset(
    {
        "SQLITE_ERROR",  # SQL error or missing database object (syntax, no such table)
        "SQLITE_CONSTRAINT",
        "SQLITE_MISMATCH",
        "SQLITE_RANGE",
        "SQLITE_TOOBIG",
        "SQLITE_MISUSE",
        "SQLITE_AUTH",
        "SQLITE_FORMAT",
    }
)
"""SQLite primary result codes that are the caller's fault."""

# SQLite primary result codes (the name before any extended suffix) that are faults.
_SQLITE_CODES = {
    "SQLITE_BUSY": DbFault.LOCKED,
    "SQLITE_LOCKED": DbFault.LOCKED,
    "SQLITE_FULL": DbFault.INSUFFICIENT_RESOURCES,
    "SQLITE_NOMEM": DbFault.INSUFFICIENT_RESOURCES,
    "SQLITE_IOERR": DbFault.SYSTEM_ERROR,
    "SQLITE_CORRUPT": DbFault.SYSTEM_ERROR,
    "SQLITE_NOTADB": DbFault.SYSTEM_ERROR,
    "SQLITE_CANTOPEN": DbFault.UNAVAILABLE,
    "SQLITE_READONLY": DbFault.UNAVAILABLE,
}

_SQLITE_LOCKED = ("database is locked", "database table is locked", "database schema is locked")


def classify_sqlstate(sqlstate: str) -> DbFault | None:
    """Name the fault of a PostgreSQL SQLSTATE, or None when it is the caller's fault.

    Exact codes first (:data:`_SQLSTATES`), then the caller's list, then the class; a
    code in no list is :attr:`DbFault.OTHER`: an unknown error defaults to a fault.
    """
    fault = _SQLSTATES.get(sqlstate)
    if fault is not None:
        return fault
    if sqlstate in CALLER_FAULT_SQLSTATES or sqlstate[:2] in CALLER_FAULT_CLASSES:
        return None
    return _CLASSES.get(sqlstate[:2], DbFault.OTHER)


def _classify_sqlite(orig: BaseException) -> DbFault | None:
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str) and name.startswith("SQLITE_"):
        primary = "_".join(name.split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
        if primary in CALLER_FAULT_SQLITE:
            return None
        return _SQLITE_CODES.get(primary, DbFault.OTHER)
    # No result code (a driver-side error): what the message says.
    message = str(orig).lower()
    if any(text in message for text in _SQLITE_LOCKED):
        return DbFault.LOCKED
    return DbFault.UNAVAILABLE


def _no_writable_host(exc: BaseException) -> bool:
    """True if ``exc`` (or what it wraps) is asyncpg finding no host of the required kind.

    A multi-host URL with ``target_session_attrs=read-write`` (an HA cluster) raises it
    while every reachable node is a standby, i.e. mid-failover: the database is
    unavailable, not broken. asyncpg is an optional extra, so it is looked up only if
    something already imported it (then it is the driver that raised).
    """
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, asyncpg.TargetServerAttributeNotMatched):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


def classify(exc: BaseException) -> DbFault | None:
    """Name the transient database fault ``exc`` is, or None for anything else.

    Args:
        exc: any exception; SQLAlchemy wraps driver errors in ``DBAPIError`` (``.orig``
            carries asyncpg's ``sqlstate``, or sqlite3's ``sqlite_errorname``).

    Returns:
        The fault, or None when ``exc`` is not a transient database fault (a bug, a
        constraint violation, a domain error, any other caller's fault listed in the
        module docstring): those must surface as they are.
    """
    if isinstance(exc, PoolTimeout):
        return DbFault.POOL_TIMEOUT
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None)
        if isinstance(sqlstate, str) and len(sqlstate) == 5:
            return classify_sqlstate(sqlstate)
        if exc.connection_invalidated or _no_writable_host(exc):
            return DbFault.UNAVAILABLE
        if isinstance(exc.orig, sqlite3.Error):
            return _classify_sqlite(exc.orig)
        if isinstance(exc, OperationalError) or isinstance(exc.orig, OSError):
            return DbFault.UNAVAILABLE
        return None
    if _no_writable_host(exc):
        return DbFault.UNAVAILABLE
    if isinstance(exc, ConnectionError):
        # Raised by the driver before SQLAlchemy wraps anything (connection refused).
        return DbFault.UNAVAILABLE
    return _classify_asyncpg(exc)


def _classify_asyncpg(exc: BaseException) -> DbFault | None:
    """The fault of an error asyncpg raised unwrapped (app/db/raw.py), as :func:`classify`.

    A server error carries its SQLSTATE (a dropped connection too: asyncpg's
    ``ConnectionDoesNotExistError`` is 08003); a statement sent on a connection asyncpg
    already closed is its ``InterfaceError("connection is closed")``, the message
    SQLAlchemy's asyncpg dialect also reads as a disconnect. Any other client-side error
    (a value asyncpg cannot encode, a misuse) is a bug to surface, as it is when
    SQLAlchemy wraps it.
    """
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return None
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None)
        if isinstance(sqlstate, str) and len(sqlstate) == 5:
            return classify_sqlstate(sqlstate)
        return DbFault.OTHER
    if isinstance(exc, asyncpg.InterfaceError) and "connection is closed" in str(exc):
        return DbFault.UNAVAILABLE
    return None


def describe(exc: BaseException) -> str:
    """A one-line description of ``exc`` without SQL text or statement parameters.

    For a failed statement (``sqlalchemy.exc.StatementError``, or asyncpg's own error
    from app/db/raw.py): the driver's first line, with the SQLSTATE when there is one,
    e.g. ``duplicate key value violates unique constraint "probe_pkey" (SQLSTATE
    23505)``. Anything else: ``str(exc)``.
    """
    if not isinstance(exc, StatementError):
        code = getattr(exc, "sqlstate", None)  # asyncpg's own error (app/db/raw.py)
        if isinstance(code, str) and str(exc).strip():
            return f"{str(exc).strip().splitlines()[0]} (SQLSTATE {code})"
        return str(exc)
    orig = exc.orig
    if orig is None:
        return type(exc).__name__
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    # The asyncpg adapter prefixes the driver's class: "<class 'asyncpg....'>: message".
    if text.startswith("<class '") and "'>: " in text:
        text = text.split("'>: ", 1)[1]
    code = getattr(orig, "sqlstate", None)
    if isinstance(code, str):
        return f"{text} (SQLSTATE {code})"
    code = getattr(orig, "sqlite_errorname", None)
    return f"{text} ({code})" if isinstance(code, str) else text


def redact(text: str, exc: BaseException) -> str:
    """``text`` (e.g. a formatted traceback of ``exc``) with SQL statements removed.

    Every failed statement in ``exc``'s chain (causes and contexts) is replaced by its
    :func:`describe` line, so the statement and its parameters never reach a tenant.
    """
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, StatementError):
            text = text.replace(str(current), describe(current))
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return text


def backoff(attempt: int) -> float:
    """Seconds to wait before re-running a transaction whose ``attempt`` (1-based) conflicted."""
    return random.uniform(0.0, min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** (attempt - 1)))


async def retry_conflicts(
    transaction: Callable[[], Awaitable[T]], *, attempts: int, what: str = "transaction"
) -> T:
    """Run ``transaction``; re-run it after a deadlock, serialization failure or SQLite lock.

    ``transaction`` must open, run and commit one whole transaction each time it is called
    (e.g. ``async with db.write() as conn: …``) and keep no state outside the database
    between calls: a conflicting attempt was rolled back entirely, so the re-run starts
    from scratch. Each retry is counted in ``treadle_db_retries_total{fault}``.

    Args:
        transaction: the transaction to run.
        attempts: total attempts, at least 1 (``TREADLE_DB_RETRY_ATTEMPTS``).
        what: a label for the log line of a retry.

    Returns:
        What the last attempt returned.

    Raises:
        Whatever the transaction raised: at once for anything but a conflict, and the last
        conflict once ``attempts`` attempts conflicted.
    """
    attempt = 1
    while True:
        try:
            return await transaction()
        except DBAPIError as exc:
            fault = classify(exc)
            if fault is None or not fault.is_conflict or attempt >= attempts:
                raise
            wait = backoff(attempt)
            metrics.DB_RETRIES.labels(fault.value).inc()
            log.info(
                "transaction conflicted; retrying",
                what=what,
                fault=fault.value,
                attempt=attempt,
                retry_in_seconds=round(wait, 4),
            )
        await asyncio.sleep(wait)
        attempt += 1


POOLER_HINT = (
    "TREADLE_DATABASE_URL looks like a transaction-mode pooler (PgBouncer pool_mode = "
    "transaction): set TREADLE_DB_POOLER=transaction, and TREADLE_LISTEN_DATABASE_URL to a "
    "direct PostgreSQL connection for the workers' LISTEN (docs/deployment.md, \"Behind "
    'PgBouncer")'
)
"""What :func:`pooler_mistake` tells the operator to do."""

# What a transaction pooler answers to a client configured for direct connections:
# PgBouncer refuses the statement_timeout startup parameter at connect (08P01), and a
# named prepared statement goes missing (26000) or collides (42P05) when consecutive
# round trips land on different server connections (docs/adr/0032-transaction-pooler.md).
_POOLER_SIGNS = (
    "unsupported startup parameter",
    "prepared statement",
)
_POOLER_SQLSTATES = frozenset({"26000", "42P05"})


def pooler_mistake(exc: BaseException) -> str | None:
    """:data:`POOLER_HINT` plus the error when ``exc`` is a pooler answering as above.

    Looks at ``exc`` and its causes (SQLAlchemy wraps asyncpg's error): PgBouncer's
    ``unsupported startup parameter``, asyncpg's ``prepared statement "…" does not exist``
    / ``already exists`` and their SQLSTATEs 26000 and 42P05 (also
    ``DuplicatePreparedStatementError``), only possible on PostgreSQL without
    ``TREADLE_DB_POOLER=transaction``, where Treadle names its statements.

    Returns:
        One line: the hint, then ``(the error was: …)``; None for any other error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current).lower()
        code = getattr(current, "sqlstate", None)
        if code in _POOLER_SQLSTATES or any(sign in message for sign in _POOLER_SIGNS):
            return f"{POOLER_HINT} (the error was: {describe(exc)[:200]})"
        current = getattr(current, "orig", None) or current.__cause__
    return None


# What to do about a database that answers "not like this", by SQLSTATE (or its class)
# and SQLite primary result code: waiting does not change these answers.
_MISCONFIGURED = {
    "3D000": "create the database, or fix its name in TREADLE_DATABASE_URL",
    "28": "the server refused these credentials: fix the user and password in "
    "TREADLE_DATABASE_URL (or the server's pg_hba.conf)",
    "42501": "the database user lacks a privilege it needs: grant it, or use the "
    "credentials of the database's owner in TREADLE_DATABASE_URL",
    "SQLITE_CANTOPEN": "the SQLite file of TREADLE_DATABASE_URL cannot be opened or "
    "created: its directory must exist and be writable by this user",
    "SQLITE_READONLY": "the SQLite file of TREADLE_DATABASE_URL is read-only: make it and "
    "its directory writable by this user",
}


def misconfiguration(exc: BaseException) -> str | None:
    """What to do when ``exc`` is the database refusing the configuration, else None.

    For start-up and one-shot commands (:func:`wait_out_faults`, the CLI's error
    handler): a database that does not exist (3D000), refused credentials (class 28),
    a missing privilege (42501), a SQLite file that cannot be opened or created
    (``SQLITE_CANTOPEN``, or the directory for it: an ``OSError`` from creating it) or
    written (``SQLITE_READONLY``). :func:`classify` still calls some of these
    transient for a process already running (a file system that went away); at start
    no wait makes them go away.

    Returns:
        One line: the driver's error (:func:`describe`, no SQL, no password), then what
        to do; None for any other error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlstate", None) or getattr(current, "sqlite_errorname", None)
        if isinstance(code, str):
            primary = "_".join(code.split("_")[:2]) if code.startswith("SQLITE_") else code
            hint = _MISCONFIGURED.get(primary) or _MISCONFIGURED.get(code[:2])
            if hint is not None:
                return f"{describe(exc)[:300]}: {hint}"
        current = getattr(current, "orig", None) or current.__cause__
    return None


# Waits between attempts of :func:`wait_out_faults`: doubling from the first, capped.
START_RETRY_FIRST_SECONDS = 0.2
START_RETRY_CAP_SECONDS = 2.0


async def wait_out_faults(
    fn: Callable[[], Awaitable[None]],
    *,
    what: str,
    stopping: asyncio.Event,
    give_up_after_seconds: float | None = None,
) -> bool:
    """Run ``fn`` until it gets through without a transient fault, or ``stopping`` is set.

    For what a process must do before it can work at all (``treadle serve``'s schema
    check, a worker's schema check and registration): started while PostgreSQL
    restarts, or restarted in the middle of them, the process waits the outage out like
    its loops do afterwards, instead of exiting with the fault's traceback. Each fault
    is logged (``database fault at start; retrying``) and retried after 0.2, 0.4, … up
    to 2 s; an error that is not a fault (:func:`classify` is None, e.g. a schema at the
    wrong revision) is raised at once. With ``give_up_after_seconds`` (the processes
    pass ``TREADLE_DB_START_TIMEOUT_SECONDS``) the wait is bounded: a database still
    unreachable then is a deployment to fix, not an outage to sit out silently
    (docs/operations.md, "Start-up without a database").

    Args:
        fn: the work; one whole attempt per call (a failed one committed nothing).
        what: names the work in the log line.
        stopping: set to give up waiting (SIGTERM).
        give_up_after_seconds: seconds from the first attempt after which a fault is
            raised instead of retried; None waits without end, 0 tries once.

    Returns:
        True once ``fn`` returned; False if ``stopping`` was set first.

    Raises:
        DatabaseUnreachableAtStart: faults lasted ``give_up_after_seconds``; its detail
            names the work, the wait and the last error (password redacted).
        DatabaseMisconfigured: a transaction pooler without TREADLE_DB_POOLER=transaction,
            or :func:`misconfiguration` (no such database, credentials refused, a SQLite
            file that cannot be opened): not waited for.
        Whatever ``fn`` raised that is not a transient fault.
    """
    from app.core.errors import DatabaseMisconfigured, DatabaseUnreachableAtStart

    loop = asyncio.get_running_loop()
    deadline = None if give_up_after_seconds is None else loop.time() + give_up_after_seconds
    delay = START_RETRY_FIRST_SECONDS
    while not stopping.is_set():
        try:
            await fn()
            return True
        except Exception as exc:
            mistake = pooler_mistake(exc) or misconfiguration(exc)
            if mistake is not None:
                raise DatabaseMisconfigured(mistake, what=what) from exc
            fault = classify(exc)
            if fault is None:
                raise
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise DatabaseUnreachableAtStart(
                    f"the database stayed unreachable for {give_up_after_seconds:g} s "
                    f"(TREADLE_DB_START_TIMEOUT_SECONDS) at {what}: {describe(exc)[:300]}",
                    what=what,
                    fault=fault.value,
                ) from exc
            log.warning(
                "database fault at start; retrying",
                what=what,
                fault=fault.value,
                error=describe(exc)[:300],
                retry_in_seconds=delay if left is None else round(min(delay, left), 3),
            )
        wait = delay if left is None else min(delay, left)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), wait)
        delay = min(delay * 2, START_RETRY_CAP_SECONDS)
    return False
