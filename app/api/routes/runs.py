"""``/runs``: submit, list, inspect, wait for, report on and cancel runs."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response
from pydantic import ValidationError
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api import schemas
from app.api.deps import (
    DB,
    RunsCancel,
    RunsRead,
    RunsWrite,
    SettingsDep,
    SubmitterDep,
    TenantQuery,
    read_tenant,
    visible_run,
    wake_workers,
)
from app.api.links import RUN_LINKS
from app.api.pagination import INT32_MAX, decode_token, encode_token, int_position
from app.api.problems import PROBLEM_RESPONSES as _PROBLEMS
from app.api.responses import SafeTextResponse
from app.api.views import (
    dead_letter_view,
    event_view,
    is_redacted,
    render_report_text,
    run_view,
    step_view,
    withheld_outputs,
)
from app.auth.principal import Principal
from app.core import metrics
from app.core.errors import BadRequest, InvalidInput, RunNotFound
from app.core.settings import Settings
from app.core.status import RunReason, RunStatus, StepStatus
from app.db.database import fetch_now
from app.db.queries import dead_letters as dl_q
from app.db.queries import definitions as defs_q
from app.db.queries import events as events_q
from app.db.queries import runs as runs_q
from app.db.queries import states as states_q
from app.db.queries import steps as steps_q
from app.engine import control
from app.engine.submit import SubmitRequest

router = APIRouter(prefix="/runs", tags=["runs"])


def parse_run_id(run_id: str) -> uuid.UUID:
    """Parse a path run id; anything that is not a UUID is simply not found (404)."""
    try:
        return uuid.UUID(run_id)
    except ValueError:
        raise RunNotFound(f"run {run_id[:100]!r} not found") from None


async def _load(db: DB, principal: Principal, run_id: str, tenant: str | None) -> Any:
    async with db.read() as conn:
        return await visible_run(conn, principal, parse_run_id(run_id), tenant)


@router.post(
    "",
    operation_id="submit_run",
    status_code=201,
    response_model=schemas.Run,
    responses={
        201: {"links": RUN_LINKS},
        200: {
            "model": schemas.Run,
            "description": "Identical idempotent retry: the same run",
            "links": RUN_LINKS,
        },
        409: {
            "model": schemas.Problem,
            "description": "Idempotency key reused differently, or concurrency key busy",
        },
        413: {"model": schemas.Problem, "description": "Payload over the limit"},
        **_PROBLEMS,
    },
)
async def submit_run(
    body: schemas.SubmitRunRequest,
    response: Response,
    request: Request,
    principal: RunsWrite,
    submitter: SubmitterDep,
    idempotency_key_header: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            json_schema_extra=schemas.NO_CONTROL_CHARS,
        ),
    ] = None,
) -> schemas.Run:
    """Submit a run of a registered workflow.

    Returns 201 with a ``Location`` header for a new run, or 200 with the same run for a
    retry carrying the same idempotency key (body field or ``Idempotency-Key`` header) and
    an identical request. A run beyond its ``concurrency_key``'s ``key_limit`` of a
    workflow declaring ``on_limit="queue"`` is created (201) ``queued`` without a
    ``concurrency_slot``, its ``blocked_reason`` saying it waits for a slot; it starts in
    submission order as the key's active runs finish. Errors: 404 unknown workflow or
    version; 422 input invalid for the registered schema (with field paths); 409 key
    reused for a different request, or, with ``on_limit="reject"``, the
    ``concurrency_key``'s ``key_limit`` runs are active (``code``
    ``concurrency_key_busy``, ``active_run_id`` names the oldest, ``key_limit``); 413
    input over ``TREADLE_MAX_PAYLOAD_BYTES``.
    """
    key = body.idempotency_key
    if idempotency_key_header is not None:
        try:
            header_key = schemas.SubmitRunRequest.model_validate(
                {"workflow": body.workflow, "idempotency_key": idempotency_key_header}
            ).idempotency_key
        except ValidationError:
            raise InvalidInput(
                "Idempotency-Key header must be 1..255 printable characters",
                errors=[{"path": "header.Idempotency-Key", "message": "invalid"}],
            ) from None
        if key is not None and key != header_key:
            raise BadRequest("Idempotency-Key header and body idempotency_key differ")
        key = header_key
    req = SubmitRequest(
        workflow=body.workflow,
        input=body.input,
        version=None if body.version is None else str(body.version),
        idempotency_key=key,
        concurrency_key=body.concurrency_key,
        delay=body.delay,
        priority=body.priority,
    )
    row, created = await submitter.submit(
        req,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
    )
    if created:
        metrics.RUNS_SUBMITTED.labels(body.workflow).inc()
        wake_workers(request)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/runs/{row['run_id']}"
    return run_view(row)


@router.get("", operation_id="list_runs", response_model=schemas.RunPage, responses=_PROBLEMS)
async def list_runs(
    principal: RunsRead,
    db: DB,
    workflow: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")] = None,
    status: RunStatus | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    tenant: TenantQuery = None,
) -> schemas.RunPage:
    """List the tenant's runs, newest first.

    Pagination is keyset-based on the time-ordered run id: pages stay stable while runs
    are inserted. ``page_token`` is opaque and only valid with the same filters. Runs of
    ``owner``-policy workflows appear only to their submitter (and to ``admin``).
    """
    tenant_id = read_tenant(principal, tenant)
    for value in (created_after, created_before):
        if value is not None and value.tzinfo is None:
            raise BadRequest("created_after/created_before need a timezone (e.g. Z)")
    try:
        created_after = created_after.astimezone(UTC) if created_after else None
        created_before = created_before.astimezone(UTC) if created_before else None
    except OverflowError:
        raise BadRequest("created_after/created_before is out of range") from None
    filters = {
        "workflow": workflow,
        "status": status.value if status else None,
        "created_after": created_after.isoformat() if created_after else None,
        "created_before": created_before.isoformat() if created_before else None,
    }
    before = None
    if page_token:
        position = decode_token(page_token, tenant_id, "runs", filters)
        try:
            before = uuid.UUID(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    async with db.read() as conn:
        rows = await runs_q.list_runs(
            conn,
            tenant_id,
            workflow=workflow,
            status=filters["status"],
            created_after=created_after,
            created_before=created_before,
            before_run_id=before,
            limit=limit + 1,
            owner=principal.owner_filter,
        )
    items = [run_view(r) for r in rows[:limit]]
    token = None
    if len(rows) > limit:
        token = encode_token(tenant_id, "runs", filters, str(rows[limit - 1]["run_id"]))
    return schemas.RunPage(items=items, next_page_token=token)


@router.get("/{run_id}", operation_id="get_run", response_model=schemas.Run, responses=_PROBLEMS)
async def get_run(
    run_id: str, principal: RunsRead, db: DB, settings: SettingsDep, tenant: TenantQuery = None
) -> schemas.Run:
    """Snapshot of one run: status, reason, waits, step counts, lease and timestamps.

    ``blocked_reason`` says why a queued run cannot start (e.g. no live worker registered
    its pinned workflow version). For a state machine, ``state`` is its typed current
    state ``{"name", "fields"}``: the last committed transition's (the initial state
    before the first).
    """
    async with db.read() as conn:
        row = await visible_run(conn, principal, parse_run_id(run_id), tenant)
        counts = await steps_q.count_by_status(conn, row["tenant_id"], row["run_id"])
        blocked = await _blocked(conn, row, settings)
        state = await states_q.current_state(conn, row)
    return run_view(row, counts, blocked, state)


async def _blocked(conn: AsyncConnection, row: RowMapping, settings: Settings) -> str | None:
    # Open runs a worker must pick up at some time (due, retry, timer, deadline, lease):
    # a decided approval of a version nobody runs any more is blocked, not "waiting".
    if RunStatus(row["status"]).is_terminal or row["available_at"] is None:
        return None
    return await defs_q.blocked_reason(
        conn,
        workflow=row["workflow"],
        version=row["version"],
        within_seconds=2 * settings.lease_ttl_seconds,
    )


@router.get(
    "/{run_id}/result",
    operation_id="get_run_result",
    response_model=schemas.RunResult,
    responses={202: {"model": schemas.RunResult, "description": "Not finished yet"}, **_PROBLEMS},
)
async def get_run_result(
    run_id: str,
    response: Response,
    principal: RunsRead,
    db: DB,
    wait: Annotated[float, Query(ge=0, le=300, description="Seconds to long-poll")] = 0,
    tenant: TenantQuery = None,
) -> schemas.RunResult:
    """The run's result: 200 once terminal, 202 if still running after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    pause = 0.02
    while True:
        row = await _load(db, principal, run_id, tenant)
        done = RunStatus(row["status"]).is_terminal
        if done or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 1.5, 0.5)
    view = run_view(row)
    response.status_code = 200 if done else 202
    return schemas.RunResult(
        run_id=view.run_id,
        done=done,
        status=view.status,
        reason=view.reason,
        output=view.output,
        error=view.error,
    )


