"""Per-key concurrency: admitting runs to a key's slots, in order, on every path.

A workflow's ``key_limit`` N (app/sdk/queue.py) lets at most N runs per (tenant,
workflow, concurrency key) be active (not terminal). Each active keyed run holds one slot
1..N (``runs.concurrency_slot``); beyond N a submission is refused (``on_limit="reject"``,
409) or waits for a slot (``on_limit="queue"``): ``queued``, not claimable, with a
``blocked_reason``. When a holder becomes terminal, the same transaction grants the freed
slot to the oldest waiter (:func:`release`).

Every decision about a key runs under the key's lock (:func:`app.db.queries.slots.lock_key`),
so a submission that decides to wait and a holder that finishes at the same moment are
ordered: whichever commits second sees the other (the lost-wakeup argument in
docs/adr/0008-queue-controls.md). The unique slot index makes over-admission impossible
even for a writer that skipped the lock; the worker's sweep (:func:`sweep`) admits
waiters that a missed path or a raised limit left behind a free slot.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import structlog
from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import EventKind
from app.db.database import Database
from app.db.queries import events as events_q
from app.db.queries import slots as slots_q
from app.db.tables import workflow_definitions
from app.engine.wakeup import notify
from app.sdk.queue import QueueControls

log = structlog.get_logger("treadle.slots")


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of asking for a slot of a key.

    Attributes:
        slot: the granted slot (1..limit), or None: every slot is held, or older runs
            wait for one (first come, first served).
        limit: the key limit applied.
        active_run_id: the key's oldest active holder (named by a 409), if any.
    """

    slot: int | None
    limit: int
    active_run_id: uuid.UUID | None


def waiting_reason(key: str, limit: int) -> str:
    """The ``blocked_reason`` of a run waiting for a slot of ``key``."""
    return (
        f"waiting for a slot of concurrency key {key!r} (key_limit {limit}): "
        "admitted in submission order when an active run of the key finishes"
    )


async def controls_for(conn: AsyncConnection, workflow: str, version: str) -> QueueControls:
    """The queue controls registered for ``workflow@version`` (defaults if unknown)."""
    stmt = select(workflow_definitions.c.queue_controls).where(
        workflow_definitions.c.name == workflow, workflow_definitions.c.version == version
    )
    stored = (await conn.execute(stmt)).scalar()
    return QueueControls.from_json(None if stored is None else json.loads(stored))


async def acquire(
    conn: AsyncConnection, *, tenant_id: str, workflow: str, key: str, limit: int
) -> Admission:
    """Take the key's lock and pick a slot for a new (or requeued) run of the key.

    Runs already waiting are admitted first (they are older), so a newcomer gets a slot
    only when none of them is left waiting; otherwise it must wait behind them or be
    refused. The caller inserts or updates the run with the slot inside this same
    transaction, which keeps the lock until commit.
    """
    await slots_q.lock_key(conn, tenant_id, workflow, key)
    await admit_waiting(conn, tenant_id=tenant_id, workflow=workflow, key=key)
    held = await slots_q.holders(conn, tenant_id, workflow, key)
    oldest = held[0].run_id if held else None
    if len(held) >= limit or await slots_q.oldest_waiter(conn, tenant_id, workflow, key):
        return Admission(None, limit, oldest)
    used = {h.slot for h in held}
    return Admission(next(s for s in range(1, limit + 1) if s not in used), limit, oldest)


