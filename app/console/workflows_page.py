"""The *Workflows* page (``/ui/workflows``) and *Start a run* (``/ui/workflows/{name}/start``).

Both read ``GET /workflows`` with the user's token: versions, input schemas, live workers,
and the tenant's open and blocked runs per version. The start form is generated from the
version's input schema (:mod:`app.console.schema_form`) and posts ``POST /runs``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.client import TreadleAPIError, quote_segment
from app.console import schema_form
from app.console.query import StartFormQuery
from app.console.sessions import Session, flash
from app.console.timestamps import with_times
from app.console.web import Client, CsrfForm, api_message, form_text, redirect, render

router = APIRouter()


async def _workflows(api: Client) -> list[dict[str, Any]]:
    body = await api.request("GET", "/workflows")
    items = body.get("items") if isinstance(body, dict) else None
    keys = ("first_registered_at", "last_registered_at")
    return list(with_times(items or [], keys, keep=("input_schema", "output_schema")))


@router.get("/workflows")
async def workflows(request: Request, session: Session, api: Client) -> Response:
    """Every registered workflow, its versions (newest first) and their state.

    Per version: kind, access, input schema (collapsible JSON), live workers, the
    tenant's open runs, blocked runs (no live worker has the version) and runs queued
    for a concurrency slot, as ``GET /workflows`` reports them.
    """
    items = await _workflows(api)
    return await render(request, "workflows.html", {"workflows": items}, session=session)


async def _version(api: Client, name: str, version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workflow ``name`` and its version ``version`` ("" = newest) from GET /workflows.

    Raises:
        LookupError: no such workflow or version (the message says which).
    """
    for wf in await _workflows(api):
        if wf.get("name") == name:
            versions = wf.get("versions") or []
            if not versions:
                break
            if not version:
                return wf, versions[0]
            for v in versions:
                if str(v.get("version")) == version:
                    return wf, v
            raise LookupError(f"Workflow {name} has no registered version {version}.")
    raise LookupError(f"No workflow named {name} is registered.")


def _form_context(wf: dict[str, Any], ver: dict[str, Any], pinned: str) -> dict[str, Any]:
    schema = ver.get("input_schema")
    fields = schema_form.fields_for(schema)
    values = (
        {f.input_name: f.default for f in fields}
        if fields is not None
        else {schema_form.WHOLE: schema_form.whole_skeleton(schema)}
    )
    return {
        "wf": wf,
        "ver": ver,
        "pinned": pinned,
        "fields": fields,
        "values": values,
        "whole": schema_form.WHOLE,
        "idempotency_key": "",
        "errors": [],
    }


async def _not_found(request: Request, session: Session, message: str) -> Response:
    return await render(
        request,
        "error.html",
        {"title": "Not found", "message": message, "code": "workflow_not_found"},
        session=session,
        status_code=404,
    )


@router.get("/workflows/{name}/start")
async def start_form(
    request: Request,
    name: str,
    session: Session,
    api: Client,
    query: Annotated[StartFormQuery, Query()],
) -> Response:
    """The start form for ``name`` (``?version=`` pins one; default the newest).

    A ``version`` over 100 characters or holding control or bidi characters is a 422
    page (:class:`app.console.query.StartFormQuery`).
    """
    version = query.version.strip()
    try:
        wf, ver = await _version(api, name, version)
    except LookupError as exc:
        return await _not_found(request, session, str(exc))
    ctx = _form_context(wf, ver, version)
    return await render(request, "start.html", ctx, session=session)


@router.post("/workflows/{name}/start")
async def start_run(
    request: Request, name: str, session: Session, api: Client, form: CsrfForm
) -> Response:
    """Build the input from the form and ``POST /runs``; then go to the new run's page.

    Malformed JSON in a textarea: the form again with an alert, nothing submitted. The
    API's refusal (422 with its field errors, 409, 403, 404): the form again with the
    API's ``detail``, keeping what the user typed (status 422 or the API's status).
    """
    version = form_text(form, "version", max_chars=100).strip()
    try:
        wf, ver = await _version(api, name, version)
    except LookupError as exc:
        return await _not_found(request, session, str(exc))
    ctx = _form_context(wf, ver, version)
    fields = ctx["fields"]
    values = schema_form.typed_values(form, fields)
    key = form_text(form, "idempotency_key", max_chars=300).strip()
    ctx.update(values=values, idempotency_key=key)
    try:
        run_input = schema_form.build_input(values, fields)
    except schema_form.FormInputError as exc:
        ctx["flash"] = ("alert", str(exc))
        return await render(request, "start.html", ctx, session=session, status_code=422)
    try:
        run = await api.submit(
            name, run_input, version=version or None, idempotency_key=key or None
        )
    except TreadleAPIError as exc:
        if exc.status is None or exc.status >= 500 or exc.status == 401:
            raise
        ctx["flash"] = ("alert", f"Not started: {api_message(exc)}")
        errors = exc.problem.get("errors")
        ctx["errors"] = (
            [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []
        )
        return await render(request, "start.html", ctx, session=session, status_code=exc.status)
    await flash(request, session, "status", f"Run {run.run_id} of {name} v{run.version} started.")
    return redirect(f"/ui/runs/{quote_segment(run.run_id)}")