@router.get(
    "/{run_id}/steps",
    operation_id="list_run_steps",
    response_model=schemas.StepPage,
    responses=_PROBLEMS,
)
async def list_run_steps(
    run_id: str,
    principal: RunsRead,
    db: DB,
    status: Annotated[StepStatus | None, Query(description="Only steps in this status.")] = None,
    reason: Annotated[
        RunReason | None,
        Query(description="Only steps that ended this way (succeeded, failure_…, …)."),
    ] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 100,
    tenant: TenantQuery = None,
) -> schemas.StepPage:
    """The run's steps in call order, with attempts, timings, errors and reasons.

    A typed DAG's run lists one step per node (named after the node). ``status`` and
    ``reason`` filter; a step's ``reason`` is how it ended (``succeeded``, the
    ``failure_…`` reason of a failed or timed-out step, ``rejected_by_approver`` for a
    rejected approval, ``canceled_by_request`` or, when the run failed while the step was
    unfinished, ``canceled_by_failure``), null while it has not. Pagination is
    keyset-based on call order, so pages are stable while the run adds steps;
    ``page_token`` is opaque and only valid with the same filters.
    """
    rid = parse_run_id(run_id)
    scope = f"steps:{rid}"
    filters = {
        "status": status.value if status else None,
        "reason": reason.value if reason else None,
    }
    # seq is an INTEGER column: a larger position would fail in the driver.
    after = int_position(page_token, principal.tenant_id, scope, filters, maximum=INT32_MAX)
    async with db.read() as conn:
        run = await visible_run(conn, principal, rid, tenant)
        rows = await steps_q.list_steps(
            conn,
            run["tenant_id"],
            rid,
            after_seq=after,
            limit=limit + 1,
            status=status,
            reason=reason,
        )
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, scope, filters, int(rows[limit - 1]["seq"]))
    redacted = is_redacted(run)
    withheld = withheld_outputs(run)
    return schemas.StepPage(
        items=[step_view(r, redacted, withheld) for r in rows[:limit]], next_page_token=token
    )


