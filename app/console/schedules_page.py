"""The *Schedules* pages: ``/ui/schedules`` (list) and ``/ui/schedules/{id}`` (detail).

Actions on the detail page, each with a confirm step: "Pause", "Resume schedule",
"Trigger now" (``POST /schedules/{id}/pause|resume|trigger`` through the API).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.client import TreadleAPIError, quote_segment
from app.console.query import SchedulesQuery
from app.console.sessions import Session, flash
from app.console.timestamps import with_times
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
)

router = APIRouter()

PAGE_SIZE = 50
NEXT_TICKS = 10
RECENT_FIRES = 20
STATES = ("active", "paused", "completed")
_TIME_KEYS = (
    "at",
    "last_tick_at",
    "buffered_tick_at",
    "created_at",
    "updated_at",
    "tick",
    "fire_at",
    "fired_at",
)

# What each action's confirm page says and which API operation it calls.
ACTIONS: dict[str, tuple[str, str, str]] = {
    "pause": ("Pause", "pause", "Pause schedule {name}? It stops firing until resumed."),
    "resume": (
        "Resume schedule",
        "resume",
        "Resume schedule {name}? It fires again from the next tick after now; ticks "
        "that fell inside the pause are not fired.",
    ),
    "trigger": (
        "Trigger now",
        "trigger",
        "Fire schedule {name} once now, under its overlap policy? The run is started "
        "in the name of the schedule's creator.",
    ),
}


def _filters(q: SchedulesQuery) -> dict[str, str]:
    return {
        "state": q.state or "",
        "workflow": q.workflow.strip(),
        "page_token": q.page_token,
        "limit": str(q.limit) if q.limit else "",
    }


@router.get("/schedules")
async def schedules(
    request: Request, session: Session, api: Client, query: Annotated[SchedulesQuery, Query()]
) -> Response:
    """The tenant's schedules, newest first, with a state filter and the API's paging.

    Query parameters: :class:`app.console.query.SchedulesQuery` (a bad one is a 422 page).
    """
    f = _filters(query)
    ctx: dict[str, Any] = {"filters": f, "states": STATES, "page": None, "query": query_string}
    params = {k: v for k, v in f.items() if v and k != "page_token"}
    params["limit"] = f["limit"] or str(PAGE_SIZE)

    async def fetch(token: str | None) -> Any:
        return await api.request(
            "GET", "/schedules", params={**params, **({"page_token": token} if token else {})}
        )

    try:
        page, stale = await first_page_if_stale(fetch, f["page_token"])
        if stale:
            f["page_token"] = ""
            ctx["flash"] = ("alert", stale)
    except TreadleAPIError as exc:
        if exc.status not in (400, 422):
            raise
        ctx["flash"] = ("alert", api_message(exc))
    else:
        ctx["page"] = with_times(page, _TIME_KEYS)
    return await render(request, "schedules.html", ctx, session=session)


@router.get("/schedules/{schedule_id}")
async def schedule(request: Request, schedule_id: str, session: Session, api: Client) -> Response:
    """One schedule: its settings, next fire times and recent fires, and its actions.

    A schedule the API does not show (another tenant's, a malformed id) is its 404 page.
    """
    path = f"/schedules/{quote_segment(schedule_id)}"
    sched = await api.request("GET", path, params={"next": NEXT_TICKS})
    fires = await api.request("GET", f"{path}/fires", params={"limit": RECENT_FIRES})
    return await render(
        request,
        "schedule.html",
        {"s": with_times(sched, _TIME_KEYS), "fires": with_times(fires, _TIME_KEYS)},
        session=session,
    )


@router.post("/schedules/{schedule_id}/{action}")
async def schedule_action(
    request: Request,
    schedule_id: str,
    action: str,
    session: Session,
    api: Client,
    form: CsrfForm,
) -> Response:
    """Pause, resume or trigger a schedule once the confirm step re-posted ``confirm=yes``.

    The API's refusal (409 for a completed one-off, 403 without ``runs:write``, 404)
    comes back as an alert on the schedule's page; nothing is done then.
    """
    page = f"/ui/schedules/{quote_segment(schedule_id)}"
    if action not in ACTIONS:
        return await render(
            request,
            "error.html",
            {
                "title": "Not found",
                "message": f"No schedule action {action!r}.",
                "code": "not_found",
            },
            session=session,
            status_code=404,
        )
    button, operation, message = ACTIONS[action]
    name = form_text(form, "name", max_chars=300) or schedule_id
    if form_text(form, "confirm") != "yes":
        return await confirm_page(
            request,
            session,
            {
                "title": button,
                "message": message.format(name=name),
                "action": f"{page}/{action}",
                "fields": [("name", name)],
                "button": button,
                "back": page,
            },
            display_only=("name",),  # the action is by id; the name labels the question
        )
    try:
        result = await api.request("POST", f"/schedules/{quote_segment(schedule_id)}/{operation}")
    except TreadleAPIError as exc:
        if exc.status is None or exc.status >= 500 or exc.status == 401:
            raise
        await flash(request, session, "alert", f"{button} refused: {api_message(exc)}")
        return redirect(page)
    if action == "trigger":
        text = f"Triggered: {result.get('outcome')}"
        if result.get("run_id"):
            text += f", run {result['run_id']} started"
        if result.get("error"):
            text += f" ({result['error']})"
        kind = "alert" if result.get("outcome") == "failed" else "status"
        await flash(request, session, kind, text + ".")  # type: ignore[arg-type]
    else:
        shown = result.get("name") or name  # the API's name, not the form's echo
        await flash(request, session, "status", f"Schedule {shown} is {result.get('state')}.")
    return redirect(page)
