"""``/runs``: submit, list, inspect, wait for, report on and cancel runs."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response
from pydantic import BaseModel, ValidationError
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api import event_stream, problems, schemas
from app.api.deps import (
    DB,
    Cancels,
    RunsRead,
    RunsWrite,
    SettingsDep,
    SubmitterDep,
    TenantQuery,
    lagging_read_or_primary,
    read_tenant,
    visible_run,
    wake_workers,
    watch_credential,
)
from app.api.event_stream import (
    EventStreamResponse,
    parse_last_event_id,
    streams_of,
)
from app.api.links import RUN_LINKS
from app.api.pagination import INT32_MAX, decode_token, encode_token, int_position
from app.api.problems import PROBLEM_RESPONSES as _PROBLEMS
from app.api.query_params import repeated
from app.api.responses import AsciiJSONResponse, SafeTextResponse
from app.api.views import (
    dead_letter_view,
    event_view,
    is_redacted,
    log_view,
    render_report_text,
    run_json,
    run_view,
    step_view,
    withheld_outputs,
)
from app.auth.principal import Principal
from app.core import metrics, tracing
from app.core.errors import BadRequest, InvalidInput, InvalidRequest, RunNotFound, TreadleError
from app.core.labels import MAX_LABELS, LabelFilter, parse_label_filter, validate_labels
from app.core.settings import Settings
from app.core.status import RunReason, RunStatus, StepStatus
from app.core.text import text_problem
from app.db.database import fetch_now
from app.db.queries import dead_letters as dl_q
from app.db.queries import definitions as defs_q
from app.db.queries import events as events_q
from app.db.queries import run_filters as filters_q
from app.db.queries import run_logs as run_logs_q
from app.db.queries import states as states_q
from app.db.queries import steps as steps_q
from app.db.queries.run_filters import RunListFilters
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
            # Starlette decodes header bytes as Latin-1; a client sends text as UTF-8
            # (curl, httpx, browsers), so "café" would be stored as "cafÃ©" and never
            # match the same key sent in the body. Bytes that are not UTF-8 are refused.
            header_text = idempotency_key_header.encode("latin-1").decode("utf-8")
            header_key = schemas.SubmitRunRequest.model_validate(
                {"workflow": body.workflow, "idempotency_key": header_text}
            ).idempotency_key
        except (UnicodeError, ValidationError):
            raise InvalidInput(
                "Idempotency-Key header must be 1..255 printable characters of UTF-8",
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
        labels=validate_labels(body.labels),
    )
    row, created = await submitter.submit(
        req,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        trace=tracing.submit_context(request.headers),
    )
    tracing.annotate(run_id=row["run_id"], workflow=row["workflow"])
    if created:
        metrics.RUNS_SUBMITTED.labels(body.workflow).inc()
        wake_workers(request)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/runs/{row['run_id']}"
    return run_view(row)


@router.post(
    ":batch",
    operation_id="submit_runs_batch",
    status_code=207,
    response_model=schemas.SubmitBatchResponse,
    responses={
        207: {"description": "One result per item, in request order (per-item status)"},
        413: {"model": schemas.Problem, "description": "Request body over the limit"},
        **_PROBLEMS,
    },
)
async def submit_runs_batch(
    body: schemas.SubmitBatchRequest,
    request: Request,
    principal: RunsWrite,
    submitter: SubmitterDep,
    settings: SettingsDep,
) -> Response:
    """Submit up to ``TREADLE_MAX_BATCH_RUNS`` (default 1,000) runs in one transaction.

    Always 207 Multi-Status once the request itself is acceptable: ``results`` holds one
    entry per item in request order, each with the status ``POST /runs`` would have
    answered for that item alone (201 new, 200 identical idempotent retry, 404 unknown
    workflow, 409 idempotency key reused or concurrency key busy, 413 input too large,
    422 invalid) and the run or the problem. Failed items do not stop the others; the
    accepted ones commit together (docs/api.md, "POST /runs:batch"). Whole-request
    errors: 400 malformed JSON, 401/403 auth and scope (``runs:write``), 413 body over the
    request ceiling, 422 an empty list, more than the limit, or a body that is not
    ``{"runs": [...]}``.
    """
    limit = settings.max_batch_runs
    if len(body.runs) > limit:
        raise InvalidInput(
            f"at most {limit} runs per batch, got {len(body.runs)}",
            errors=[{"path": "body.runs", "message": f"at most {limit} items"}],
            limit=limit,
        )
    items = [_batch_item(index, raw) for index, raw in enumerate(body.runs)]
    results = await submitter.submit_batch(
        items,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        trace=tracing.submit_context(request.headers),
    )
    # The 207 body is built as JSON members directly, one run_json per run: one pydantic
    # Run (and its model_dump) per item was a third of a 1,000-run request's time
    # (docs/benchmarks.md). The members, their order and their forms are exactly
    # SubmitBatchResponse's dump (by alias, nulls kept; tests/integration/
    # test_submit_batch.py checks the bytes), which the spec still documents.
    out: list[dict[str, Any]] = []
    created = failed = 0
    # Counted per workflow, then added once each: a labelled child lookup per run was a
    # tenth of a 1,000-run batch's time (benchmarks/submit_batch.py).
    per_workflow: collections.Counter[str] = collections.Counter()
    for index, result in enumerate(results):
        if result.row is not None:
            if result.created:
                created += 1
                per_workflow[str(result.row["workflow"])] += 1
            out.append(
                {
                    "index": index,
                    "status": 201 if result.created else 200,
                    "run": run_json(result.row),
                    "problem": None,
                }
            )
            continue
        assert result.error is not None
        error = result.error
        status = problems.status_for(error)
        failed += 1
        problem = problems.problem_body(
            status, error.code, error.detail, instance=request.url.path, **error.data
        )
        out.append(
            {
                "index": index,
                "status": status,
                "run": None,
                "problem": schemas.Problem.model_validate(problem).model_dump(
                    mode="json", by_alias=True
                ),
            }
        )
    for workflow, n in per_workflow.items():
        metrics.RUNS_SUBMITTED.labels(workflow).inc(n)
    if created:
        wake_workers(request)
    # Sent as built, encoded by the app's AsciiJSONResponse: FastAPI does not validate it
    # against response_model again.
    return AsciiJSONResponse(
        {"results": out, "created": created, "failed": failed}, status_code=207
    )


def _batch_item(index: int, raw: Any) -> SubmitRequest | TreadleError:
    # One batch item as POST /runs would read its body; a bad item is its own 422.
    try:
        body = schemas.SubmitRunRequest.model_validate(raw)
    except ValidationError as exc:
        return InvalidRequest(
            "run does not match the API schema (SubmitRunRequest)",
            errors=problems.validation_items(
                [{**e, "loc": ("body", "runs", index, *e["loc"])} for e in exc.errors()]
            ),
        )
    try:
        labels = validate_labels(body.labels)
    except TreadleError as exc:
        return exc
    return SubmitRequest(
        workflow=body.workflow,
        input=body.input,
        version=None if body.version is None else str(body.version),
        idempotency_key=body.idempotency_key,
        concurrency_key=body.concurrency_key,
        delay=body.delay,
        priority=body.priority,
        labels=labels,
    )


WorkflowFilter = Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")]
IdempotencyKeyFilter = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        json_schema_extra=schemas.NO_CONTROL_CHARS,
        description="Only the run submitted with this idempotency key (at most one).",
    ),
]


ReasonFilter = Annotated[
    RunReason | None, Query(description="Only runs that ended this way (e.g. `succeeded`).")
]
VersionFilter = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        json_schema_extra=schemas.NO_CONTROL_CHARS,
        description="Only runs of this definition version.",
    ),
]
WAIT_KINDS = ("retry", "timer", "signal", "approval", "event", "child", "pause")
"""The kinds a released run's ``waiting_on`` names (``PendingWait.kind`` in app/engine)."""