@router.get(
    "/{run_id}/events",
    operation_id="list_run_events",
    response_model=schemas.EventPage,
    responses=_PROBLEMS,
)
async def list_run_events(
    run_id: str,
    principal: RunsRead,
    db: DB,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 200,
    tenant: TenantQuery = None,
) -> schemas.EventPage:
    """The run's append-only timeline, oldest first."""
    rid = parse_run_id(run_id)
    scope = f"events:{rid}"
    after = int_position(page_token, principal.tenant_id, scope)
    async with db.read() as conn:
        run = await visible_run(conn, principal, rid, tenant)
        rows = await events_q.list_events(
            conn, run["tenant_id"], rid, after_id=after, limit=limit + 1
        )
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, scope, {}, int(rows[limit - 1]["event_id"]))
    redacted = is_redacted(run)
    return schemas.EventPage(
        items=[event_view(r, redacted) for r in rows[:limit]], next_page_token=token
    )


async def _report(
    db: DB,
    principal: Principal,
    settings: Settings,
    run_id: str,
    events_limit: int,
    tenant: str | None,
) -> schemas.RunReport:
    rid = parse_run_id(run_id)
    async with db.read() as conn:
        row = await visible_run(conn, principal, rid, tenant)
        # Every section reads the run's own tenant: on an admin's ``?tenant=`` read that
        # is not the caller's, and the caller's would find no rows.
        owner_tenant: str = row["tenant_id"]
        counts = await steps_q.count_by_status(conn, owner_tenant, rid)
        blocked = await _blocked(conn, row, settings)
        state = await states_q.current_state(conn, row)
        step_rows = await steps_q.list_steps(conn, owner_tenant, rid, after_seq=None, limit=10_000)
        event_rows = await events_q.list_events(
            conn, owner_tenant, rid, after_id=None, limit=events_limit + 1
        )
        dl_rows = await dl_q.list_for_run(conn, owner_tenant, rid)
        now = await fetch_now(conn, db.dialect)
    redacted = is_redacted(row)
    withheld = withheld_outputs(row)
    return schemas.RunReport(
        generated_at=now,
        run=run_view(row, counts, blocked, state),
        steps=[step_view(s, redacted, withheld) for s in step_rows],
        events=[event_view(e, redacted) for e in event_rows[:events_limit]],
        events_truncated=len(event_rows) > events_limit,
        dead_letters=[dead_letter_view(d) for d in dl_rows],
    )


