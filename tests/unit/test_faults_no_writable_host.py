"""asyncpg finding no read-write host of a multi-host URL (mid-failover) is unavailable."""

from __future__ import annotations

import asyncpg
from sqlalchemy.exc import DBAPIError

from app.db.faults import DbFault, classify


def test_no_read_write_host_is_unavailable_raw_and_wrapped() -> None:
    raw = asyncpg.TargetServerAttributeNotMatched("None of the hosts match 'read-write'")
    assert classify(raw) is DbFault.UNAVAILABLE
    wrapped = DBAPIError("connect", None, Exception("InternalClientError"))
    wrapped.orig.__cause__ = raw  # type: ignore[union-attr]
    assert classify(wrapped) is DbFault.UNAVAILABLE


def test_other_client_errors_stay_unclassified() -> None:
    assert classify(asyncpg.InternalClientError("something else")) is None
