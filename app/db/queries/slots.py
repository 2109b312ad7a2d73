"""Queries on concurrency slots: who holds a key's slots, who waits, granting one.

A run submitted with a concurrency key holds one of the key's ``key_limit`` slots
(``runs.concurrency_slot``, 1..N) from admission until it is terminal, or waits for one
(slot NULL, ``available_at`` NULL). The unique partial index
``uq_runs_active_concurrency_slot`` makes two active holders of one slot impossible; the
per-key lock (:func:`lock_key`) orders every decision about a key so that a waiter is
never left behind a free slot (docs/adr/0008-queue-controls.md).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from sqlalchemy import ColumnElement, RowMapping, TextClause, and_, case, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.dialect import now_expr
from app.db.tables import (
    ACTIVE_CONCURRENCY_SLOT_WHERE,
    TERMINAL_STATUSES_SQL,
    WAITING_FOR_SLOT_WHERE,
    runs,
)


def _key_of(tenant_id: str, workflow: str, key: str) -> list[ColumnElement[bool]]:
    return [
        runs.c.tenant_id == tenant_id,
        runs.c.workflow == workflow,
        runs.c.concurrency_key == key,
    ]


def _holding() -> TextClause:
    # The unique slot index's own predicate, as literal SQL, so PostgreSQL answers from
    # that index (a bound status list would hide the match from a generic plan).
    return text(ACTIVE_CONCURRENCY_SLOT_WHERE)


def _waiting() -> TextClause:
    # The predicate of ix_runs_waiting_for_slot, likewise.
    return text(WAITING_FOR_SLOT_WHERE)


def key_lock_id(tenant_id: str, workflow: str, key: str) -> int:
    """The PostgreSQL advisory-lock id of one (tenant, workflow, concurrency key).

    A signed 64-bit BLAKE2b digest, the same in every process (Python's ``hash`` is
    salted per process). Two keys sharing an id only serialise with each other.
    """
    digest = hashlib.blake2b(
        "\x1f".join(("treadle-concurrency-key", tenant_id, workflow, key)).encode(),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


async def lock_key(conn: AsyncConnection, tenant_id: str, workflow: str, key: str) -> None:
    """Serialise decisions about one concurrency key until this transaction ends.

    PostgreSQL: ``pg_advisory_xact_lock`` on :func:`key_lock_id`, released at commit or
    rollback. Every statement after it (READ COMMITTED) sees what earlier holders of the
    lock committed. SQLite: nothing to do, every write transaction already holds the
    database write lock (``BEGIN IMMEDIATE``).
    """
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(:k)"), {"k": key_lock_id(tenant_id, workflow, key)}
        )


@dataclass(frozen=True, slots=True)
class Holder:
    """An active run holding a slot of a key."""

    run_id: uuid.UUID
    slot: int


async def holders(conn: AsyncConnection, tenant_id: str, workflow: str, key: str) -> list[Holder]:
    """The key's active slot holders, oldest (by run id, i.e. submission) first."""
    stmt = (
        select(runs.c.run_id, runs.c.concurrency_slot)
        .where(*_key_of(tenant_id, workflow, key), _holding())
        .order_by(runs.c.run_id)
    )
    return [Holder(uuid.UUID(str(r[0])), int(r[1])) for r in (await conn.execute(stmt)).all()]


async def oldest_waiter(
    conn: AsyncConnection, tenant_id: str, workflow: str, key: str
) -> RowMapping | None:
    """The key's longest-waiting run (lowest run id): ``run_id``, ``version``, or None.

    Submission order is run-id order (UUIDv7); priority does not reorder waiters.
    """
    stmt = (
        select(runs.c.run_id, runs.c.version)
        .where(*_key_of(tenant_id, workflow, key), _waiting())
        .order_by(runs.c.run_id)
        .limit(1)
    )
    return (await conn.execute(stmt)).mappings().first()


async def grant_slot(
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, slot: int
) -> bool:
    """Give a waiting run of ``tenant_id`` ``slot`` and make it claimable.

    ``available_at`` becomes now, or the start time it asked for (``not_before``) if that
    is later; ``blocked_reason`` is cleared. The status is kept (``queued``, or
    ``cancelling`` for a waiter cancelled with compensations to run).

    Returns:
        False when the run no longer waits (cancelled since it was read).
    """
    now = now_expr(conn.dialect.name)
    stmt = (
        update(runs)
        .where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id, _waiting())
        .values(
            concurrency_slot=slot,
            available_at=case(
                (and_(runs.c.not_before.is_not(None), runs.c.not_before > now), runs.c.not_before),
                else_=now,
            ),
            not_before=None,
            blocked_reason=None,
            updated_at=now,
        )
    )
    return (await conn.execute(stmt)).rowcount == 1


@dataclass(frozen=True, slots=True)
class WaitingKey:
    """A key with runs waiting for a slot, and how many runs hold its slots."""

    tenant_id: str
    workflow: str
    key: str
    waiting: int
    holding: int


async def keys_with_waiters(conn: AsyncConnection, *, limit: int) -> list[WaitingKey]:
    """Keys that have waiting runs (up to ``limit`` keys, those waiting longest first).

    For the worker's sweep: one pass over ``ix_runs_waiting_for_slot`` plus a count of
    holders per key from the slot index.
    """
    held = runs.alias("held")
    holding = (
        select(func.count())
        .where(
            held.c.tenant_id == runs.c.tenant_id,
            held.c.workflow == runs.c.workflow,
            held.c.concurrency_key == runs.c.concurrency_key,
            text(
                f"held.concurrency_slot IS NOT NULL AND held.status NOT IN {TERMINAL_STATUSES_SQL}"
            ),
        )
        .scalar_subquery()
    )
    stmt = (
        select(
            runs.c.tenant_id,
            runs.c.workflow,
            runs.c.concurrency_key,
            func.count().label("waiting"),
            holding.label("holding"),
        )
        .where(_waiting())
        .group_by(runs.c.tenant_id, runs.c.workflow, runs.c.concurrency_key)
        .order_by(func.min(runs.c.created_at))
        .limit(limit)
    )
    return [
        WaitingKey(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]))
        for r in (await conn.execute(stmt)).all()
    ]


async def count_waiting_by_version(
    conn: AsyncConnection, *, tenant_id: str
) -> dict[tuple[str, str], int]:
    """The tenant's runs waiting for a slot per ``(workflow, version)``."""
    stmt = (
        select(runs.c.workflow, runs.c.version, func.count())
        .where(runs.c.tenant_id == tenant_id, _waiting())
        .group_by(runs.c.workflow, runs.c.version)
    )
    return {(str(w), str(v)): int(n) for w, v, n in (await conn.execute(stmt)).all()}
