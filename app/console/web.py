"""What every console page module uses: templates, the API client, CSRF and messages.

See the package docstring (:mod:`app.console`) for how a page module uses these.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

import structlog
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.datastructures import FormData
from starlette.templating import Jinja2Templates

from app.client import AsyncTreadleClient, TreadleAPIError
from app.console import crypto, sessions
from app.console.client import in_process_client
from app.console.sessions import ConsoleSession, Session
from app.core.text import printable

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
STATIC_DIR = PACKAGE_DIR / "static"

log = structlog.get_logger("treadle.console")


def _finalize(value: Any) -> Any:
    # Every value a template prints passes here before autoescaping: characters a reader
    # cannot see (NUL, bidi overrides, zero-width, lone surrogates) become visible
    # ``\uXXXX`` escapes, as the API's text report spells them (app.core.text).
    if value is None:
        return ""
    if isinstance(value, Markup):
        # Already-escaped HTML (a macro's output): kept as markup, else it would be
        # escaped twice; ``printable`` only swaps characters for ASCII ``\uXXXX``.
        return Markup(printable(str(value), keep="\n\t"))
    if isinstance(value, str):
        return printable(value, keep="\n\t")
    return value


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON (non-ASCII kept readable; the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        autoescape=select_autoescape(["html"], default=True),
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty_json"] = pretty_json
    env.filters["tojson_compact"] = lambda v: json.dumps(v, ensure_ascii=False, default=str)
    env.filters["urlseg"] = lambda v: quote(str(v), safe="")
    return env


templates = Jinja2Templates(env=_environment())
"""The console's Jinja2 templates (``app/console/templates``), autoescaped."""


async def render(
    request: Request,
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    session: ConsoleSession | None = None,
    status_code: int = 200,
    show_flash: bool = True,
) -> HTMLResponse:
    """Render ``template`` with the base layout's variables.

    Args:
        request: the page request.
        template: file name under ``app/console/templates``.
        context: the page's own variables.
        session: the signed-in session: the nav shows its subject and the sign-out form,
            and ``csrf_token`` is set for the page's forms.
        status_code: HTTP status of the page.
        show_flash: take and show the session's pending message (False for fragments).

    Returns:
        The HTML response.
    """
    ctx: dict[str, Any] = dict(context or {})
    ctx.setdefault("flash", None)
    ctx["session"] = session
    ctx["csrf_token"] = session.csrf_token if session else ""
    ctx["path"] = request.url.path
    if session is not None and show_flash and ctx["flash"] is None:
        ctx["flash"] = await sessions.take_flash(request, session)
    return templates.TemplateResponse(request, template, ctx, status_code=status_code)


def redirect(url: str) -> RedirectResponse:
    """303 See Other to ``url`` (the answer to a POST form that did its work)."""
    return RedirectResponse(url, status_code=303)


def safe_next(value: str | None, default: str = "/ui/runs") -> str:
    """``value`` if it is a console path on this site, else ``default`` (no open redirect)."""
    if not value or not value.startswith("/ui/") or "\\" in value or not value.isprintable():
        return default
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return default
    return value


async def api_client(request: Request, session: Session) -> AsyncIterator[AsyncTreadleClient]:
    """FastAPI dependency: an API client bound to the signed-in user's token."""
    async with in_process_client(
        request.app, session.token, request_id=request.headers.get("x-request-id")
    ) as client:
        yield client


Client = Annotated[AsyncTreadleClient, Depends(api_client)]
"""Route parameter type: the in-process API client of the signed-in user."""


class CsrfRejected(Exception):
    """A POST form without the session's ``csrf_token``: a 403 page, nothing done."""


async def csrf_form(request: Request, session: Session) -> FormData:
    """FastAPI dependency: the POST form, once its ``csrf_token`` matches the session's.

    Raises:
        CsrfRejected: missing or wrong token (the console's handler answers 403).
    """
    form = await request.form()
    sent = form.get("csrf_token")
    if not isinstance(sent, str) or not hmac.compare_digest(
        sent.encode(), session.csrf_token.encode()
    ):
        raise CsrfRejected()
    return form


CsrfForm = Annotated[FormData, Depends(csrf_form)]
"""Route parameter type: the CSRF-checked form of a POST action."""


