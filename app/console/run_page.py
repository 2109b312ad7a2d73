"""The *Run* page (``/ui/runs/{run_id}``) and its actions: signal, cancel, pause, resume, retry.

Everything shown comes from ``GET /runs/{run_id}/report`` (run, steps, timeline, the last
``ctx.logger`` lines, dead letters) and ``/report.txt``; every action is one API call with
the user's token, after a confirmation page. Malformed signal JSON is refused here,
before anything is sent.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from app.client import AsyncTreadleClient, RunReport, TreadleAPIError, quote_segment
from app.console import graph
from app.console.sessions import ConsoleSession, Session, flash
from app.console.web import Client, CsrfForm, api_message, confirm_page, form_text, redirect, render
from app.core.errors import InvalidInput
from app.core.json import parse_text
from app.core.limits import MAX_ACTION_REASON, MAX_SIGNAL_NAME
from app.core.status import TRANSITION_STEP_PREFIX, RunStatus

router = APIRouter()

WAITING = {
    RunStatus.WAITING_APPROVAL,
    RunStatus.WAITING_SIGNAL,
    RunStatus.WAITING_TIMER,
    RunStatus.WAITING_CHILD,
    RunStatus.WAITING_EVENT,
    RunStatus.RETRYING,
}
T = TypeVar("T")


def _children(report: RunReport) -> list[dict[str, Any]]:
    # A child step's detail names the child run (app/engine/waits.py journals it there).
    out = []
    for step in report.steps:
        detail = step.detail if isinstance(step.detail, dict) else {}
        if step.kind == "child" and detail.get("child_run_id"):
            out.append({"run_id": str(detail["child_run_id"]), "workflow": step.name, "step": step})
    return out


def _transitions(report: RunReport) -> list[dict[str, Any]]:
    # A state machine journals each transition as step ``transition-<n>:<from state>``
    # (app.core.status.TRANSITION_STEP_PREFIX); the state it moved to is the next one's
    # "from", and for the last committed one the run's current state.
    steps = [s for s in report.steps if s.step_id.startswith(TRANSITION_STEP_PREFIX)]
    out = []
    for i, step in enumerate(steps):
        source = step.step_id.split(":", 1)[1] if ":" in step.step_id else "?"
        if i + 1 < len(steps):
            target = steps[i + 1].step_id.split(":", 1)[-1]
        elif step.status == "succeeded" and report.run.state is not None:
            target = report.run.state.name
        else:
            target = None
        out.append({"step": step, "source": source, "target": target})
    return out


async def _dag(api: Client, report: RunReport) -> graph.DagLayout | None:
    # The graph is the definition's (GET /workflows), the colours the run's steps.
    for wf in (await api.workflows()).items:
        if wf.name != report.run.workflow:
            continue
        for version in wf.versions:
            if version.version == report.run.version and version.graph:
                return graph.layout(version.graph, {s.step_id: s.status for s in report.steps})
    return None


def _retry_schedule(report: RunReport) -> list[Any]:
    return [e for e in report.events if e.kind == "step_retry_scheduled"]


async def _context(api: Client, run_id: str) -> dict[str, Any]:
    report = await api.report(run_id)
    text = await api.report_text(run_id)
    status = report.run.status
    return {
        "report": report,
        "run": report.run,
        "run_url": f"/ui/runs/{quote_segment(report.run.run_id)}",
        "children": _children(report),
        "retries": _retry_schedule(report),
        "transitions": _transitions(report),
        "dag": await _dag(api, report),
        "report_text": text,
        "terminal": status.is_terminal,
        "can_resume": status in WAITING,
        "can_retry": status is RunStatus.FAILED,
    }


async def _page(
    request: Request,
    session: ConsoleSession,
    api: Client,
    run_id: str,
    *,
    signal_name: str = "",
    signal_payload: str = "null",
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    ctx = await _context(api, run_id)
    ctx["signal_name"] = signal_name
    ctx["signal_payload"] = signal_payload
    if error:
        ctx["flash"] = ("alert", error)
    return await render(request, "run.html", ctx, session=session, status_code=status_code)


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str, session: Session, api: Client) -> Response:
    """One run: status, waits, input and output, steps, timeline, children, dead letters."""
    return await _page(request, session, api, run_id)


@router.get("/runs/{run_id}/live")
async def run_live(request: Request, run_id: str, session: Session, api: Client) -> Response:
    """The run page's live region alone (the fragment its refresh fetches)."""
    ctx = await _context(api, run_id)
    return await render(request, "_run_live.html", ctx, session=session, show_flash=False)


