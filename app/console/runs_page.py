"""The *Runs* page (``/ui/runs``): filters, counts by status, search, paging, live table."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi import Query as FromQuery
from fastapi.responses import Response

from app.client import RunCounts, RunPage, TreadleAPIError, quote_segment
from app.console.query import RunsQuery
from app.console.sessions import Session
from app.console.web import Client, api_message, first_page_if_stale, redirect, render
from app.core.status import RunReason, RunStatus

router = APIRouter()

PAGE_SIZE = 50
STATUSES = [s.value for s in RunStatus]
REASONS = [r.value for r in RunReason]
Query = Annotated[RunsQuery, FromQuery()]


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The page's filters as the browser sent them (every field "" when unset)."""

    workflow: str = ""
    status: str = ""
    created_after: str = ""
    created_before: str = ""
    version: str = ""
    reason: str = ""
    finished_after: str = ""
    finished_before: str = ""
    label: str = ""
    q: str = ""
    page_token: str = ""
    limit: str = ""

    @classmethod
    def from_query(cls, q: RunsQuery) -> RunFilters:
        """The filters of a validated query (:class:`app.console.query.RunsQuery`)."""
        return cls(
            workflow=q.workflow.strip(),
            status=q.status.value if q.status else "",
            created_after=q.created_after.strip(),
            created_before=q.created_before.strip(),
            version=q.version.strip(),
            reason=q.reason.value if q.reason else "",
            finished_after=q.finished_after.strip(),
            finished_before=q.finished_before.strip(),
            label=q.label.strip(),
            q=q.q.strip(),
            page_token=q.page_token,
            limit=str(q.limit) if q.limit else "",
        )

    def query(self, **changes: str) -> str:
        """The query string of these filters with ``changes`` (empty values left out)."""
        values = {
            "workflow": self.workflow,
            "status": self.status,
            "created_after": self.created_after,
            "created_before": self.created_before,
            "version": self.version,
            "reason": self.reason,
            "finished_after": self.finished_after,
            "finished_before": self.finished_before,
            "label": self.label,
            "q": self.q,
            "page_token": self.page_token,
            "limit": self.limit,
            **changes,
        }
        return urlencode({k: v for k, v in values.items() if v})


def parse_labels(text: str) -> dict[str, str]:
    """The Label filter box: ``key=value`` pairs separated by commas (``value*`` = prefix).

    The server checks keys and values (its 422 message is shown); this only splits.

    Raises:
        ValueError: a pair without ``=``.
    """
    labels: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(
                "Label must be key=value (several separated by commas; value* for a prefix)"
            )
        labels[key.strip()] = value.strip()
    return labels


def parse_local_time(text: str, field: str) -> datetime | None:
    """A ``datetime-local`` value (or ISO 8601 with a zone) as UTC; naive means UTC.

    Raises:
        ValueError: not a date and time (the message names ``field``).
    """
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{field} must be a date and time such as 2026-12-01T09:30") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


async def _load(api: Client, f: RunFilters) -> tuple[dict[str, Any], RunPage | None]:
    ctx: dict[str, Any] = {
        "filters": f,
        "statuses": STATUSES,
        "reasons": REASONS,
        "counts": None,
        "page": None,
    }
    try:
        after = parse_local_time(f.created_after, "Created after")
        before = parse_local_time(f.created_before, "Created before")
        finished_after = parse_local_time(f.finished_after, "Finished after")
        finished_before = parse_local_time(f.finished_before, "Finished before")
        labels = parse_labels(f.label)
    except ValueError as exc:
        ctx["flash"] = ("alert", str(exc))
        return ctx, None
    common: dict[str, Any] = {
        "workflow": f.workflow or None,
        "created_after": after,
        "created_before": before,
        "idempotency_key": f.q or None,
        "reason": f.reason or None,
        "version": f.version or None,
        "finished_after": finished_after,
        "finished_before": finished_before,
        "labels": labels or None,
    }
    try:
        page, stale = await first_page_if_stale(
            lambda t: api.list(
                **common,
                status=f.status or None,
                page_token=t,
                limit=int(f.limit or PAGE_SIZE),
            ),
            f.page_token,
        )
        if stale:
            ctx["filters"] = replace(f, page_token="")
            ctx["flash"] = ("alert", stale)
        counts: RunCounts = await api.run_counts(**common)
    except TreadleAPIError as exc:
        if exc.status in (400, 422):
            ctx["flash"] = ("alert", api_message(exc))
            return ctx, None
        raise
    ctx["page"] = page
    ctx["counts"] = counts
    return ctx, page


@router.get("/runs")
async def runs(request: Request, session: Session, api: Client, query: Query) -> Response:
    """The tenant's runs, newest first, with filters, counts and a live-refreshing table.

    The search box takes a run id (going straight to the run) or an idempotency key.
    Query parameters: :class:`app.console.query.RunsQuery` (a bad one is a 422 page).
    """
    f = RunFilters.from_query(query)
    if f.q:
        try:
            run_id = uuid.UUID(f.q)
        except ValueError:
            run_id = None
        if run_id is not None:
            try:
                await api.get(run_id)
            except TreadleAPIError as exc:
                if exc.status != 404:
                    raise
            else:
                return redirect(f"/ui/runs/{quote_segment(run_id)}")
    ctx, _ = await _load(api, f)
    return await render(request, "runs.html", ctx, session=session)


@router.get("/runs/table")
async def runs_table(request: Request, session: Session, api: Client, query: Query) -> Response:
    """The runs table and counts alone: the fragment the page's live refresh fetches."""
    ctx, _ = await _load(api, RunFilters.from_query(query))
    return await render(request, "_runs_table.html", ctx, session=session, show_flash=False)