def page_limit(text: str) -> str:
    """A page size the API's list endpoints accept (``1..200``) as given, else ``""``.

    ``""`` leaves the API's default; the API still validates what it is sent.
    """
    return text if text.isascii() and text.isdigit() and 1 <= int(text) <= 200 else ""


def query_string(filters: Mapping[str, str], **changes: str) -> str:
    """``filters`` with ``changes`` applied as a URL query, empty values left out.

    Pages pass it to templates as ``query`` for their filter and next-page links.
    """
    values = {**filters, **changes}
    return urlencode({k: v for k, v in values.items() if v})


async def confirm_page(
    request: Request,
    session: ConsoleSession,
    context: Mapping[str, Any],
    *,
    show_flash: bool = True,
    display_only: Collection[str] = (),
) -> HTMLResponse:
    r"""Every action's confirmation step (``confirm.html``): its ``fields`` post back as is.

    ``display_only`` names fields that only label the confirmation (a schedule's name)
    and are never sent to the API: an escaped copy of those is harmless.

    Pages escape invisible characters (``printable``), hidden inputs included, so a field
    holding one (NUL, a bidi override) would come back from the confirmation as the
    text ``\u0000`` and be acted on with it, where the API refuses the original with 422.
    Such a field is refused here instead (422, naming it): nothing is done.
    """
    for name, value in context.get("fields", ()):
        if name not in display_only and printable(value, keep="\n\t\r") != value:
            return await render(
                request,
                "error.html",
                {
                    "title": "Nothing was done",
                    "message": f"The {name.replace('_', ' ')} holds control or invisible "
                    "characters (NUL, bidi overrides, …): remove them and try again.",
                    "code": "invalid_input",
                },
                session=session,
                status_code=422,
            )
    return await render(request, "confirm.html", context, session=session, show_flash=show_flash)


def form_text(form: FormData, name: str, *, max_chars: int = 100_000) -> str:
    """A text field of ``form`` ("" when absent or a file), cut to ``max_chars``."""
    value = form.get(name)
    return value[:max_chars] if isinstance(value, str) else ""


def api_message(exc: TreadleAPIError) -> str:
    """What to show for an API refusal: its problem ``detail`` (the API's own words)."""
    return exc.detail or exc.title or exc.code


async def _api_error(request: Request, exc: Exception) -> Response:
    # A read the API refused: its detail on an error page. A 401 means the token the
    # session holds is of no more use (expired, revoked): the session ends with it.
    assert isinstance(exc, TreadleAPIError)
    if exc.status == 401:
        session_id = request.cookies.get(sessions.COOKIE)
        if session_id:
            await sessions.end_session_by_hash(request, crypto.id_hash(session_id))
        response = redirect(
            "/ui/login?expired=1&next=" + quote(safe_next(request.url.path), safe="")
        )
        sessions.clear_cookie(response)
        return response
    session = await sessions.load_session(request)
    status = exc.status if exc.status and 400 <= exc.status < 600 else 502
    return await render(
        request,
        "error.html",
        {"title": exc.title or "Error", "message": api_message(exc), "code": exc.code},
        session=session,
        status_code=status,
    )


async def _not_signed_in(request: Request, exc: Exception) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = redirect("/ui/login?next=" + quote(safe_next(target), safe=""))
    if request.cookies.get(sessions.COOKIE):
        sessions.clear_cookie(response)
    return response


async def _csrf_rejected(request: Request, exc: Exception) -> Response:
    session = await sessions.load_session(request)
    log.info("console form refused: CSRF token missing or wrong", path=request.url.path)
    return await render(
        request,
        "error.html",
        {
            "title": "Form refused",
            "message": "This form was not sent from your console page (its CSRF token is "
            "missing or wrong), so nothing was done. Reload the page and try again.",
            "code": "csrf_rejected",
        },
        session=session,
        status_code=403,
        show_flash=False,
    )


async def _disabled(request: Request, exc: Exception) -> Response:
    return templates.TemplateResponse(
        request,
        "error.html",
        {
            "title": "Console not configured",
            "message": str(exc),
            "code": "console_disabled",
            "session": None,
            "csrf_token": "",
            "flash": None,
            "path": request.url.path,
        },
        status_code=503,
    )


EXCEPTION_HANDLERS = {
    TreadleAPIError: _api_error,
    sessions.NotSignedIn: _not_signed_in,
    CsrfRejected: _csrf_rejected,
    sessions.ConsoleDisabled: _disabled,
}
"""Installed on the app by :func:`app.console.mount`."""
