"""The *Runs* page (``/ui/runs``): filters, counts by status, search, paging, live table."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.client import RunCounts, RunPage, TreadleAPIError, quote_segment
from app.console.sessions import Session
from app.console.web import Client, api_message, redirect, render
from app.core.status import RunReason, RunStatus

router = APIRouter()

PAGE_SIZE = 50
STATUSES = [s.value for s in RunStatus]
REASONS = [r.value for r in RunReason]


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

    @classmethod
    def from_request(cls, request: Request) -> RunFilters:
        """Read the filters from the query string (each cut to a sane length)."""
        p = request.query_params
        return cls(
            workflow=p.get("workflow", "").strip()[:200],
            status=p.get("status", "").strip()[:40],
            created_after=p.get("created_after", "").strip()[:40],
            created_before=p.get("created_before", "").strip()[:40],
            version=p.get("version", "").strip()[:64],
            reason=p.get("reason", "").strip()[:64],
            finished_after=p.get("finished_after", "").strip()[:40],
            finished_before=p.get("finished_before", "").strip()[:40],
            label=p.get("label", "").strip()[:2000],
            q=p.get("q", "").strip()[:255],
            page_token=p.get("page_token", "")[:1000],
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
        page = await api.list(
            **common,
            status=f.status or None,
            page_token=f.page_token or None,
            limit=PAGE_SIZE,
        )
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
async def runs(request: Request, session: Session, api: Client) -> Response:
    """The tenant's runs, newest first, with filters, counts and a live-refreshing table.

    The search box takes a run id (going straight to the run) or an idempotency key.
    """
    f = RunFilters.from_request(request)
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
async def runs_table(request: Request, session: Session, api: Client) -> Response:
    """The runs table and counts alone: the fragment the page's live refresh fetches."""
    ctx, _ = await _load(api, RunFilters.from_request(request))
    return await render(request, "_runs_table.html", ctx, session=session, show_flash=False)
