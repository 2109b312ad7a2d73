"""``GET /runs/{run_id}/logs``: the lines a run's handler code logged with ``ctx.logger``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api.deps import DB, RunsRead, TenantQuery, lagging_read_or_primary, visible_run
from app.api.log_schemas import LogPage
from app.api.pagination import INT32_MAX, encode_token, int_position
from app.api.problems import PROBLEM_RESPONSES as _PROBLEMS
from app.api.routes.runs import parse_run_id
from app.api.views import is_redacted, log_view
from app.core.status import LogLevel
from app.db.queries import run_logs as run_logs_q

router = APIRouter(prefix="/runs", tags=["runs"])


@router.get(
    "/{run_id}/logs",
    operation_id="list_run_logs",
    response_model=LogPage,
    responses=_PROBLEMS,
)
async def list_run_logs(
    run_id: str,
    principal: RunsRead,
    db: DB,
    level: Annotated[
        LogLevel | None, Query(description="Only lines of this severity or higher.")
    ] = None,
    step: Annotated[
        str | None,
        Query(max_length=255, description="Only the lines of this step's attempts (a step id)."),
    ] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 200,
    tenant: TenantQuery = None,
) -> LogPage:
    """The run's ``ctx.logger`` lines in the order they were logged, oldest first.

    Workflow code's lines have a null ``step_id``; a step attempt's lines carry its
    ``step_id`` and ``attempt`` (each attempt of a retried step keeps its own). A line is
    kept once even when the workflow replays past it. A run keeps at most
    ``TREADLE_RUN_LOG_MAX_LINES`` lines; past that one last line (``seq`` 2147483647)
    says how many were dropped. ``level`` keeps that severity and higher (``warning``:
    warnings and errors); ``step`` keeps one step's lines. A redacted run (failed its
    authorization re-check) lists its lines without message or fields (``redacted``).
    Pagination is keyset-based on ``seq``; ``page_token`` is opaque and only valid with
    the same filters. Scope ``runs:read``; another tenant's run is 404.
    """
    rid = parse_run_id(run_id)
    scope = f"logs:{rid}"
    filters = {"level": level.value if level else None, "step": step}
    # seq is an INTEGER column: a larger position would fail in the driver.
    after = int_position(page_token, principal.tenant_id, scope, filters, maximum=INT32_MAX)

    async def read(conn: AsyncConnection) -> tuple[RowMapping, Sequence[RowMapping]]:
        run = await visible_run(conn, principal, rid, tenant)
        rows = await run_logs_q.list_lines(
            conn,
            run["tenant_id"],
            rid,
            after_seq=after,
            limit=limit + 1,
            level=level,
            step_id=step,
        )
        return run, rows

    run, rows = await lagging_read_or_primary(db, read)
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, scope, filters, int(rows[limit - 1]["seq"]))
    redacted = is_redacted(run)
    return LogPage(
        items=[log_view(r, redacted) for r in rows[:limit]],
        next_page_token=token,
        redacted=redacted,
    )