async def _confirm(
    request: Request,
    session: ConsoleSession,
    *,
    title: str,
    message: str,
    action: str,
    fields: list[tuple[str, str]],
    button: str,
    back: str,
    preview: str | None = None,
) -> Response:
    return await confirm_page(
        request,
        session,
        {
            "title": title,
            "message": message,
            "action": action,
            "fields": fields,
            "button": button,
            "back": back,
            "preview": preview,
        },
        show_flash=False,
    )


async def _done(
    request: Request, session: ConsoleSession, url: str, ok: str | None, exc: Exception | None
) -> Response:
    if isinstance(exc, TreadleAPIError):
        if exc.status == 401:
            raise exc  # the session's token is refused: sign in again
        await flash(request, session, "alert", f"Refused: {api_message(exc)}")
    elif ok:
        await flash(request, session, "status", ok)
    return redirect(url)


def _run_url(run_id: str) -> str:
    return f"/ui/runs/{quote_segment(run_id)}"


async def _confirm_and_call(
    request: Request,
    session: ConsoleSession,
    form: FormData,
    run_id: str,
    *,
    verb: str,
    title: str,
    message: str,
    fields: list[tuple[str, str]],
    button: str,
    call: Callable[[], Awaitable[T]],
    ok: Callable[[T], str],
    preview: str | None = None,
) -> Response:
    """Every run action's pattern: confirm first, then one API call, then flash and redirect.

    Without ``confirm=yes`` in ``form`` the confirmation page posts ``fields`` back to
    ``/ui/runs/{run_id}/<verb>``; with it, ``call()`` runs and the user is sent back to the
    run page with ``ok(result)`` flashed, or the API's refusal (a 401 is raised instead, so
    the session signs in again: ``_done``).
    """
    url = _run_url(run_id)
    if form_text(form, "confirm") != "yes":
        return await _confirm(
            request,
            session,
            title=title,
            message=message,
            action=f"{url}/{verb}",
            fields=fields,
            button=button,
            back=url,
            preview=preview,
        )
    try:
        result = await call()
    except TreadleAPIError as exc:
        return await _done(request, session, url, None, exc)
    return await _done(request, session, url, ok(result), None)


@router.post("/runs/{run_id}/signal")
async def send_signal(
    request: Request, run_id: str, session: Session, api: Client, form: CsrfForm
) -> Response:
    """Send a signal with a JSON payload (validated here first), after confirmation."""
    name = form_text(form, "name").strip()
    payload_text = form_text(form, "payload", max_chars=2_000_000).strip() or "null"
    if not name or len(name) > MAX_SIGNAL_NAME:
        return await _page(
            request,
            session,
            api,
            run_id,
            signal_name=name[:MAX_SIGNAL_NAME],
            signal_payload=payload_text,
            error=f"Give the signal a name (1 to {MAX_SIGNAL_NAME} characters): nothing was sent.",
            status_code=400,
        )
    try:
        payload = parse_text(payload_text, "The payload")
    except InvalidInput as exc:
        return await _page(
            request,
            session,
            api,
            run_id,
            signal_name=name,
            signal_payload=payload_text,
            error=f"{exc.detail}: nothing was sent.",
            status_code=400,
        )
    return await _confirm_and_call(
        request,
        session,
        form,
        run_id,
        verb="signal",
        title="Send signal?",
        message=f"Send signal {name!r} to run {run_id} with this payload?",
        fields=[("name", name), ("payload", payload_text)],
        button="Send signal",
        preview=json.dumps(payload, indent=2, ensure_ascii=False),
        call=lambda: api.signal(run_id, name, payload),
        ok=lambda accepted: f"Signal {name!r} sent (signal id {accepted.signal_id}).",
    )


