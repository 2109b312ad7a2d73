"""The *Approvals* inbox (``/ui/approvals``): decide waiting approvals with a comment.

The list is ``GET /approvals`` (what the signed-in subject may decide: its groups, not yet
decided by it); a decision is ``POST /runs/{run_id}/approvals/{step_id}`` after a
confirmation page, so groups, N-of-M and no-self-approval are the API's, and its refusals
are shown in its own words.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.client import TreadleAPIError
from app.console.query import PagedQuery
from app.console.sessions import Session, flash
from app.console.web import (
    Client,
    CsrfForm,
    api_message,
    confirm_page,
    first_page_if_stale,
    form_text,
    redirect,
    render,
)
from app.core.limits import MAX_APPROVAL_COMMENT

router = APIRouter()

INBOX = "/ui/approvals"
MAX_COMMENT = MAX_APPROVAL_COMMENT


@router.get("/approvals")
async def approvals(
    request: Request, session: Session, api: Client, query: Annotated[PagedQuery, Query()]
) -> Response:
    """Every waiting approval the signed-in subject may decide, oldest first.

    Query parameters: ``page_token`` and ``limit`` (:class:`app.console.query.PagedQuery`;
    a bad one is a 422 page).
    """
    token = query.page_token or None
    limit = query.limit or 50
    page, stale = await first_page_if_stale(
        lambda t: api.approvals(page_token=t, limit=limit), token
    )
    ctx: dict[str, Any] = {
        "page": page,
        "page_token": "" if stale else token or "",
        "limit": str(query.limit) if query.limit else "",
        "max_comment": MAX_COMMENT,
    }
    if stale:
        ctx["flash"] = ("alert", stale)
    return await render(request, "approvals.html", ctx, session=session)


@router.post("/approvals/decide")
async def decide(request: Request, session: Session, api: Client, form: CsrfForm) -> Response:
    """Approve or reject one approval with an optional comment, after confirmation."""
    run_id = form_text(form, "run_id", max_chars=100).strip()
    step_id = form_text(form, "step_id", max_chars=300).strip()
    decision = form_text(form, "decision", max_chars=20)
    comment = form_text(form, "comment").strip()
    if decision not in ("approve", "reject") or not run_id or not step_id:
        await flash(request, session, "alert", "Choose Approve or Reject: nothing was decided.")
        return redirect(INBOX)
    if len(comment) > MAX_COMMENT:
        await flash(
            request,
            session,
            "alert",
            f"The comment is longer than {MAX_COMMENT} characters: nothing was decided.",
        )
        return redirect(INBOX)
    button = "Approve" if decision == "approve" else "Reject"
    if form_text(form, "confirm") != "yes":
        return await confirm_page(
            request,
            session,
            {
                "title": f"{button} this approval?",
                "message": f"{button} approval {step_id!r} of run {run_id}"
                + (f" with the comment: {comment}" if comment else " without a comment")
                + "?",
                "action": "/ui/approvals/decide",
                "fields": [
                    ("run_id", run_id),
                    ("step_id", step_id),
                    ("decision", decision),
                    ("comment", comment),
                ],
                "button": button,
                "back": INBOX,
                "preview": None,
            },
            show_flash=False,
        )
    try:
        call = api.approve if decision == "approve" else api.reject
        result = await call(run_id, step_id, comment=comment or None)
    except TreadleAPIError as exc:
        if exc.status == 401:
            raise
        await flash(request, session, "alert", f"Refused: {api_message(exc)}")
        return redirect(INBOX)
    verb = "Approved" if decision == "approve" else "Rejected"
    settled = (
        " The approval is settled; the run continues."
        if result.resolved
        else " It still needs more approvals."
    )
    await flash(request, session, "status", f"{verb} {step_id!r} of run {run_id}.{settled}")
    return redirect(INBOX)
