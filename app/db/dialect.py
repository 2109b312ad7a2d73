"""Database-clock expressions for PostgreSQL and SQLite.

Timers, retries and leases are computed on the *database* clock (DESIGN §5) so that
workers on hosts with skewed clocks agree. On SQLite the embedded database runs on the
host clock; its expressions produce the text format :class:`app.db.types.UtcDateTime`
stores, so comparisons stay lexical and exact to the millisecond.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import ColumnElement, Interval, bindparam, func, literal, type_coerce

from app.db.types import UtcDateTime

_SQLITE_FORMAT = "%Y-%m-%d %H:%M:%f000"


def now_expr(dialect: str) -> ColumnElement[object]:
    """Return the database's current UTC time as a SQL expression.

    PostgreSQL: ``now()`` (transaction start, consistent within one statement batch).
    SQLite: ``strftime(…, 'now')`` in UtcDateTime's storage format.
    """
    if dialect == "sqlite":
        return type_coerce(func.strftime(_SQLITE_FORMAT, "now"), UtcDateTime())
    return type_coerce(func.now(), UtcDateTime())


def now_plus(dialect: str, seconds: float) -> ColumnElement[object]:
    """Return database time plus ``seconds`` (may be negative) as a SQL expression."""
    if dialect == "sqlite":
        modifier = literal(f"{seconds:+.6f} seconds")
        return type_coerce(func.strftime(_SQLITE_FORMAT, "now", modifier), UtcDateTime())
    delta = bindparam(None, timedelta(seconds=seconds), type_=Interval())
    return type_coerce(func.now() + delta, UtcDateTime())
