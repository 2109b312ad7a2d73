"""``POST /runs/{run_id}/migrate``: re-pin a blocked or waiting run to a newer version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api import schemas
from app.api.deps import DB, Admin, SettingsDep, wake_workers
from app.api.problems import PROBLEM_RESPONSES
from app.api.routes.runs import parse_run_id
from app.api.views import run_view
from app.db.queries import definitions as defs_q
from app.engine import versioning

router = APIRouter(prefix="/runs", tags=["runs"])

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": schemas.Problem, "description": "Run finished, executing, or not newer"}
}


@router.post(
    "/{run_id}/migrate",
    operation_id="migrate_run",
    response_model=schemas.Run,
    responses={**_CONFLICT, **PROBLEM_RESPONSES},
)
async def migrate_run(
    run_id: str,
    body: schemas.MigrateRunRequest,
    request: Request,
    principal: Admin,
    db: DB,
    settings: SettingsDep,
) -> schemas.Run:
    """Re-pin an open run to a newer registered version of its workflow (``admin``).

    For runs whose version no live worker registered (``blocked_reason``), or to move
    waiting runs onto new code. Rules: the run is not finished (409) and no worker is
    executing it (409); the target is a registered version (404) newer than the run's
    (409); the run's input is valid for the target's schema (422). The journal is kept,
    so the new code must replay it (guard changes with ``ctx.patched``); a replay that
    diverges fails the run with ``failure_nondeterminism``. Recorded as a
    ``run_migrated`` event.
    """
    row = await versioning.migrate_run(
        db,
        settings,
        tenant_id=principal.tenant_id,
        run_id=parse_run_id(run_id),
        version=str(body.version),
        actor=principal.subject,
        reason=body.reason,
    )
    wake_workers(request)
    async with db.read() as conn:
        blocked = None
        if row["available_at"] is not None:
            blocked = await defs_q.blocked_reason(
                conn,
                workflow=row["workflow"],
                version=row["version"],
                within_seconds=2 * settings.lease_ttl_seconds,
            )
    return run_view(row, None, blocked)
