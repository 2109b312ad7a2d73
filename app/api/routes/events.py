"""Posted events: ``POST /events`` (triggers and waits) and reading them back.

Not the run timeline (``GET /runs/{id}/events``): these are events the outside world
posts (docs/adr/0029-event-triggers.md).
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api import event_schemas as es
from app.api import schemas
from app.api.deps import DB, EventsWrite, RunsRead, SubmitterDep, wake_workers
from app.api.links import EVENT_OPERATIONS, links_to
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES
from app.core import json, tracing
from app.core.errors import BadRequest, EventNotFound
from app.engine import events as engine
from app.engine.events import EventPost, EventRecord

router = APIRouter(prefix="/events", tags=["events"])


def event_view(record: EventRecord) -> es.InboundEvent:
    """The API form of a posted event."""
    row = record.row
    return es.InboundEvent(
        event_id=row["event_id"],
        name=row["name"],
        key=row["key"],
        data=json.loads(row["data"]),
        sent_by=row["sent_by"],
        received_at=row["received_at"],
        started_run_ids=record.started_run_ids,
        resumed_run_ids=record.resumed_run_ids,
    )


def _event_id(event_id: str) -> uuid.UUID:
    # Not a UUID: the same 404 as an unknown id, nothing to tell apart.
    try:
        return uuid.UUID(event_id)
    except ValueError:
        raise EventNotFound(f"event {event_id!r} not found", event_id=event_id) from None


@router.post(
    "",
    operation_id="post_event",
    status_code=201,
    response_model=es.InboundEvent,
    responses={
        **PROBLEM_RESPONSES,
        201: {"links": links_to(EVENT_OPERATIONS, "event_id")},
        200: {
            "model": es.InboundEvent,
            "description": "Identical idempotent retry (same key, name and data): the same event",
            "links": links_to(EVENT_OPERATIONS, "event_id"),
        },
        409: {"model": schemas.Problem, "description": "Key reused for another event"},
        413: {"model": schemas.Problem, "description": "Data over the limit"},
    },
)
async def post_event(
    body: es.PostEventRequest,
    request: Request,
    response: Response,
    principal: EventsWrite,
    db: DB,
    submitter: SubmitterDep,
) -> es.InboundEvent:
    """Post an event (scope ``events:write``).

    In one transaction: records it, starts a run (input = ``data``) of every workflow
    whose latest registered version declares ``on_event`` = ``name`` and whose
    ``event_filter`` holds, and delivers it to every run of the tenant waiting in
    ``ctx.wait_for_event(name, match=…)`` whose match holds (one wait per run). 201 with
    a ``Location`` header; 200 with the same event, starting and delivering nothing more,
    for a retry with the same ``key`` and the same name and data (compared as canonical
    JSON). Errors: 409 ``idempotency_key_reused`` the key was used for another event;
    422 the data fails a triggered workflow's input schema (nothing recorded); 413 data
    over ``TREADLE_MAX_PAYLOAD_BYTES``.
    """
    record, created = await engine.post_event(
        db,
        submitter,
        EventPost(name=body.name, data=body.data, key=body.key),
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        trace=tracing.submit_context(request.headers),
        owner=principal.owner_filter,
    )
    if created:
        wake_workers(request)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/events/{record.row['event_id']}"
    return event_view(record)


@router.get(
    "",
    operation_id="list_events",
    response_model=es.InboundEventPage,
    responses=PROBLEM_RESPONSES,
)
async def list_events(
    principal: RunsRead,
    db: DB,
    name: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> es.InboundEventPage:
    """The tenant's posted events, newest first (scope ``runs:read``), optionally by name."""
    tenant_id = principal.tenant_id
    filters = {"name": name}
    before: uuid.UUID | None = None
    if page_token:
        position = decode_token(page_token, tenant_id, "events", filters)
        try:
            before = uuid.UUID(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    records = await engine.list_events(
        db,
        tenant_id,
        name=name,
        before_event_id=before,
        limit=limit + 1,
        owner=principal.owner_filter,
    )
    token = None
    if len(records) > limit:
        token = encode_token(tenant_id, "events", filters, str(records[limit - 1].row["event_id"]))
    return es.InboundEventPage(
        items=[event_view(r) for r in records[:limit]], next_page_token=token
    )


@router.get(
    "/{event_id}",
    operation_id="get_event",
    response_model=es.InboundEvent,
    responses=PROBLEM_RESPONSES,
)
async def get_event(event_id: str, principal: RunsRead, db: DB) -> es.InboundEvent:
    """One posted event with the runs it started and resumed (scope ``runs:read``).

    Runs of ``access="owner"`` workflows appear only to their submitter, as in every list.

    404 ``event_not_found`` for an unknown id, one that is not a UUID, or another
    tenant's event.
    """
    record = await engine.get_event(
        db, principal.tenant_id, _event_id(event_id), owner=principal.owner_filter
    )
    if record is None:
        raise EventNotFound(f"event {event_id} not found", event_id=event_id)
    return event_view(record)
