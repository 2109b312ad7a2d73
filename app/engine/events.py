"""Posted events: triggers that start runs, and ``ctx.wait_for_event`` (docs/adr/0029).

``POST /events`` records an event in ``inbound_events`` and, in the same transaction,
starts every workflow whose latest definition declares ``on_event`` = its name and whose
``event_filter`` holds, and delivers it into the mailbox (``event_waits``) of every run of
the tenant waiting for it with a ``match`` that holds. A wait that starts looks back
through the events received since its run was created, so an event that arrives just
before the run reaches its wait is not lost. Posts and starting waits of one (tenant,
name) serialise on :func:`app.db.queries.inbound_events.lock_name`.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import IdempotencyConflict
from app.core.event_match import matches
from app.core.ids import new_uuid7
from app.core.status import AccessPolicy, EventKind, RunStatus, StepStatus
from app.core.tracing import TraceContext
from app.db.database import Database
from app.db.queries import events as run_events_q
from app.db.queries import inbound_events as q
from app.db.queries import runs as runs_q
from app.engine.outcomes import PendingWait
from app.engine.submit import SubmitRequest, Submitter, _version_order, insert_prepared
from app.engine.waits import open_wait
from app.engine.wakeup import notify
from app.sdk.errors import WaitTimedOut

if TYPE_CHECKING:
    from app.engine.executor import RunExecution


@dataclass(frozen=True, slots=True)
class EventPost:
    """One ``POST /events``: name, JSON data and optional idempotency key."""

    name: str
    data: Any
    key: str | None = None

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the canonical ``{name, data}``: what a retry with the key matches.

        Canonical as run submissions are (docs/adr/0012): key order and number spelling
        do not matter, strings compare exactly.
        """
        body = {"name": self.name, "data": self.data}
        return hashlib.sha256(json.canonical_dumps(body).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A posted event as stored, with what it started and where it was delivered.

    Attributes:
        row: the ``inbound_events`` row.
        started_run_ids: runs its triggers started, in workflow-name order.
        resumed_run_ids: runs it was delivered to (at the post, or later to a wait that
            started afterwards and looked back), by run id.
    """

    row: RowMapping
    started_run_ids: list[uuid.UUID]
    resumed_run_ids: list[uuid.UUID]


async def _record(
    conn: AsyncConnection, tenant_id: str, row: RowMapping, owner: str | None
) -> EventRecord:
    # ``owner``: the reader's subject; runs it may not see (owner policy) are left out.
    started = [uuid.UUID(r) for r in json.loads(row["started_run_ids"])]
    delivered = await q.deliveries(conn, tenant_id, row["event_id"])
    resumed = sorted({d["run_id"] for d in delivered})
    visible = await q.visible_run_ids(conn, tenant_id, [*started, *resumed], owner)
    return EventRecord(
        row=row,
        started_run_ids=[r for r in started if r in visible],
        resumed_run_ids=[r for r in resumed if r in visible],
    )


async def get_event(
    db: Database, tenant_id: str, event_id: uuid.UUID, *, owner: str | None = None
) -> EventRecord | None:
    """One of the tenant's posted events with its runs, or None (unknown, other tenant's).

    ``owner``: the reader's subject (``Principal.owner_filter``); another subject's
    owner-policy runs are not listed.
    """
    async with db.read() as conn:
        row = await q.get_event(conn, tenant_id, event_id)
        return None if row is None else await _record(conn, tenant_id, row, owner)


async def list_events(
    db: Database,
    tenant_id: str,
    *,
    name: str | None,
    before_event_id: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> list[EventRecord]:
    """The tenant's posted events newest first (keyset on the event id; ``owner`` as above).

    May lag (:meth:`Database.lagging_read`): a list, read for looking at only.
    """
    async with db.lagging_read() as conn:
        rows = await q.list_events(
            conn, tenant_id, name=name, before_event_id=before_event_id, limit=limit
        )
        return [await _record(conn, tenant_id, r, owner) for r in rows]


@dataclass(frozen=True, slots=True)
class _Trigger:
    request: SubmitRequest
    input_text: str
    version: str
    access: str


async def _triggers(
    db: Database, submitter: Submitter, post: EventPost, event_id: uuid.UUID
) -> list[_Trigger]:
    # Read outside the write transaction (as a submit's definition lookup is): each
    # workflow's latest version, started when it declares this event and its filter holds.
    async with db.read() as conn:
        rows = await q.trigger_definitions(conn, post.name)
    by_name: dict[str, list[RowMapping]] = {}
    for row in rows:
        by_name.setdefault(str(row["name"]), []).append(row)
    found: list[_Trigger] = []
    for workflow, versions in sorted(by_name.items()):
        latest = max(versions, key=_version_order)
        if latest["on_event"] != post.name:
            continue
        if not matches(json.loads(latest["event_filter"]) or {}, post.data):
            continue
        request = SubmitRequest(
            workflow=workflow,
            input=post.data,
            version=str(latest["version"]),
            # One run per (event, workflow), whatever retries the transaction takes.
            idempotency_key=f"event:{event_id}:{workflow}",
        )
        input_text, version = await submitter.prepare(request)
        access = await submitter.access(workflow, version)
        found.append(_Trigger(request, input_text, version, access))
    return found


async def post_event(
    db: Database,
    submitter: Submitter,
    post: EventPost,
    *,
    tenant_id: str,
    subject: str,
    api_key_id: uuid.UUID | None = None,
    trace: TraceContext | None = None,
    owner: str | None = None,
) -> tuple[EventRecord, bool]:
    """Record an event, start its triggered runs and deliver it to waiting runs, atomically.

    Args:
        db: the database.
        submitter: validates each triggered run's input against its definition.
        post: the event (``data`` already bounded by the API's body limits).
        tenant_id: the caller's tenant (events, triggers and waits are per tenant).
        subject: the caller; ``sent_by`` of the event and ``created_by`` of started runs.
        api_key_id: the API key used, stored with started runs as for a submit.
        trace: the W3C trace context started runs are submitted under.
        owner: the caller's owner filter (``Principal.owner_filter``: its subject, None
            for an admin). The event reaches only runs it may act on, as a signal does
            (another subject's ``access="owner"`` runs get nothing, now or by a later
            wait's look-back, :func:`may_reach`); triggered runs are the caller's, as a
            submit's are (``created_by``, API key, the definition's access policy).

    Returns:
        ``(record, created)``; created is False when ``post.key`` was already used for
        an identical event (nothing new is started or delivered).

    Raises:
        IdempotencyConflict: the key was used for a different name or data (409).
        InvalidInput: the data fails a triggered workflow's input schema (422; nothing
            is recorded, so a retry after the fix starts every trigger).
        PayloadTooLarge: data over ``TREADLE_MAX_PAYLOAD_BYTES`` (413).
    """
    data_text = json.dumps_limited(post.data, submitter.settings.max_payload_bytes, "event data")
    fingerprint = post.fingerprint()
    event_id = new_uuid7()
    triggers = await _triggers(db, submitter, post, event_id)

    async def write(conn: AsyncConnection) -> tuple[EventRecord, bool]:
        await q.lock_name(conn, tenant_id, post.name)
        row = await q.insert_event(
            conn,
            event_id=event_id,
            tenant_id=tenant_id,
            name=post.name,
            data=data_text,
            key=post.key,
            request_hash=fingerprint,
            sent_by=subject,
            sent_by_admin=owner is None,
        )
        if row is None:
            assert post.key is not None  # only a key can conflict
            existing = await q.get_by_key(conn, tenant_id, post.key)
            assert existing is not None  # the conflicting row is committed and kept
            if existing["request_hash"] != fingerprint:
                raise IdempotencyConflict(
                    f"event key {post.key!r} was already used for a different event "
                    "(name or data differ)",
                    event_id=str(existing["event_id"]),
                )
            return await _record(conn, tenant_id, existing, owner), False
        started: list[str] = []
        for t in triggers:
            run, _ = await insert_prepared(
                conn,
                t.request,
                t.input_text,
                t.version,
                tenant_id=tenant_id,
                subject=subject,
                api_key_id=api_key_id,
                access=t.access,
                trace=trace,
            )
            started.append(str(run["run_id"]))
        await q.set_started(conn, event_id, json.dumps(started))
        await _deliver(conn, row, subject, owner)
        await notify(conn)
        stored = await q.get_event(conn, tenant_id, event_id)
        assert stored is not None
        return await _record(conn, tenant_id, stored, owner), True

    return await db.write_retrying(write, what="post event")


def may_reach(event: RowMapping, run: RowMapping) -> bool:
    """Whether a posted event may be delivered into ``run``: the rule of a signal.

    A tenant-policy run takes any of its tenant's events; an ``access="owner"`` run only
    its owner's (``sent_by`` is its ``created_by``) or an admin's (``sent_by_admin``), exactly
    whom ``POST /runs/{id}/signals/{name}`` lets through
    (:func:`app.db.queries.runs.visible_to`, docs/security.md "Owner policy"). Applied
    at the post (:func:`app.db.queries.inbound_events.open_waits` filters by it in SQL)
    and by a starting wait's look-back (:func:`wait_for_event`).
    """
    return (
        run["access"] != AccessPolicy.OWNER
        or bool(event["sent_by_admin"])
        or event["sent_by"] == run["created_by"]
    )


async def _deliver(conn: AsyncConnection, event: RowMapping, actor: str, owner: str | None) -> None:
    # Into every open wait of the tenant on this name whose match holds, in runs the
    # sender may act on (``owner``, as a signal's 404): at most one wait per run (its
    # first by step id), each run's row locked first, as a signal does, so a release
    # racing this either sees the delivery or is seen waiting.
    data = json.loads(event["data"])
    done: set[uuid.UUID] = set()
    for wait in await q.open_waits(conn, event["tenant_id"], event["name"], owner=owner):
        run_id = wait["run_id"]
        if run_id in done or not matches(json.loads(wait["match"]) or {}, data):
            continue
        run = await runs_q.lock_run(conn, event["tenant_id"], run_id)
        if RunStatus(run["status"]).is_terminal or not may_reach(event, run):
            continue
        if not await q.deliver(
            conn, run_id, wait["step_id"], event["event_id"], tenant_id=event["tenant_id"]
        ):
            continue
        done.add(run_id)
        await run_events_q.append(
            conn,
            run_id=run_id,
            tenant_id=event["tenant_id"],
            kind=EventKind.EVENT_DELIVERED,
            actor=actor,
            step_id=wait["step_id"],
            data={"event_id": str(event["event_id"]), "name": event["name"]},
        )
        await runs_q.make_due(conn, run_id=run_id, tenant_id=event["tenant_id"])


def received_value(event: RowMapping) -> dict[str, Any]:
    """What ``ctx.wait_for_event`` returns and journals: id, name, key, data, received_at."""
    received: datetime = event["received_at"]
    return {
        "event_id": str(event["event_id"]),
        "name": event["name"],
        "key": event["key"],
        "data": json.loads(event["data"]),
        "received_at": received.isoformat(),
    }


async def wait_for_event(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    name: str,
    match: dict[str, Any],
    timeout: float | None,
) -> dict[str, Any]:
    """``ctx.wait_for_event``: the first matching event since the run was created, or wait.

    Journaled as a step of kind ``event`` (name = the event name): its output is
    :func:`received_value` of the delivered event, replayed verbatim. The run waits as
    ``waiting_event`` (``waiting_on`` ``event:<name>``) until a post delivers one. What an
    event is and what matches are decided here; the writes (wait, mailbox, look-back,
    delivery, result, timeout) are the journal's (``ex.journal.waits``,
    docs/adr/0038-one-writer-of-leased-run-state.md).

    Raises:
        WaitTimedOut: ``timeout`` seconds (database time, from when the wait was first
            recorded) passed with no matching event.
    """
    if entry is not None and entry["status"] == StepStatus.SUCCEEDED:
        value: dict[str, Any] = json.loads(entry["output"])
        return value
    deadline = await open_wait(ex, step_id=step_id, kind="event", entry=entry, timeout=timeout)
    # Journaled twice (step detail, mailbox): bounded like any payload.
    match_text = json.dumps_limited(match, ex.settings.max_payload_bytes, "wait_for_event match")
    own = str(ex.run_id)

    def wanted(event: RowMapping) -> bool:
        # A starting wait looks back for an event that matches, did not start this very
        # run (its trigger's input is that event already) and whose sender may act on
        # the run (the owner policy, as at the post).
        return (
            own not in json.loads(event["started_run_ids"])
            and may_reach(event, ex.run)
            and matches(match, json.loads(event["data"]))
        )

    if entry is None:
        taken = await ex.journal.waits.open_event_wait(
            step_id=step_id,
            seq=seq,
            name=name,
            deadline=deadline,
            detail={"event": name, "match": match, "timeout": timeout},
            match=match_text,
            # The look-back window: every event received since the run was created.
            since=ex.run["created_at"],
            wanted=wanted,
            received=received_value,
        )
    else:
        taken = await ex.journal.waits.take_delivered_event(
            step_id=step_id, name=name, deadline=deadline, received=received_value
        )
    if taken.found:
        result: dict[str, Any] = taken.value
        return result
    if taken.timed_out:
        assert deadline is not None
        raise WaitTimedOut(step_id, "event", deadline.isoformat())
    remaining = None if deadline is None else (deadline - ex.db_now()).total_seconds()
    await ex.suspend(
        PendingWait(
            max(remaining, 0.0) if remaining is not None else None,
            RunStatus.WAITING_EVENT,
            "event",
            name,
            ex.journal.waits.event_delivered(step_id),
        )
    )
