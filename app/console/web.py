"""What every console page module uses: templates, the API client, CSRF and messages.

See the package docstring (:mod:`app.console`) for how a page module uses these.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import structlog
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.datastructures import FormData
from starlette.templating import Jinja2Templates

from app.client import AsyncTreadleClient, TreadleAPIError
from app.console import cookies, crypto, sessions
from app.console.client import in_process_client
from app.console.headers import page_headers
from app.console.origin import CrossOriginRefused
from app.console.sessions import ConsoleSession, Session
from app.core.text import printable, text_problem

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


MAX_NEXT_CHARS = 2000
"""Longest ``next`` target kept: no console link is longer, so a longer one is no page."""


def safe_next(value: str | None, default: str = "/ui/runs") -> str:
    """``value`` if it is a console path on this site, else ``default`` (no open redirect).

    A path over :data:`MAX_NEXT_CHARS` is no page the console links to: ``default``.
    """
    if (
        not value
        or len(value) > MAX_NEXT_CHARS
        or not value.startswith("/ui/")
        or "\\" in value
        or not value.isprintable()
    ):
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


_Page = TypeVar("_Page")

STALE_PAGE_TOKEN = (
    "That page link is no longer valid (its page_token is stale or damaged): "
    "showing the first page."
)


async def first_page_if_stale(
    fetch: Callable[[str | None], Awaitable[_Page]], page_token: str | None
) -> tuple[_Page, str | None]:
    """One page of a console list, falling back to the first page on a bad ``page_token``.

    Every console list page (runs, approvals, schedules, dead letters) pages with the
    API's opaque tokens; a bookmarked or shared link outlives its token. A user following
    it expects the list, not an error page: so when the API refuses the call (400/422)
    and a token was given, the page is fetched again without it and the caller shows
    :data:`STALE_PAGE_TOKEN` as an alert above the first page.

    Args:
        fetch: calls the API for the page at a token (None: the first page).
        page_token: the token of the request, or None / "" for the first page.

    Returns:
        The page and the alert to show (None when the token was good or absent).

    Raises:
        TreadleAPIError: the API refused the first page too (another filter is bad: the
            caller shows that refusal), or any other refusal.
    """
    try:
        return await fetch(page_token or None), None
    except TreadleAPIError as exc:
        if not page_token or exc.status not in (400, 422):
            raise
    return await fetch(None), STALE_PAGE_TOKEN


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
            # The API's rule names the character when it is one the API refuses too
            # (app.core.text.text_problem); the others (zero-width, …) only the escaping.
            why = text_problem(value.replace("\n", " ").replace("\t", " ").replace("\r", " "))
            return await render(
                request,
                "error.html",
                {
                    "title": "Nothing was done",
                    "message": f"The {name.replace('_', ' ')} holds control or invisible "
                    "characters (NUL, bidi overrides, …): remove them and try again."
                    + (f" ({why})" if why else ""),
                    "code": "invalid_input",
                },
                session=session,
                status_code=422,
            )
    return await render(request, "confirm.html", context, session=session, show_flash=show_flash)


class FormFieldTooLong(Exception):
    """A console form field longer than its limit: refused as a whole, never cut.

    ``field`` is the form's field name, ``limit`` its limit in characters (the API's own,
    :mod:`app.core.limits`, where the API takes the field), ``length`` what was sent.
    The console answers with an alert page (422) and does nothing (``_field_too_long``).
    """

    def __init__(self, field: str, limit: int, length: int) -> None:
        super().__init__(f"{field}: {length} characters, at most {limit}")
        self.field = field
        self.limit = limit
        self.length = length


def form_text(form: FormData, name: str, *, max_chars: int = 100_000) -> str:
    """A text field of ``form`` ("" when absent or a file), of at most ``max_chars``.

    Raises :class:`FormFieldTooLong` for a longer value: cutting it would act on text
    the user did not write (a truncated reason stored, a cut comment), where the API
    refuses the same input with 422.
    """
    value = form.get(name)
    if not isinstance(value, str):
        return ""
    if len(value) > max_chars:
        raise FormFieldTooLong(name, max_chars, len(value))
    return value


def api_message(exc: TreadleAPIError) -> str:
    """What to show for an API refusal: its problem ``detail`` (the API's own words)."""
    return exc.detail or exc.title or exc.code


async def _api_error(request: Request, exc: Exception) -> Response:
    # A read the API refused: its detail on an error page. A 401 means the token the
    # session holds is of no more use (expired, revoked): the session ends with it.
    assert isinstance(exc, TreadleAPIError)
    if exc.status == 401:
        session_id = cookies.SESSION.read(request)
        if session_id:
            await sessions.end_session_by_hash(request, crypto.id_hash(session_id))
        return _session_ended(request, request.url.path, expired=True)
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
    # A session cookie the server no longer honours (idle or absolute deadline passed,
    # ended elsewhere, secret rotated) means a session ended: the sign-in page says so.
    return _session_ended(request, target, expired=bool(cookies.SESSION.read(request)))


def _session_ended(request: Request, target: str, *, expired: bool) -> Response:
    """The answer to a request without a live session: sign in again, then ``target``.

    A page gets a redirect to ``/ui/login`` (with ``expired=1`` when a session had been
    there: "Your session ended"). A live-refresh fragment (``X-Console-Fragment``) gets a
    bare 401 instead: a redirect would be followed by ``fetch`` and the tab would reload
    without the notice; on a 401 ``static/console.js`` opens the sign-in page with
    ``expired=1`` and the tab's own page as ``next``. The stale cookie is cleared.
    """
    if request.headers.get(sessions.REFRESH_HEADER):
        response: Response = Response(status_code=401, headers={"Cache-Control": "no-store"})
    else:
        query = ("expired=1&" if expired else "") + "next=" + quote(safe_next(target), safe="")
        response = redirect("/ui/login?" + query)
    if cookies.SESSION.read(request):
        sessions.clear_cookie(request, response)
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


async def _cross_origin(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CrossOriginRefused)
    log.info(
        "console form refused: sent from another origin", path=request.url.path, source=exc.source
    )
    try:
        session = await sessions.load_session(request)
    except sessions.ConsoleDisabled:
        # The check runs before anything else, even on a console without its secret.
        session = None
    return await render(
        request,
        "error.html",
        {
            "title": "Form refused",
            "message": "This form was sent from another site or another port of this "
            "host, not from the console's own page, so nothing was done (no sign-in, no "
            "action). Open the console at its own address and try again.",
            "code": "cross_origin_refused",
        },
        session=session,
        status_code=403,
        show_flash=False,
    )


async def _field_too_long(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FormFieldTooLong)
    session = await sessions.load_session(request)
    label = exc.field.replace("_", " ")
    return await render(
        request,
        "error.html",
        {
            "title": "Nothing was done",
            "message": f"The {label} must be at most {exc.limit} characters (it has "
            f"{exc.length}): shorten it and try again. Nothing was sent.",
            "code": "invalid_input",
        },
        session=session,
        status_code=422,
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


# What a console user reads for the problems the API layer raises under /ui (malformed
# forms and addresses, bodies over the limit, slow bodies): the API's detail speaks of
# "the API schema" and bytes; the page says what happened to the user's action.
_PROBLEM_MESSAGES = {
    "payload_too_large": "The form sent more data than the server accepts ({detail}): "
    "nothing was done. Shorten what you entered and try again.",
    "request_timeout": "The form did not arrive in time ({detail}): nothing was done. Try again.",
    "headers_too_large": "The request's headers (cookies included) are too large "
    "({detail}): nothing was done. Clear this site's cookies and sign in again.",
    "method_not_allowed": "This address does not take that kind of request.",
    "not_found": "The console has no page at this address.",
}


def _problem_message(problem: Mapping[str, Any]) -> str:
    code = str(problem.get("code", ""))
    detail = str(problem.get("detail") or problem.get("title") or "error")
    if code in _PROBLEM_MESSAGES:
        return _PROBLEM_MESSAGES[code].format(detail=detail)
    if code == "invalid_request":
        return "The form or the address holds a value the console cannot use: nothing was done."
    return detail


async def problem_page(
    request: Request, problem: Mapping[str, Any], headers: Mapping[str, str] | None
) -> Response:
    """An API-layer problem under ``/ui`` as the console's HTML error page.

    The API's exception handlers and request guards call this for every path under
    ``/ui`` (wired by ``app.api.app.create_app``): a browser never gets JSON. ``problem``
    is the RFC 9457 body (``status``, ``title``, ``detail``, ``code``, ``errors``…);
    ``headers`` (``Retry-After``, ``Connection: close``) are kept. The page is
    ``error.html`` in the console's layout with the status of the problem, its message
    in ``role=alert``, each ``errors`` item listed, and a link back. The signed-in user's
    nav shows for a 4xx when the session can be read; a 5xx (the database may be the
    cause) or an unreadable session renders without it.
    """
    status = int(problem.get("status") or 500)
    session: ConsoleSession | None = None
    if status < 500:
        try:
            session = await sessions.load_session(request)
        except Exception:  # noqa: BLE001 - not configured, database down: a page without nav
            session = None
    items = problem.get("errors")
    listed = [
        (str(e.get("path", "")), str(e.get("message", "")))
        for e in (items if isinstance(items, list) else [])
        if isinstance(e, dict)
    ]
    response = await render(
        request,
        "error.html",
        {
            "title": str(problem.get("title") or "Error"),
            "message": _problem_message(problem),
            "code": str(problem.get("code") or ""),
            "errors": listed,
        },
        session=session,
        status_code=status,
        show_flash=False,
    )
    # The console's security headers too: a 500 is sent outside every middleware.
    for name, value in {**page_headers(), **(headers or {})}.items():
        response.headers[name] = value
    return response


EXCEPTION_HANDLERS = {
    TreadleAPIError: _api_error,
    sessions.NotSignedIn: _not_signed_in,
    CsrfRejected: _csrf_rejected,
    CrossOriginRefused: _cross_origin,
    FormFieldTooLong: _field_too_long,
    sessions.ConsoleDisabled: _disabled,
}
"""Installed on the app by :func:`app.console.mount`."""
