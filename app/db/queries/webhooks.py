"""Outbound webhooks: endpoints, the deliveries a terminal write creates, the sender's claim.

docs/adr/0030-outbound-webhooks.md. A delivery row is written in the transaction that
makes a run terminal (:func:`record_terminal`, or the ``webhooks`` CTE of PostgreSQL's
single-statement completion in ``app/db/queries/checkpoints.py``, which must match the same
endpoints). Workers claim due deliveries (:func:`claim_due`): the claim advances the
delivery's ``fence``, counts the attempt, writes its ``webhook_attempts`` row and pushes
``next_attempt_at`` past the send's deadline, so a sender killed mid-POST leaves the
delivery due again for another worker; the outcome is written under the fence
(:func:`finish_attempt`), so a sender that lost its claim writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    RowMapping,
    Select,
    and_,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import WebhookNotFound
from app.core.ids import new_uuid7
from app.db.dialect import now_expr
from app.db.tables import runs, webhook_attempts, webhook_deliveries, webhook_endpoints

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
"""``webhook_deliveries.state`` values."""


def events_column(events: Sequence[str]) -> str:
    """Stored form of an endpoint's statuses: ``",completed,failed,"`` (see tables.py)."""
    return "," + ",".join(events) + ","


def events_of(stored: str) -> list[str]:
    """Inverse of :func:`events_column`."""
    return [e for e in stored.split(",") if e]


async def insert_endpoint(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    url: str,
    events: Sequence[str],
    workflow: str | None,
    secret: str,
    created_by: str,
) -> RowMapping:
    """Create an endpoint; returns its row."""
    stmt = (
        insert(webhook_endpoints)
        .values(
            endpoint_id=uuid.uuid4(),
            tenant_id=tenant_id,
            url=url,
            events=events_column(events),
            workflow=workflow,
            secret=secret,
            created_by=created_by,
            created_at=now_expr(conn.dialect.name),
        )
        .returning(*webhook_endpoints.c)
    )
    return (await conn.execute(stmt)).mappings().one()


async def count_endpoints(conn: AsyncConnection, tenant_id: str) -> int:
    """How many endpoints the tenant has."""
    stmt = select(func.count()).where(webhook_endpoints.c.tenant_id == tenant_id)
    return int((await conn.execute(stmt)).scalar_one())


async def list_endpoints(conn: AsyncConnection, tenant_id: str) -> list[RowMapping]:
    """The tenant's endpoints, oldest first (a tenant has at most a few dozen)."""
    stmt = (
        select(webhook_endpoints)
        .where(webhook_endpoints.c.tenant_id == tenant_id)
        .order_by(webhook_endpoints.c.created_at, webhook_endpoints.c.endpoint_id)
    )
    return list((await conn.execute(stmt)).mappings())


async def get_endpoint(conn: AsyncConnection, tenant_id: str, endpoint_id: uuid.UUID) -> RowMapping:
    """One endpoint of the tenant.

    Raises:
        WebhookNotFound: no such endpoint *for this tenant* (another tenant's id too).
    """
    stmt = select(webhook_endpoints).where(
        webhook_endpoints.c.endpoint_id == endpoint_id,
        webhook_endpoints.c.tenant_id == tenant_id,
    )
    row = (await conn.execute(stmt)).mappings().first()
    if row is None:
        raise WebhookNotFound(f"webhook {endpoint_id} not found", webhook_id=str(endpoint_id))
    return row


async def delete_endpoint(conn: AsyncConnection, tenant_id: str, endpoint_id: uuid.UUID) -> None:
    """Delete an endpoint with its deliveries and their attempts (pending ones are dropped).

    Raises:
        WebhookNotFound: no such endpoint for this tenant.
    """
    await get_endpoint(conn, tenant_id, endpoint_id)
    # Explicit: deliveries have no foreign key to their endpoint (tables.py says why).
    ids = select(webhook_deliveries.c.delivery_id).where(
        webhook_deliveries.c.endpoint_id == endpoint_id
    )
    await conn.execute(delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(ids)))
    await conn.execute(
        delete(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == endpoint_id)
    )
    await conn.execute(
        delete(webhook_endpoints).where(webhook_endpoints.c.endpoint_id == endpoint_id)
    )