@dataclass(frozen=True)
class RunAction:
    """One of the run page's plain actions: a confirmation page, one API call, a flash.

    ``verb`` is the URL segment (``POST /ui/runs/{run_id}/<verb>``); ``message`` is the
    confirmation text with ``{run_id}`` in it; ``call(api, run_id, reason)`` is the API
    request; ``done`` is flashed when it succeeds (a refusal flashes the API's message).
    ``takes_reason`` reads the form's ``reason`` (a longer one than the API's
    ``MAX_ACTION_REASON`` is refused whole, never cut: ``form_text``);
    ``reason_required`` is the alert flashed, with nothing sent, when it is empty.
    """

    verb: str
    summary: str
    title: str
    message: str
    button: str
    done: str
    call: Callable[[AsyncTreadleClient, str, str], Awaitable[object]]
    takes_reason: bool = False
    reason_required: str | None = None


RUN_ACTIONS = (
    RunAction(
        verb="cancel",
        summary="Cancel the run (optional reason), after confirmation.",
        title="Cancel run?",
        message="Cancel run {run_id}? Its worker stops at its next step; this cannot be undone.",
        button="Cancel run",
        done="Run cancelled.",
        call=lambda api, run_id, reason: api.cancel(run_id, reason=reason or None),
        takes_reason=True,
    ),
    RunAction(
        verb="pause",
        summary="Pause the run (optional reason), after confirmation.",
        title="Pause run?",
        message="Pause run {run_id}? Its current step attempt finishes; it then takes no new "
        "step, and fires no timer, until it is unpaused. Signals and decisions are kept for it.",
        button="Pause run",
        done="Run paused.",
        call=lambda api, run_id, reason: api.pause(run_id, reason=reason or None),
        takes_reason=True,
    ),
    RunAction(
        verb="unpause",
        summary="Unpause the run, after confirmation.",
        title="Unpause run?",
        message="Unpause run {run_id}? Whatever fell due while it was paused (a timer, a "
        "retry, a signal) runs now.",
        button="Unpause",
        done="Run unpaused.",
        call=lambda api, run_id, reason: api.unpause(run_id),
    ),
    RunAction(
        verb="resume",
        summary="Make a waiting or retrying run due now, after confirmation.",
        title="Resume run?",
        message="Make run {run_id} due now? A wait that is still unsatisfied simply waits again.",
        button="Resume",
        done="Run resumed: it is due now.",
        call=lambda api, run_id, reason: api.resume(run_id),
    ),
    RunAction(
        verb="retry",
        summary="Re-run a failed run from its failed point (reason required), after confirmation.",
        title="Retry run?",
        message="Re-run failed run {run_id} from its failed point?",
        button="Retry",
        done="Retry requested: the run is due again.",
        call=lambda api, run_id, reason: api.retry(run_id, reason=reason),
        takes_reason=True,
        reason_required="Give a reason for the retry: nothing was done.",
    ),
)


def _action_route(action: RunAction) -> Callable[..., Awaitable[Response]]:
    """The ``POST /ui/runs/{run_id}/<verb>`` endpoint of ``action``."""

    async def endpoint(
        request: Request, run_id: str, session: Session, api: Client, form: CsrfForm
    ) -> Response:
        reason = (
            form_text(form, "reason", max_chars=MAX_ACTION_REASON).strip()
            if action.takes_reason
            else ""
        )
        if action.reason_required and not reason:
            await flash(request, session, "alert", action.reason_required)
            return redirect(_run_url(run_id))
        return await _confirm_and_call(
            request,
            session,
            form,
            run_id,
            verb=action.verb,
            title=action.title,
            message=action.message.format(run_id=run_id),
            fields=[("reason", reason)] if action.takes_reason else [],
            button=action.button,
            call=lambda: action.call(api, run_id, reason),
            ok=lambda _: action.done,
        )

    endpoint.__name__ = f"{action.verb}_run"
    endpoint.__doc__ = action.summary
    return endpoint


for _action in RUN_ACTIONS:
    router.add_api_route(
        f"/runs/{{run_id}}/{_action.verb}", _action_route(_action), methods=["POST"]
    )
