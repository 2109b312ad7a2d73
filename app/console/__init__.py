r"""Treadle's console: server-rendered pages for operators and approvers under ``/ui``.

Every read and action goes through the public HTTP API, in-process, with the signed-in
user's own token (docs/console.md, docs/adr/0017-console-architecture.md); this package
never decides anything the API decides. It may import FastAPI, Jinja2, ``app.client`` and
``app.db.queries.console_sessions`` (its own session store), never ``app.engine``.

How a page module plugs in (the whole interface):

1. **Routes.** A module ``app/console/<name>_page.py`` defines ``router = APIRouter()``
   with paths relative to ``/ui`` (``@router.get("/dead-letters")``) and is listed in
   :data:`app.console.pages.ROUTERS`. :func:`mount` includes them under ``/ui``, outside
   the OpenAPI document.
2. **Session.** A parameter ``session: Session`` (:data:`app.console.sessions.Session`)
   makes the page need a signed-in user; without one the browser is redirected to
   ``/ui/login?next=<page>``.
3. **API client.** A parameter ``api: Client`` (:data:`app.console.web.Client`) is an
   :class:`app.client.AsyncTreadleClient` bound to the user's token (it implies the
   session). Call the API with it (``await api.get(run_id)``, ``await api.request("GET",
   "/schedules")`` for anything without a method). A :class:`app.client.TreadleAPIError`
   a page lets escape becomes an error page showing the API's ``detail`` with the API's
   status (a 401 ends the session and goes to sign-in); catch it around an *action* to
   show the refusal on the page instead.
4. **Templates.** ``return await render(request, "page.html", {...}, session=session)``
   (:func:`app.console.web.render`). Templates extend ``base.html`` and fill ``{% block
   title %}`` and ``{% block content %}``, with exactly one ``<h1>``. Autoescaping is on,
   and invisible characters print as ``\uXXXX``; filters: ``pretty_json``, ``urlseg``
   (one URL path segment). Macros in ``_macros.html``: ``csrf()`` (the hidden field),
   ``json_details(summary, value, redacted)``, ``status_badge(status)``, ``when(dt)``.
5. **Actions.** A POST route takes ``form: CsrfForm`` (:data:`app.console.web.CsrfForm`):
   the form, once its ``csrf_token`` matched the session's (otherwise a 403 page and
   nothing done). Confirmation is a step: the first POST without ``confirm=yes`` renders
   ``confirm.html`` (``{"title", "message", "action", "fields", "button"}``) whose form
   re-posts the same fields with ``confirm=yes``; only that second POST acts. Before
   any of that, every POST under ``/ui`` must come from the console's own origin
   (:func:`app.console.origin.same_origin`, added by :func:`mount`: a 403 page).
6. **Messages.** ``await flash(request, session, "status" | "alert", text)``
   (:func:`app.console.sessions.flash`) then ``return redirect(url)`` (303): the next full
   page shows it in ``<div role="status">`` or ``<div role="alert">``. A page rendered
   directly passes ``{"flash": ("alert", text)}`` in its context.
7. **Live refresh.** An element ``<div data-refresh="/ui/…/fragment" data-refresh-seconds
   ="3">`` has its content replaced every few seconds by the HTML the URL returns
   (``static/console.js``; render fragments with ``show_flash=False``). Those requests
   carry ``X-Console-Fragment: 1`` and do not count as session activity.
8. **Other sign-ins** (OIDC, :mod:`app.console.oidc_pages`): with
   ``app.state.oidc_sign_in`` set (``TREADLE_OIDC_CLIENT_ID``), the sign-in page links
   "Sign in with <name>" to ``/ui/login/oidc``; the callback, once it holds a token, calls
   ``await app.console.sessions.start_session(request, response, token)``, which checks
   the token with the API and sets the session cookie on ``response``.

HTTP-level tests drive all of this with a cookie-keeping client (``tests/console``):
``GET /ui/login``, POST the token with the page's ``login_csrf``, then read
``csrf_token`` from any page's sign-out form. Cookies are named by the scheme
(:mod:`app.console.cookies`: ``__Host-`` on https).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Depends, FastAPI, Request, params
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from app.console.headers import ConsoleHeaders
from app.console.origin import same_origin
from app.console.pages import ROUTERS
from app.console.sessions import load_session
from app.console.web import EXCEPTION_HANDLERS, STATIC_DIR, problem_page, render

__all__ = ["PREFIX", "mount", "problem_page"]

PREFIX = "/ui"
"""Where the console lives; errors under it are HTML pages (:func:`problem_page`)."""


def mount(app: FastAPI, *, dependencies: Sequence[params.Depends] = ()) -> None:
    """Serve the console on ``app``: ``/ui/…`` pages, ``/ui/static``, and ``/`` → ``/ui/``.

    Called by :func:`app.api.app.create_app`; the pages are not in the OpenAPI document.
    ``dependencies`` run before every page: ``create_app`` passes the API's refusal of
    a one-value query parameter given twice (``app.api.query_params``), so a page's
    parameters (:mod:`app.console.query`) follow the API's rules without this package
    importing the API's internals.
    The API's problems under :data:`PREFIX` (validation errors, HTTP errors, the request
    guards' refusals) become :func:`problem_page` because ``create_app`` registers it
    for the prefix (``app.api.problems.ProblemPages``): this package never imports the
    API's internals.
    """
    root = APIRouter(include_in_schema=False)

    @root.get("/")
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    @root.get("/ui")
    @root.get("/ui/")
    async def console_home() -> RedirectResponse:
        return RedirectResponse("/ui/runs", status_code=307)

    app.include_router(root)
    # Static files first: the catch-all page below must not shadow them.
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    for router in ROUTERS:
        # same_origin first: a form from another origin is refused before its session,
        # CSRF token or fields are read (app.console.origin).
        app.include_router(
            router,
            prefix=PREFIX,
            include_in_schema=False,
            dependencies=[Depends(same_origin), *dependencies],
        )

    @app.get("/ui/{rest:path}", include_in_schema=False)
    async def no_such_page(request: Request, rest: str) -> Response:
        # Last of the console's routes: an unknown /ui path is an HTML page, not JSON.
        return await render(
            request,
            "error.html",
            {
                "title": "No such page",
                "message": "The console has no page at this address.",
                "code": "not_found",
            },
            session=await load_session(request),
            status_code=404,
        )

    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.add_middleware(ConsoleHeaders)