def _matches_run() -> list[object]:
    """Endpoint conditions for the run in ``runs`` (same rule as checkpoints' CTE)."""
    return [
        webhook_endpoints.c.tenant_id == runs.c.tenant_id,
        webhook_endpoints.c.events.contains(literal(",") + runs.c.status + literal(",")),
        or_(
            webhook_endpoints.c.workflow.is_(None), webhook_endpoints.c.workflow == runs.c.workflow
        ),
    ]


async def record_terminal(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> int:
    """After a run of ``tenant_id`` became terminal in this transaction: one delivery a match.

    An endpoint matches when it is of the run's tenant, lists the run's terminal status,
    and has no workflow filter or the run's workflow. Each delivery is due at once.

    Returns:
        How many deliveries were written (0 for a tenant without endpoints: one indexed
        read, nothing written).
    """
    found = (
        await conn.execute(
            select(
                webhook_endpoints.c.endpoint_id,
                runs.c.tenant_id,
                runs.c.workflow,
                runs.c.status,
                runs.c.reason,
                runs.c.finished_at,
            ).where(
                runs.c.tenant_id == tenant_id,
                runs.c.run_id == run_id,
                *_matches_run(),  # type: ignore[arg-type]
            )
        )
    ).all()
    if not found:
        return 0
    now = now_expr(conn.dialect.name)
    rows = [
        {
            "delivery_id": new_uuid7(),
            "endpoint_id": endpoint_id,
            "tenant_id": tenant_id,
            "run_id": run_id,
            "workflow": workflow,
            "run_status": status,
            "run_reason": reason,
            "finished_at": finished_at,
        }
        for endpoint_id, tenant_id, workflow, status, reason, finished_at in found
    ]
    await conn.execute(
        insert(webhook_deliveries).values(
            state=PENDING, attempts=0, fence=0, next_attempt_at=now, created_at=now, updated_at=now
        ),
        rows,
    )
    return len(rows)


def _due(now: datetime) -> Select[tuple[uuid.UUID]]:
    """Pending deliveries due at ``now`` whose endpoint still exists."""
    return (
        select(webhook_deliveries.c.delivery_id)
        .join(
            webhook_endpoints,
            webhook_endpoints.c.endpoint_id == webhook_deliveries.c.endpoint_id,
        )
        .where(webhook_deliveries.c.state == PENDING, webhook_deliveries.c.next_attempt_at <= now)
    )


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A delivery a sender holds: what to POST, where, and the fence to write under."""

    delivery_id: uuid.UUID
    tenant_id: str
    endpoint_id: uuid.UUID
    url: str
    secret: str
    run_id: uuid.UUID
    workflow: str
    run_status: str
    run_reason: str | None
    finished_at: datetime
    attempt: int
    fence: int


async def claim_due(
    conn: AsyncConnection, *, worker_id: str, now: datetime, lease_until: datetime, limit: int
) -> list[ClaimedDelivery]:
    """Claim up to ``limit`` due pending deliveries for one attempt each.

    ``FOR UPDATE SKIP LOCKED`` lets concurrent workers each take different deliveries on
    PostgreSQL (SQLite's single writer serializes claims anyway). Each claimed delivery's
    fence advances, its attempt is counted and journaled (``started_at`` = ``now``), and
    its ``next_attempt_at`` becomes ``lease_until``: if this sender dies, the delivery is
    due again then, and its attempt row stays without an outcome (shown as interrupted).
    """
    pick = (
        _due(now)
        .order_by(webhook_deliveries.c.next_attempt_at)
        .limit(limit)
        .with_for_update(of=webhook_deliveries, skip_locked=True)
    )
    ids = list((await conn.execute(pick)).scalars())
    if not ids:
        return []
    claimed = (
        await conn.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.delivery_id.in_(ids))
            .values(
                fence=webhook_deliveries.c.fence + 1,
                attempts=webhook_deliveries.c.attempts + 1,
                next_attempt_at=lease_until,
                lease_owner=worker_id,
                updated_at=now,
            )
            .returning(*webhook_deliveries.c)
        )
    ).mappings()
    by_id = {r["delivery_id"]: r for r in claimed}
    await conn.execute(
        insert(webhook_attempts),
        [
            {
                "tenant_id": r["tenant_id"],
                "delivery_id": d,
                "attempt": r["attempts"],
                "started_at": now,
            }
            for d, r in by_id.items()
        ],
    )
    targets = {
        e["endpoint_id"]: e
        for e in (
            await conn.execute(
                select(
                    webhook_endpoints.c.endpoint_id,
                    webhook_endpoints.c.url,
                    webhook_endpoints.c.secret,
                ).where(
                    webhook_endpoints.c.endpoint_id.in_({r["endpoint_id"] for r in by_id.values()})
                )
            )
        ).mappings()
    }
    return [
        ClaimedDelivery(
            delivery_id=r["delivery_id"],
            tenant_id=r["tenant_id"],
            endpoint_id=r["endpoint_id"],
            url=targets[r["endpoint_id"]]["url"],
            secret=targets[r["endpoint_id"]]["secret"],
            run_id=r["run_id"],
            workflow=r["workflow"],
            run_status=r["run_status"],
            run_reason=r["run_reason"],
            finished_at=r["finished_at"],
            attempt=int(r["attempts"]),
            fence=int(r["fence"]),
        )
        for r in by_id.values()
    ]


async def any_due(conn: AsyncConnection, now: datetime) -> bool:
    """True if some pending delivery is due (an idle poll writes nothing)."""
    return (await conn.execute(_due(now).limit(1))).first() is not None


async def finish_attempt(
    conn: AsyncConnection,
    claimed: ClaimedDelivery,
    *,
    now: datetime,
    http_status: int | None,
    error: str | None,
    state: str,
    next_attempt_at: datetime | None,
) -> bool:
    """Write an attempt's outcome and the delivery's next state, under the claim's fence.

    Args:
        conn: the transaction.
        claimed: the claim (its fence and attempt number).
        now: the database time of the outcome (the attempt's ``finished_at``).
        http_status: the receiver's answer, or None when there was none.
        error: why the attempt failed, or None.
        state: ``delivered``, ``failed`` (final) or ``pending`` (retry at ``next_attempt_at``).
        next_attempt_at: when a ``pending`` delivery is due again; None otherwise.

    Returns:
        False when the fence moved (the claim lapsed and another sender took the
        delivery): nothing is written.
    """
    moved = await conn.execute(
        update(webhook_deliveries)
        .where(
            webhook_deliveries.c.delivery_id == claimed.delivery_id,
            webhook_deliveries.c.fence == claimed.fence,
            webhook_deliveries.c.state == PENDING,
        )
        .values(
            state=state,
            next_attempt_at=next_attempt_at,
            lease_owner=None,
            updated_at=now,
        )
    )
    if moved.rowcount != 1:
        return False
    await conn.execute(
        update(webhook_attempts)
        .where(
            webhook_attempts.c.delivery_id == claimed.delivery_id,
            webhook_attempts.c.attempt == claimed.attempt,
        )
        .values(finished_at=now, http_status=http_status, error=error)
    )
    return True


async def list_deliveries(
    conn: AsyncConnection,
    endpoint_id: uuid.UUID,
    *,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> tuple[list[RowMapping], dict[uuid.UUID, list[RowMapping]]]:
    """An endpoint's deliveries, newest first, with each one's attempts.

    The caller has checked the endpoint is the tenant's (:func:`get_endpoint`).
    ``before``: the page cursor ``(created_at, delivery_id)`` of the last one served.

    Returns:
        ``(deliveries, attempts by delivery id in attempt order)``.
    """
    d = webhook_deliveries.c
    stmt = select(webhook_deliveries).where(d.endpoint_id == endpoint_id)
    if before is not None:
        at, last = before
        stmt = stmt.where(or_(d.created_at < at, and_(d.created_at == at, d.delivery_id < last)))
    stmt = stmt.order_by(d.created_at.desc(), d.delivery_id.desc()).limit(limit)
    rows = list((await conn.execute(stmt)).mappings())
    attempts: dict[uuid.UUID, list[RowMapping]] = {r["delivery_id"]: [] for r in rows}
    if rows:
        found = (
            await conn.execute(
                select(webhook_attempts)
                .where(webhook_attempts.c.delivery_id.in_(list(attempts)))
                .order_by(webhook_attempts.c.delivery_id, webhook_attempts.c.attempt)
            )
        ).mappings()
        for a in found:
            attempts[a["delivery_id"]].append(a)
    return rows, attempts


async def run_for_payload(conn: AsyncConnection, run_id: uuid.UUID) -> RowMapping | None:
    """The run's version, creation time and labels (JSON text) for a delivery's body.

    None when the run is gone from ``runs`` (archived by maintenance): the body then
    carries what the delivery row itself holds.
    """
    stmt = select(runs.c.version, runs.c.created_at, runs.c.labels).where(runs.c.run_id == run_id)
    return (await conn.execute(stmt)).mappings().first()