WaitingOnFilter = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=240,
        pattern=rf"^({'|'.join(WAIT_KINDS)})(:[^\x00-\x1f\x7f]{{1,200}})?$",
        description="Only runs waiting on this: `<kind>` or `<kind>:<name>` (e.g. "
        "`signal:payment`, `approval:manager`, `timer`), as in the run's `waiting_on`.",
    ),
]
# Query parameters the list and counts routes take besides ``label.<key>``: anything
# else is refused, so a misspelt filter never silently lists every run.
_LIST_PARAMS = frozenset(
    {
        "workflow",
        "status",
        "reason",
        "version",
        "created_after",
        "created_before",
        "finished_after",
        "finished_before",
        "idempotency_key",
        "waiting_on",
        "page_token",
        "limit",
        "tenant",
    }
)


def _utc(name: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise BadRequest(f"{name} needs a timezone (e.g. Z)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise BadRequest(f"{name} is out of range") from None


def _label_filters(request: Request, *, counts: bool) -> tuple[LabelFilter, ...]:
    """The request's ``label.<key>`` filters; refuses unknown or repeated parameters."""
    found: list[LabelFilter] = []
    allowed = _LIST_PARAMS - ({"status", "page_token", "limit"} if counts else set())
    for name in request.query_params:
        if name.startswith("label."):
            continue
        if name not in allowed:
            raise InvalidInput(
                f"unknown filter {name[:80]!r}: use one of {', '.join(sorted(allowed))} "
                "or label.<key>",
                errors=[{"path": f"query.{name[:80]}", "message": "unknown filter"}],
            )
    # A declared parameter given twice was refused before the route ran
    # (app.api.query_params); ``label.<key>`` is read here, so its repeats are refused here.
    twice = [
        n
        for n in dict.fromkeys(request.query_params.keys())
        if n.startswith("label.") and len(request.query_params.getlist(n)) > 1
    ]
    if twice:
        raise repeated(twice)
    for name, raw in request.query_params.multi_items():
        if not name.startswith("label."):
            continue
        found.append(parse_label_filter(name, raw))
    if len(found) > MAX_LABELS:
        raise InvalidInput(
            f"at most {MAX_LABELS} label filters",
            errors=[{"path": "query", "message": "too many label filters"}],
        )
    return tuple(found)


class RunFilterQuery(BaseModel):
    """The filters ``GET /runs`` and ``GET /runs/counts`` share, declared once.

    Used as a query model (``RunFilters``): FastAPI flattens its fields into the query
    parameters where it is declared, so both operations document the same names, types
    and descriptions. ``status`` (list only), paging and ``tenant`` stay on the routes.
    Unknown parameters are refused by ``_label_filters`` (``label.<key>`` is the only
    open-ended name), so the model ignores extras rather than forbidding them.
    """

    workflow: WorkflowFilter = None
    reason: ReasonFilter = None
    version: VersionFilter = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    idempotency_key: IdempotencyKeyFilter = None
    waiting_on: WaitingOnFilter = None


RunFilters = Annotated[RunFilterQuery, Query()]


def _filters(
    request: Request,
    q: RunFilterQuery,
    *,
    counts: bool,
    status: RunStatus | None = None,
) -> tuple[RunListFilters, dict[str, Any]]:
    """The list filters and their page-token form (new filters only when given)."""
    _check_key(q.idempotency_key)
    _check_key(q.version, "version")
    labels = _label_filters(request, counts=counts)
    kind, name = None, None
    if q.waiting_on is not None:
        kind, _, rest = q.waiting_on.partition(":")
        name = rest or None
    f = RunListFilters(
        workflow=q.workflow,
        status=status.value if status else None,
        reason=q.reason.value if q.reason else None,
        version=q.version,
        created_after=_utc("created_after", q.created_after),
        created_before=_utc("created_before", q.created_before),
        finished_after=_utc("finished_after", q.finished_after),
        finished_before=_utc("finished_before", q.finished_before),
        idempotency_key=q.idempotency_key,
        waiting_kind=kind,
        waiting_name=name,
        labels=labels,
    )
    token: dict[str, Any] = {
        "workflow": q.workflow,
        "status": f.status,
        "created_after": f.created_after.isoformat() if f.created_after else None,
        "created_before": f.created_before.isoformat() if f.created_before else None,
    }
    # Only when given: tokens issued before these filters existed stay valid.
    extra: dict[str, Any] = {
        "idempotency_key": q.idempotency_key,
        "reason": f.reason,
        "version": q.version,
        "finished_after": f.finished_after.isoformat() if f.finished_after else None,
        "finished_before": f.finished_before.isoformat() if f.finished_before else None,
        "waiting_on": q.waiting_on,
        "labels": sorted([lf.key, lf.value, lf.prefix] for lf in labels) or None,
    }
    token.update({k: v for k, v in extra.items() if v is not None})
    return f, token


def _check_key(value: str | None, name: str = "idempotency_key") -> None:
    # The pattern in the spec documents it; this gives the clear message (and PostgreSQL
    # could not even compare a NUL). The rule is the one every text field follows.
    problem = None if value is None else text_problem(value)
    if problem is not None:
        raise InvalidInput(
            f"{name}: {problem}", errors=[{"path": f"query.{name}", "message": problem}]
        )


@router.get("", operation_id="list_runs", response_model=schemas.RunPage, responses=_PROBLEMS)
async def list_runs(
    request: Request,
    principal: RunsRead,
    db: DB,
    q: RunFilters,
    status: RunStatus | None = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    tenant: TenantQuery = None,
) -> schemas.RunPage:
    """List the tenant's runs, newest first.

    Pagination is keyset-based on the time-ordered run id: pages stay stable while runs
    are inserted. ``page_token`` is opaque and only valid with the same filters. Runs of
    ``owner``-policy workflows appear only to their submitter (and to ``admin``).
    ``idempotency_key`` finds the run submitted with that key, if any. Time ranges are
    ``[after, before)``; ``finished_*`` match only finished runs. Every filter is served
    by an index (docs/adr/0020-run-labels.md).

    Label filters: ``label.<key>=<value>`` (equality) or ``label.<key>=<prefix>*``
    (prefix), one per key, at most 16, all ANDed. Any other query parameter is a 422.
    """
    tenant_id = read_tenant(principal, tenant)
    filters, token_filters = _filters(request, q, counts=False, status=status)
    before = None
    if page_token:
        position = decode_token(page_token, tenant_id, "runs", token_filters)
        try:
            before = uuid.UUID(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    # May lag (docs/adr/0033-lag-tolerant-reads-on-a-replica.md): a run submitted a
    # moment ago can be missing from a page served by the replica.
    async with db.lagging_read() as conn:
        rows = await filters_q.list_runs(
            conn,
            tenant_id,
            filters,
            before_run_id=before,
            limit=limit + 1,
            owner=principal.owner_filter,
        )
    items = [run_view(r) for r in rows[:limit]]
    token = None
    if len(rows) > limit:
        token = encode_token(tenant_id, "runs", token_filters, str(rows[limit - 1]["run_id"]))
    return schemas.RunPage(items=items, next_page_token=token)


@router.get(
    "/counts", operation_id="count_runs", response_model=schemas.RunCounts, responses=_PROBLEMS
)
async def count_runs(
    request: Request,
    principal: RunsRead,
    db: DB,
    settings: SettingsDep,
    q: RunFilters,
    tenant: TenantQuery = None,
) -> schemas.RunCounts:
    """How many of the runs ``GET /runs`` lists with the same filters are in each status.

    Every status appears (0 when no run is in it), so a dashboard can show them all;
    ``total`` is their sum. Scoped exactly like the list (tenant, owner policy), with the
    same filters but ``status``.

    Each status is counted up to ``count_limit`` (``TREADLE_RUN_COUNT_LIMIT``, 1,000 by
    default): a status with more runs reports ``count_limit`` and is named in
    ``at_least``, and ``total_at_least`` is then true (``total`` is a lower bound). That
    keeps a count over any share of a tenant a bounded index read
    (docs/adr/0020-run-labels.md).

    Label filters: ``label.<key>=<value>`` (equality) or ``label.<key>=<prefix>*``
    (prefix), one per key, at most 16, all ANDed. Any other query parameter is a 422.
    """
    tenant_id = read_tenant(principal, tenant)
    filters, _ = _filters(request, q, counts=True)
    async with db.lagging_read() as conn:
        found = await filters_q.count_listed_by_status(
            conn, tenant_id, filters, limit=settings.run_count_limit, owner=principal.owner_filter
        )
    return schemas.RunCounts(
        counts=found.counts,
        total=sum(found.counts.values()),
        total_at_least=bool(found.at_least),
        at_least=found.at_least,
        count_limit=found.limit,
    )


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
    request: Request,
    response: Response,
    principal: RunsRead,
    db: DB,
    settings: SettingsDep,
    wait: Annotated[
        float, Query(ge=0, le=300, allow_inf_nan=False, description="Seconds to long-poll")
    ] = 0,
    tenant: TenantQuery = None,
) -> schemas.RunResult:
    """The run's result: 200 once terminal, 202 if still running after ``wait`` seconds.

    While it waits, the bearer token is re-checked as the event stream's is: at its
    expiry and every ``TREADLE_AUTH_RECHECK_SECONDS``; once a new request with it would
    be refused, so is this one (401, or 403 ``tenant_suspended``), whatever is left of
    ``wait`` (docs/security.md, Long-lived responses).
    """
    deadline = time.monotonic() + wait
    pause = 0.02
    watch = watch_credential(request, settings)
    while True:
        await watch.ensure_accepted()
        row = await _load(db, principal, run_id, tenant)
        done = RunStatus(row["status"]).is_terminal
        if done or time.monotonic() >= deadline:
            break
        # Wake for the next poll or the credential's next check, whichever comes first.
        await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0), watch.seconds_left()))
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

    async def read(conn: AsyncConnection) -> tuple[RowMapping, Sequence[RowMapping]]:
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
        return run, rows

    run, rows = await lagging_read_or_primary(db, read)
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
    responses={
        200: {
            "description": "A page of events; with `follow=true` a `text/event-stream` "
            "(docs/api.md, Live events)",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        429: {
            "model": schemas.Problem,
            "description": "follow=true: the tenant holds "
            "TREADLE_EVENT_STREAM_MAX_PER_TENANT streams on this server; retry after "
            "Retry-After",
        },
        **_PROBLEMS,
    },
)
async def list_run_events(
    run_id: str,
    request: Request,
    principal: RunsRead,
    db: DB,
    settings: SettingsDep,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 200,
    tenant: TenantQuery = None,
    follow: Annotated[
        bool, Query(description="Stream the events live as Server-Sent Events.")
    ] = False,
    after: Annotated[
        int | None,
        Query(ge=0, le=2**63 - 1, description="follow=true: only events after this id."),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=64,
            description="follow=true: resume after this event id (wins over `after`).",
        ),
    ] = None,
) -> Any:
    """The run's append-only timeline, oldest first.

    With ``follow=true`` the answer is a ``text/event-stream`` instead: every event after
    ``Last-Event-ID`` (or ``after``; default: from the start) as one SSE message (``id``
    the event id, ``event`` its kind, ``data`` the event's JSON as in a page), live as the
    run goes on, heartbeat comments while idle, and a last ``event: end`` message once
    the run is terminal and every event was sent (data ``cause`` ``run_ended``). The
    stream re-checks its bearer token while open (at its expiry, and every
    ``TREADLE_AUTH_RECHECK_SECONDS``) and ends with an ``end`` message whose ``cause`` is
    ``credential_expired``, ``credential_revoked`` or ``tenant_suspended`` once a new
    request with the token would be refused. ``page_token`` and ``limit`` do not
    apply to a stream; ``after`` and ``Last-Event-ID`` apply only to one (400 otherwise).
    A tenant may hold ``TREADLE_EVENT_STREAM_MAX_PER_TENANT`` streams per API server
    (429 beyond). See docs/api.md (Live events).
    """
    rid = parse_run_id(run_id)
    if follow:
        return await _follow_events(
            request, principal, db, settings, rid, tenant, after, last_event_id
        )
    if after is not None or last_event_id is not None:
        raise BadRequest("after and Last-Event-ID need follow=true (pages use page_token)")
    scope = f"events:{rid}"
    after_id = int_position(page_token, principal.tenant_id, scope)

    async def read(conn: AsyncConnection) -> tuple[RowMapping, Sequence[RowMapping]]:
        run = await visible_run(conn, principal, rid, tenant)
        rows = await events_q.list_events(
            conn, run["tenant_id"], rid, after_id=after_id, limit=limit + 1
        )
        return run, rows

    run, rows = await lagging_read_or_primary(db, read)
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, scope, {}, int(rows[limit - 1]["event_id"]))
    redacted = is_redacted(run)
    return schemas.EventPage(
        items=[event_view(r, redacted) for r in rows[:limit]], next_page_token=token
    )


