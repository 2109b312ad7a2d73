"""Column types shared by PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Integer
from sqlalchemy.types import TypeDecorator

# SQLite only auto-increments an ``INTEGER PRIMARY KEY``; PostgreSQL wants BIGINT identity.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``. SQLite has no timezone, so values are stored as UTC
    text in SQLAlchemy's ``YYYY-MM-DD HH:MM:SS.ffffff`` format (the same format
    :func:`app.db.dialect.now_expr` produces, so SQL comparisons with the database clock
    are lexical and correct) and read back with ``tzinfo=UTC`` attached.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; naive for SQLite.

        Raises:
            ValueError: a naive datetime (its timezone would be a guess).
        """
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are refused; pass a timezone-aware UTC value")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """Return an aware UTC datetime."""
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
