"""The *Dead letters* page (``/ui/dead-letters``): list, filters, paging and requeue."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.client import TreadleAPIError, quote_segment
from app.console.query import DeadLettersQuery
from app.console.sessions import Session, flash
from app.console.web import (
    Client,
    CsrfForm,
    api_message,
    confirm_page,
    first_page_if_stale,
    form_text,
    query_string,
    redirect,
    render,
    safe_next,
)
from app.core.limits import MAX_ACTION_REASON

router = APIRouter()

PAGE_SIZE = 50
STATUSES = ("pending", "all")


def _filters(q: DeadLettersQuery) -> dict[str, str]:
    # Validated by the query model; the API validates the rest (its 422 an alert).
    return {
        "status": q.status or "pending",
        "workflow": q.workflow.strip(),
        "page_token": q.page_token,
        "limit": str(q.limit) if q.limit else "",
    }


@router.get("/dead-letters")
async def dead_letters(
    request: Request, session: Session, api: Client, query: Annotated[DeadLettersQuery, Query()]
) -> Response:
    """The tenant's dead letters (pending by default, or all), newest first, 50 a page.

    Filters: ``status`` (``pending`` | ``all``), ``workflow``, ``page_token`` (the API's),
    ``limit`` (page size 1..200).
    A parameter of the wrong type or out of range is a 422 page
    (:class:`app.console.query.DeadLettersQuery`); a filter the API refuses (400/422) is
    shown as an alert above an empty page.
    """
    f = _filters(query)
    ctx: dict[str, Any] = {"filters": f, "statuses": STATUSES, "page": None, "query": query_string}
    try:
        ctx["page"], stale = await first_page_if_stale(
            lambda t: api.dead_letters(
                status=f["status"],
                workflow=f["workflow"] or None,
                page_token=t,
                limit=int(f["limit"] or PAGE_SIZE),
            ),
            f["page_token"],
        )
        if stale:
            f["page_token"] = ""
            ctx["flash"] = ("alert", stale)
    except TreadleAPIError as exc:
        if exc.status not in (400, 422):
            raise
        ctx["flash"] = ("alert", api_message(exc))
    return await render(request, "dead_letters.html", ctx, session=session)


@router.post("/dead-letters/{dead_letter_id}/requeue")
async def requeue(
    request: Request, dead_letter_id: str, session: Session, api: Client, form: CsrfForm
) -> Response:
    """Requeue one dead letter (``POST /dead-letters/{id}/requeue``) after a confirm step.

    Form fields: ``reason`` (required by the API), ``correlation_id`` (optional),
    ``back`` (the list URL to return to). The API's refusal (409 already requeued, 422
    empty reason, 403 missing scope, 404) comes back as an alert; nothing is done then.
    """
    reason = form_text(form, "reason", max_chars=MAX_ACTION_REASON)
    correlation_id = form_text(form, "correlation_id", max_chars=300).strip()
    back = form_text(form, "back", max_chars=2000)
    back = safe_next(back, "/ui/dead-letters")
    if not back.startswith("/ui/dead-letters"):
        back = "/ui/dead-letters"
    action = f"/ui/dead-letters/{quote_segment(dead_letter_id)}/requeue"
    if form_text(form, "confirm") != "yes":
        return await confirm_page(
            request,
            session,
            {
                "title": "Requeue dead letter",
                "message": f"Requeue dead letter {dead_letter_id}? Its run re-runs from "
                "the failed point: failed steps start over, succeeded ones replay.",
                "preview": f"Reason: {reason}"
                + (f"\nCorrelation id: {correlation_id}" if correlation_id else ""),
                "action": action,
                "fields": [
                    ("reason", reason),
                    ("correlation_id", correlation_id),
                    ("back", back),
                ],
                "button": "Requeue",
                "back": back,
            },
        )
    try:
        done = await api.requeue(
            dead_letter_id, reason=reason, correlation_id=correlation_id or None
        )
    except TreadleAPIError as exc:
        if exc.status is None or exc.status >= 500 or exc.status == 401:
            raise
        await flash(request, session, "alert", f"Not requeued: {api_message(exc)}")
        return redirect(back)
    await flash(
        request,
        session,
        "status",
        f"Requeued dead letter {done.dead_letter_id}: run {done.run_id} runs again.",
    )
    return redirect(back)