async def _follow_events(
    request: Request,
    principal: Principal,
    db: DB,
    settings: Settings,
    rid: uuid.UUID,
    tenant: str | None,
    after: int | None,
    last_event_id: str | None,
) -> EventStreamResponse:
    cursor = parse_last_event_id(last_event_id) if last_event_id is not None else after
    async with db.read() as conn:
        run = await visible_run(conn, principal, rid, tenant)
    watch = watch_credential(request, settings)
    streams = streams_of(request.app, settings)
    streams.acquire(principal.tenant_id)
    frames = event_stream.follow(
        db, streams, settings, watch, tenant_id=run["tenant_id"], run_id=rid, after=cursor or 0
    )
    return EventStreamResponse(frames, streams, principal.tenant_id)


async def _report(
    db: DB,
    principal: Principal,
    settings: Settings,
    run_id: str,
    events_limit: int,
    tenant: str | None,
    logs_limit: int = 50,
) -> schemas.RunReport:
    rid = parse_run_id(run_id)

    async def read(conn: AsyncConnection) -> schemas.RunReport:
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
        log_rows, logs_total = await run_logs_q.last_lines(
            conn, owner_tenant, rid, limit=logs_limit
        )
        redacted = is_redacted(row)
        withheld = withheld_outputs(row)
        return schemas.RunReport(
            # The clock of the server that answered: the snapshot is as of then.
            generated_at=await fetch_now(conn, db.dialect),
            run=run_view(row, counts, blocked, state),
            steps=[step_view(s, redacted, withheld) for s in step_rows],
            events=[event_view(e, redacted) for e in event_rows[:events_limit]],
            events_truncated=len(event_rows) > events_limit,
            dead_letters=[dead_letter_view(d) for d in dl_rows],
            logs=[log_view(x, redacted) for x in log_rows],
            logs_total=logs_total,
        )

    # One snapshot, perhaps seconds old, from the replica when one is set (never a false
    # 404: a run the replica does not have yet is read on the primary).
    return await lagging_read_or_primary(db, read)