EventsLimit = Annotated[
    int, Query(ge=1, le=10_000, description="Timeline events included (the first N).")
]


@router.get(
    "/{run_id}/report",
    operation_id="get_run_report",
    response_model=schemas.RunReport,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "JSON; the text form with Accept: text/plain",
        },
        **_PROBLEMS,
    },
)
async def get_run_report(
    run_id: str,
    request: Request,
    principal: RunsRead,
    db: DB,
    settings: SettingsDep,
    # Not in the spec: an SDK generator gives one operation one answer type, so typed
    # clients get the text from get_run_report_text; ?format=text is curl's shortcut.
    format: Annotated[Literal["json", "text"] | None, Query(include_in_schema=False)] = None,
    events_limit: EventsLimit = 1000,
    tenant: TenantQuery = None,
) -> Any:
    """The operator's report: run, steps, timeline and dead letters, as JSON.

    ``Accept: text/plain`` (or ``?format=text``, for ``curl``) gives the four readable
    text sections of ``GET /runs/{run_id}/report.txt`` instead. ``events_limit`` bounds
    the timeline to its first N events (``events_truncated`` says when more exist; page
    through ``/events`` for the rest).
    """
    report = await _report(db, principal, settings, run_id, events_limit, tenant)
    wants_text = format == "text" or (
        format is None and "text/plain" in request.headers.get("accept", "")
    )
    if wants_text:
        return SafeTextResponse(render_report_text(report))
    return report


@router.get(
    "/{run_id}/report.txt",
    operation_id="get_run_report_text",
    response_class=SafeTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Four text sections: run, steps, timeline, dead letters",
        },
        **_PROBLEMS,
    },
)
async def get_run_report_text(
    run_id: str,
    principal: RunsRead,
    db: DB,
    settings: SettingsDep,
    events_limit: EventsLimit = 1000,
    tenant: TenantQuery = None,
) -> SafeTextResponse:
    """The operator's report as readable text (what ``treadle runs report`` prints).

    The same content as ``GET /runs/{run_id}/report`` in four sections: the run, its
    steps, its timeline (first ``events_limit`` events) and its dead letters.
    """
    report = await _report(db, principal, settings, run_id, events_limit, tenant)
    return SafeTextResponse(render_report_text(report))


@router.post(
    "/{run_id}/cancel",
    operation_id="cancel_run",
    response_model=schemas.Run,
    responses={409: {"model": schemas.Problem, "description": "Run already finished"}, **_PROBLEMS},
)
async def cancel_run(
    run_id: str,
    principal: RunsCancel,
    db: DB,
    body: Annotated[schemas.CancelRunRequest | None, Body()] = None,
) -> schemas.Run:
    """Cancel a run. Its fence advances, so its worker can never commit again.

    Idempotent for an already-cancelled run; 409 if the run finished otherwise.
    """
    row = await control.cancel(
        db,
        tenant_id=principal.tenant_id,
        run_id=parse_run_id(run_id),
        actor=principal.subject,
        reason=body.reason if body else None,
        owner=principal.owner_filter,
    )
    return run_view(row)
