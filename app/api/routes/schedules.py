"""``/schedules``: cron and one-off schedules that start runs; pause, resume, trigger now."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api import schedule_schemas as ss
from app.api import schemas
from app.api.deps import (
    DB,
    RunsRead,
    RunsWrite,
    SubmitterDep,
    lagging_read_or_primary,
    wake_workers,
)
from app.api.links import SCHEDULE_LINKS
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES as _PROBLEMS
from app.core import json
from app.core.errors import BadRequest, ScheduleNotFound
from app.db.queries import schedules as sched_q
from app.engine import authority
from app.engine import schedules as engine

router = APIRouter(prefix="/schedules", tags=["schedules"])

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": schemas.Problem, "description": "Name taken, or invalid state"}
}


def parse_schedule_id(schedule_id: str) -> uuid.UUID:
    """Parse a path schedule id; anything that is not a UUID is simply not found (404)."""
    try:
        return uuid.UUID(schedule_id)
    except ValueError:
        raise ScheduleNotFound(f"schedule {schedule_id[:100]!r} not found") from None


async def schedule_views(
    conn: AsyncConnection, rows: Sequence[RowMapping], upcoming: int = 1
) -> list[ss.Schedule]:
    """Views of ``rows``, each with whether its principal may still act (two reads in all)."""
    refused = await authority.refusals(conn, rows)
    return [schedule_view(r, upcoming, refused.get(r["schedule_id"])) for r in rows]


async def one_view(db: DB, row: RowMapping, upcoming: int = 5) -> ss.Schedule:
    """The view of one schedule just written (its principal re-read after the write)."""
    async with db.read() as conn:
        return (await schedule_views(conn, [row], upcoming))[0]


def schedule_view(
    row: RowMapping, upcoming: int = 1, refused: authority.Refusal | None = None
) -> ss.Schedule:
    """Build a :class:`ss.Schedule` from a ``schedules`` row with its next ``upcoming`` ticks.

    ``refused``: why its principal may not act now (``blocked_reason``), or None.
    """
    return ss.Schedule(
        schedule_id=row["schedule_id"],
        name=row["name"],
        workflow=row["workflow"],
        version=row["version"],
        input=json.loads(row["input"]),
        cron=row["cron"],
        timezone=row["timezone"],
        at=row["at"],
        overlap=row["overlap"],
        catchup_window_seconds=row["catchup_window_seconds"],
        jitter_seconds=row["jitter_seconds"],
        state=row["state"],
        next_fire_times=[
            ss.UpcomingTick(tick=t, fire_at=f) for t, f in engine.upcoming(row, upcoming)
        ],
        last_tick_at=row["last_tick_at"],
        buffered_tick_at=row["buffered_tick_at"],
        fired_count=row["fired_count"],
        missed_count=row["missed_count"],
        skipped_count=row["skipped_count"],
        last_error=row["last_error"],
        blocked_reason=None if refused is None else refused.detail,
        access=row["access"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def fire_view(row: RowMapping) -> ss.ScheduleFire:
    """Build a :class:`ss.ScheduleFire` from a ``schedule_fires`` row."""
    return ss.ScheduleFire(
        tick=row["tick"],
        kind=row["kind"],
        outcome=row["outcome"],
        run_id=row["run_id"],
        fired_at=row["fired_at"],
        fired_by=row["fired_by"],
        error=row["error"],
    )


@router.post(
    "",
    operation_id="create_schedule",
    status_code=201,
    response_model=ss.Schedule,
    responses={201: {"links": SCHEDULE_LINKS}, **_CONFLICT, **_PROBLEMS},
)
async def create_schedule(
    body: ss.CreateScheduleRequest,
    response: Response,
    principal: RunsWrite,
    db: DB,
    submitter: SubmitterDep,
) -> ss.Schedule:
    """Create a cron (``cron`` + ``timezone``) or one-off (``at``) schedule.

    The workflow and input are checked now as for ``POST /runs`` (404 unknown workflow,
    422 input invalid for its schema). The schedule acts for the caller: its runs are
    created as the caller's subject, carry the caller's API key (if one was used) and are
    re-checked like submitted runs, so once the key is revoked (or the tenant suspended)
    its ticks start nothing and are recorded ``failed`` with the cause
    (``blocked_reason`` says so). A schedule of an ``owner``-policy workflow is the
    caller's alone: for other subjects it does not exist (404). Errors: 422 bad cron
    expression, unknown time zone, both or neither of ``cron``/``at``, ``at`` in the
    past; 409 the name is taken.
    """
    spec = engine.ScheduleSpec(
        name=body.name,
        workflow=body.workflow,
        input=body.input,
        version=None if body.version is None else str(body.version),
        cron=body.cron,
        timezone=body.timezone,
        at=body.at,
        overlap=engine.Overlap(body.overlap),
        catchup_window_seconds=body.catchup_window_seconds,
        jitter_seconds=body.jitter_seconds,
        paused=body.paused,
    )
    row = await engine.create_schedule(
        db,
        submitter,
        spec,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
    )
    response.headers["Location"] = f"/schedules/{row['schedule_id']}"
    return await one_view(db, row)


@router.get("", operation_id="list_schedules", response_model=ss.SchedulePage, responses=_PROBLEMS)
async def list_schedules(
    principal: RunsRead,
    db: DB,
    workflow: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")] = None,
    state: Annotated[str | None, Query(pattern=r"^(active|paused|completed)$")] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ss.SchedulePage:
    """The tenant's schedules, newest first, each with its next fire time.

    Schedules of ``owner``-policy workflows appear only to their creator (and ``admin``).
    """
    filters = {"workflow": workflow, "state": state}
    before = None
    if page_token:
        position = decode_token(page_token, principal.tenant_id, "schedules", filters)
        try:
            before = uuid.UUID(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    async with db.lagging_read() as conn:  # may lag (docs/adr/0033-…)
        rows = await sched_q.list_schedules(
            conn,
            principal.tenant_id,
            workflow=workflow,
            state=state,
            before_id=before,
            limit=limit + 1,
            owner=principal.owner_filter,
        )
        items = await schedule_views(conn, rows[:limit])
    token = None
    if len(rows) > limit:
        token = encode_token(
            principal.tenant_id, "schedules", filters, str(rows[limit - 1]["schedule_id"])
        )
    return ss.SchedulePage(items=items, next_page_token=token)


@router.get(
    "/{schedule_id}",
    operation_id="get_schedule",
    response_model=ss.Schedule,
    responses=_PROBLEMS,
)
async def get_schedule(
    schedule_id: str,
    principal: RunsRead,
    db: DB,
    next: Annotated[int, Query(ge=0, le=100, description="How many upcoming ticks")] = 5,
) -> ss.Schedule:
    """One schedule with its next ``next`` fire times (tick and jittered fire time).

    ``blocked_reason`` is set while the principal it acts for may not act (API key
    revoked, tenant suspended): its ticks are then recorded ``failed`` and start nothing.
    """
    async with db.read() as conn:
        row = await sched_q.get_schedule(
            conn,
            principal.tenant_id,
            parse_schedule_id(schedule_id),
            owner=principal.owner_filter,
        )
        return (await schedule_views(conn, [row], next))[0]


@router.patch(
    "/{schedule_id}",
    operation_id="update_schedule",
    response_model=ss.Schedule,
    responses={**_CONFLICT, **_PROBLEMS},
)
async def update_schedule(
    schedule_id: str,
    body: ss.UpdateScheduleRequest,
    principal: RunsWrite,
    db: DB,
    submitter: SubmitterDep,
) -> ss.Schedule:
    """Change a schedule; only the fields given change (``null`` version = latest).

    Setting ``cron`` clears ``at`` and vice versa; a timing change recomputes the next
    tick from now. The workflow and input are re-checked as on create. The schedule
    keeps acting for its creator; 403 when the change would point another subject's
    schedule at an ``owner``-policy workflow, 404 for another subject's owner-policy
    schedule.
    """
    changes = body.model_dump(exclude_unset=True)
    if "version" in changes and changes["version"] is not None:
        changes["version"] = str(changes["version"])
    for key in ("name", "workflow", "timezone", "overlap", "catchup_window_seconds"):
        if key in changes and changes[key] is None:
            raise BadRequest(f"{key} cannot be null")
    if "jitter_seconds" in changes and changes["jitter_seconds"] is None:
        raise BadRequest("jitter_seconds cannot be null")
    row = await engine.update_schedule(
        db,
        submitter,
        tenant_id=principal.tenant_id,
        schedule_id=parse_schedule_id(schedule_id),
        changes=changes,
        owner=principal.owner_filter,
    )
    return await one_view(db, row)


@router.delete(
    "/{schedule_id}",
    operation_id="delete_schedule",
    status_code=204,
    response_class=Response,
    responses=_PROBLEMS,
)
async def delete_schedule(schedule_id: str, principal: RunsWrite, db: DB) -> Response:
    """Delete a schedule and its fire records. Runs it started are kept."""
    sid = parse_schedule_id(schedule_id)

    async def delete(conn: AsyncConnection) -> None:
        await sched_q.delete_schedule(conn, principal.tenant_id, sid, owner=principal.owner_filter)

    await db.write_retrying(delete, what="delete schedule")
    return Response(status_code=204)


@router.post(
    "/{schedule_id}/pause",
    operation_id="pause_schedule",
    response_model=ss.Schedule,
    responses={**_CONFLICT, **_PROBLEMS},
)
async def pause_schedule(schedule_id: str, principal: RunsWrite, db: DB) -> ss.Schedule:
    """Stop firing (idempotent). 409 for a completed one-off."""
    row = await engine.set_paused(
        db,
        tenant_id=principal.tenant_id,
        schedule_id=parse_schedule_id(schedule_id),
        paused=True,
        owner=principal.owner_filter,
    )
    return await one_view(db, row)


@router.post(
    "/{schedule_id}/resume",
    operation_id="resume_schedule",
    response_model=ss.Schedule,
    responses={**_CONFLICT, **_PROBLEMS},
)
async def resume_schedule(schedule_id: str, principal: RunsWrite, db: DB) -> ss.Schedule:
    """Fire again from the next tick after now (idempotent).

    Ticks that fell inside the pause are not fired and not counted as missed.
    """
    row = await engine.set_paused(
        db,
        tenant_id=principal.tenant_id,
        schedule_id=parse_schedule_id(schedule_id),
        paused=False,
        owner=principal.owner_filter,
    )
    return await one_view(db, row)


@router.post(
    "/{schedule_id}/trigger",
    operation_id="trigger_schedule",
    response_model=ss.ScheduleFire,
    responses={**_CONFLICT, **_PROBLEMS},
)
async def trigger_schedule(
    schedule_id: str,
    request: Request,
    principal: RunsWrite,
    db: DB,
    submitter: SubmitterDep,
) -> ss.ScheduleFire:
    """Fire the schedule once now ("trigger now"), under its overlap policy.

    Returns the fire: ``started`` with its ``run_id``, or ``skipped`` / ``buffered`` when
    an earlier run is still open and the policy says so, or ``failed`` with ``error``
    (e.g. ``api_key_revoked: …``). Works on paused schedules. The run is created in the
    name of the schedule's creator, never the caller's; another subject's owner-policy
    schedule is not found (404).
    """
    fire = await engine.trigger_now(
        db,
        submitter,
        tenant_id=principal.tenant_id,
        schedule_id=parse_schedule_id(schedule_id),
        actor=principal.subject,
        owner=principal.owner_filter,
    )
    if fire.run_id is not None:
        wake_workers(request)
    async with db.read() as conn:
        row = await sched_q.get_fire(
            conn, principal.tenant_id, parse_schedule_id(schedule_id), fire.tick
        )
    return fire_view(row)


@router.get(
    "/{schedule_id}/fires",
    operation_id="list_schedule_fires",
    response_model=ss.ScheduleFirePage,
    responses=_PROBLEMS,
)
async def list_schedule_fires(
    schedule_id: str,
    principal: RunsRead,
    db: DB,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> ss.ScheduleFirePage:
    """The ticks this schedule fired, newest first: nominal tick, outcome and run id."""
    sid = parse_schedule_id(schedule_id)
    scope = f"fires:{sid}"
    before = None
    if page_token:
        position = decode_token(page_token, principal.tenant_id, scope, {})
        try:
            before = datetime.fromisoformat(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
        if before.tzinfo is None:
            raise BadRequest("page_token is malformed")

    async def read(conn: AsyncConnection) -> Sequence[RowMapping]:
        await sched_q.get_schedule(conn, principal.tenant_id, sid, owner=principal.owner_filter)
        return await sched_q.list_fires(
            conn, principal.tenant_id, sid, before_tick=before, limit=limit + 1
        )

    rows = await lagging_read_or_primary(db, read)
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, scope, {}, rows[limit - 1]["tick"].isoformat())
    return ss.ScheduleFirePage(items=[fire_view(r) for r in rows[:limit]], next_page_token=token)
