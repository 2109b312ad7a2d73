"""``GET /metrics``: Prometheus exposition of the API process."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select

from app.api.deps import DB, PUBLIC
from app.api.problems import HEADERS_TOO_LARGE
from app.core import metrics
from app.core.status import RunStatus
from app.db.queries import runs as runs_q
from app.db.tables import dead_letters
from app.engine import versioning

router = APIRouter(tags=["operations"])

# Queue depth comes from a GROUP BY over runs: cached so that frequent scrapes (or several
# Prometheus servers) cost at most one query per interval.
REFRESH_SECONDS = 5.0


async def _refresh_gauges(request: Request, db: DB) -> None:
    state = request.app.state
    if time.monotonic() - getattr(state, "gauges_at", -1e9) < REFRESH_SECONDS:
        return
    state.gauges_at = time.monotonic()
    # May lag (docs/adr/0033-lag-tolerant-reads-on-a-replica.md): counts refreshed every
    # few seconds anyway, and the scrape must not load the primary that runs the work.
    async with db.lagging_read() as conn:
        counts = await runs_q.count_by_status(conn)
        pending = (
            await conn.execute(
                select(func.count())
                .select_from(dead_letters)
                .where(dead_letters.c.status == "pending")
            )
        ).scalar_one()
        blocked = await versioning.blocked_counts(conn, request.app.state.settings)
    for status in RunStatus:
        metrics.RUNS_BY_STATUS.labels(status.value).set(counts.get(status.value, 0))
    # Workflows that had blocked runs and have none now must read 0, not the old value.
    for workflow in set(getattr(state, "blocked_workflows", ())) | set(blocked):
        metrics.RUNS_BLOCKED.labels(workflow).set(blocked.get(workflow, 0))
    state.blocked_workflows = set(blocked) | set(getattr(state, "blocked_workflows", ()))
    metrics.DEAD_LETTERS_PENDING.set(int(pending))


# HEAD as GET, no body, outside the OpenAPI document (app/api/routes/health.py says why).
@router.head("/metrics", include_in_schema=False)
@router.get(
    "/metrics",
    operation_id="get_metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition",
        },
        **HEADERS_TOO_LARGE,
    },
    openapi_extra=PUBLIC,
)
async def get_metrics(request: Request, db: DB) -> Response:
    """Prometheus metrics of this API process (no token: restrict it at the network).

    Includes runs by status, blocked runs (``treadle_runs_blocked``: open runs of a
    version no live worker registered) and pending dead letters across all tenants (counts only,
    refreshed at most every 5 seconds), submissions, and HTTP request metrics by route
    template. Workers expose their own metrics with ``treadle worker --metrics-port``.
    ``HEAD /metrics`` answers the status and headers alone.
    """
    await _refresh_gauges(request, db)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
