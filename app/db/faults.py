"""Transient database faults: naming them, and re-running transactions that conflicted.

A *transient* fault is one the database or the pool reports when nothing is wrong with
the request itself; the same request succeeds later. :func:`classify` names it:

====================== =========================================================== ========
fault                  raised when                                                 retried
====================== =========================================================== ========
``unavailable``        the server cannot be reached or dropped the connection      no
                       (connection refused, SQLSTATE class 08, 57P01-57P03, 53300,
                       a connection SQLAlchemy invalidated, other SQLite
                       ``OperationalError``)
``pool_timeout``       no pooled connection was freed within                       no
                       ``TREADLE_DB_POOL_TIMEOUT_SECONDS`` (``sqlalchemy.exc
                       .TimeoutError``)
``statement_timeout``  PostgreSQL cancelled a statement after                      no
                       ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS`` (SQLSTATE 57014)
``deadlock``           PostgreSQL broke a lock cycle by aborting this transaction  yes
                       (SQLSTATE 40P01)
``serialization_failure`` a concurrent update made this transaction unserializable yes
                       (SQLSTATE 40001)
``locked``             SQLite's write lock stayed taken past the busy timeout      yes
                       (``database is locked``)
====================== =========================================================== ========

Only the last three are *conflicts*: the database rolled the whole transaction back
because of another transaction, so running it again from the start is correct (the
PostgreSQL manual, "Serialization Failure Handling", recommends exactly this).
:func:`retry_conflicts` does it a bounded number of times with jittered exponential
backoff. Timeouts and outages are not retried here: the cause lasts longer than a request
should wait, so the API answers 503 with ``Retry-After`` (``app.api.problems``) and a
worker releases its run and claims it again later.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

import structlog
from sqlalchemy.exc import DBAPIError, OperationalError
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
    DEADLOCK = "deadlock"
    SERIALIZATION_FAILURE = "serialization_failure"
    LOCKED = "locked"

    @property
    def is_conflict(self) -> bool:
        """True for faults that rolled the transaction back and a re-run may clear."""
        return self in _CONFLICTS


_CONFLICTS = frozenset({DbFault.DEADLOCK, DbFault.SERIALIZATION_FAILURE, DbFault.LOCKED})

_SQLSTATES = {
    "40P01": DbFault.DEADLOCK,
    "40001": DbFault.SERIALIZATION_FAILURE,
    "57014": DbFault.STATEMENT_TIMEOUT,
    "57P01": DbFault.UNAVAILABLE,  # admin_shutdown (server stopping or restarting)
    "57P02": DbFault.UNAVAILABLE,  # crash_shutdown
    "57P03": DbFault.UNAVAILABLE,  # cannot_connect_now (server starting up)
    "53300": DbFault.UNAVAILABLE,  # too_many_connections
}

_SQLITE_LOCKED = ("database is locked", "database table is locked", "database schema is locked")


def classify(exc: BaseException) -> DbFault | None:
    """Name the transient database fault ``exc`` is, or None for anything else.

    Args:
        exc: any exception; SQLAlchemy wraps driver errors in ``DBAPIError`` (``.orig``
            carries asyncpg's ``sqlstate``, or sqlite3's message).

    Returns:
        The fault, or None when ``exc`` is not a transient database fault (a bug, a
        constraint violation, a domain error): those must surface as they are.
    """
    if isinstance(exc, PoolTimeout):
        return DbFault.POOL_TIMEOUT
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None)
        if isinstance(sqlstate, str):
            fault = _SQLSTATES.get(sqlstate)
            if fault is not None:
                return fault
            if sqlstate.startswith("08"):  # connection_exception and its subclasses
                return DbFault.UNAVAILABLE
        if exc.connection_invalidated:
            return DbFault.UNAVAILABLE
        if isinstance(exc, OperationalError) or isinstance(exc.orig, OSError):
            message = str(exc.orig).lower()
            if any(text in message for text in _SQLITE_LOCKED):
                return DbFault.LOCKED
            return DbFault.UNAVAILABLE
        return None
    if isinstance(exc, ConnectionError):
        # Raised by the driver before SQLAlchemy wraps anything (connection refused).
        return DbFault.UNAVAILABLE
    return None


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