EventsLimit = Annotated[
    int, Query(ge=1, le=10_000, description="Timeline events included (the first N).")
]
LogsLimit = Annotated[
    int, Query(ge=0, le=1_000, description="ctx.logger lines included (the last N).")
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
    logs_limit: LogsLimit = 50,
    tenant: TenantQuery = None,
) -> Any:
    """The operator's report: run, steps, timeline, log lines and dead letters, as JSON.

    ``Accept: text/plain`` (or ``?format=text``, for ``curl``) gives the five readable
    text sections of ``GET /runs/{run_id}/report.txt`` instead. ``events_limit`` bounds
    the timeline to its first N events (``events_truncated`` says when more exist; page
    through ``/events`` for the rest); ``logs_limit`` keeps the run's last N
    ``ctx.logger`` lines (``logs_total`` counts them all; page through ``/logs``).
    """
    report = await _report(db, principal, settings, run_id, events_limit, tenant, logs_limit)
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
            "description": "Five text sections: run, steps, timeline, logs, dead letters",
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
    logs_limit: LogsLimit = 50,
    tenant: TenantQuery = None,
) -> SafeTextResponse:
    """The operator's report as readable text (what ``treadle runs report`` prints).

    The same content as ``GET /runs/{run_id}/report`` in five sections: the run, its
    steps, its timeline (first ``events_limit`` events), its last ``logs_limit``
    ``ctx.logger`` lines and its dead letters.
    """
    report = await _report(db, principal, settings, run_id, events_limit, tenant, logs_limit)
    return SafeTextResponse(render_report_text(report))


@router.post(
    "/{run_id}/cancel",
    operation_id="cancel_run",
    response_model=schemas.Run,
    responses={409: {"model": schemas.Problem, "description": "Run already finished"}, **_PROBLEMS},
)
async def cancel_run(
    run_id: str,
    principal: Cancels,
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