async def admit_waiting(
    conn: AsyncConnection, *, tenant_id: str, workflow: str, key: str
) -> list[uuid.UUID]:
    """Grant free slots of the key to its waiting runs, oldest first; the caller holds the lock.

    Each admitted run becomes claimable (``available_at`` = now, or its requested start
    if later), loses its ``blocked_reason`` and gets a ``run_admitted`` event. The oldest
    waiter blocks the line: if its version's ``key_limit`` is reached, nobody behind it
    is admitted (strict submission order, priority does not reorder it).

    Returns:
        The admitted run ids (the caller NOTIFYs workers when there are any).
    """
    admitted: list[uuid.UUID] = []
    limits: dict[str, int] = {}
    held: list[slots_q.Holder] | None = None
    skipped: set[uuid.UUID] = set()
    while True:
        waiter = await slots_q.oldest_waiter(conn, tenant_id, workflow, key)
        if waiter is None or waiter["run_id"] in skipped:
            return admitted
        version = str(waiter["version"])
        if version not in limits:
            limits[version] = (await controls_for(conn, workflow, version)).key_limit
        limit = limits[version]
        if held is None:
            held = await slots_q.holders(conn, tenant_id, workflow, key)
        used = {h.slot for h in held}
        if len(used) >= limit:
            return admitted
        slot = next(s for s in range(1, limit + 1) if s not in used)
        run_id = uuid.UUID(str(waiter["run_id"]))
        if not await slots_q.grant_slot(conn, run_id=run_id, tenant_id=tenant_id, slot=slot):
            # Cancelled while we waited for its row (PostgreSQL); the next read skips it.
            skipped.add(run_id)
            continue
        held.append(slots_q.Holder(run_id, slot))
        admitted.append(run_id)
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.RUN_ADMITTED,
            data={"concurrency_key": key, "concurrency_slot": slot, "key_limit": limit},
        )


async def release(conn: AsyncConnection, run: RowMapping) -> list[uuid.UUID]:
    """After ``run`` became terminal in this transaction: hand its slot to a waiter.

    Call it on every path that ends a run holding a slot (finished by a worker, cancelled,
    compensated, failed), after the terminal write. A run that held no slot (no key, or
    a waiter cancelled before admission) frees nothing and takes no lock, so cancelling a
    waiter never waits on its key's lock while holding the waiter's row (which an
    admission under that lock may be waiting for).

    Returns:
        The admitted run ids (the caller NOTIFYs workers when there are any).
    """
    key = run["concurrency_key"]
    if key is None or run["concurrency_slot"] is None:
        return []
    tenant_id, workflow = str(run["tenant_id"]), str(run["workflow"])
    await slots_q.lock_key(conn, tenant_id, workflow, key)
    return await admit_waiting(conn, tenant_id=tenant_id, workflow=workflow, key=key)


async def sweep(db: Database, *, limit: int = 100) -> list[uuid.UUID]:
    """Admit waiters left behind a free slot; the worker runs this periodically.

    Every path that frees a slot admits in the same transaction, so this normally finds
    nothing to do: it is the safety net for a path that frees a slot without admitting
    (a process on older code during a rolling deploy) and for a ``key_limit`` raised by
    a new version. One read finds keys with waiters and fewer holders than the largest
    limit any version of the workflow declares; each such key is then re-decided under
    its lock in its own transaction.

    Returns:
        The admitted run ids.
    """
    async with db.read() as conn:
        keys = await slots_q.keys_with_waiters(conn, limit=limit)
        rows = (
            await conn.execute(
                select(workflow_definitions.c.name, workflow_definitions.c.queue_controls)
            )
        ).all()
    largest: dict[str, int] = {}
    for name, stored in rows:
        limit_of = QueueControls.from_json(None if stored is None else json.loads(stored)).key_limit
        largest[name] = max(largest.get(name, 1), limit_of)
    admitted: list[uuid.UUID] = []
    for k in keys:
        if k.holding >= largest.get(k.workflow, 1):
            continue
        async with db.write() as conn:
            await slots_q.lock_key(conn, k.tenant_id, k.workflow, k.key)
            now_admitted = await admit_waiting(
                conn, tenant_id=k.tenant_id, workflow=k.workflow, key=k.key
            )
            if now_admitted:
                await notify(conn)
        if now_admitted:
            log.warning(
                "sweep admitted runs waiting behind a free slot",
                workflow=k.workflow,
                admitted=len(now_admitted),
            )
        admitted += now_admitted
    return admitted
