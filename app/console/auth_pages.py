"""Sign-in (``/ui/login``) and sign-out (``/ui/logout``) of the console."""

from __future__ import annotations

import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from app.client import TreadleAPIError
from app.console import cookies, crypto, sessions
from app.console.sessions import Session
from app.console.web import CsrfForm, api_message, confirm_page, redirect, render, safe_next

router = APIRouter()

# Sign-in has no session yet. Its form is protected against login CSRF (another page
# signing the browser in under the attacker's token) three ways: the POST must come from
# this origin (app.console.origin, before anything else); the form's token is the
# server's HMAC of the nonce in the login cookie (crypto.login_token), so a planted nonce
# has no token to go with it; and on https that cookie is __Host- (app.console.cookies),
# which no sibling origin can plant at all.
LOGIN_TTL_SECONDS = 3600
"""How long a sign-in form stays valid (s): its cookie's lifetime and the token's."""


async def login_page(
    request: Request,
    *,
    next_url: str,
    error: str | None = None,
    notice: str | None = None,
    status_code: int = 200,
) -> Response:
    """The sign-in page with a fresh signed form token (nonce cookie and hidden field).

    ``error`` shows in ``role=alert``, ``notice`` in ``role=status``.

    Raises:
        ConsoleDisabled: no session secret is configured (the token is signed with it).
    """
    config = sessions.get_config(request)
    assert config.secret is not None  # get_config raised otherwise
    nonce = secrets.token_urlsafe(32)
    login_csrf = crypto.login_token(nonce, secret=config.secret, issued=int(time.time()))
    flash = ("alert", error) if error else (("status", notice) if notice else None)
    response = await render(
        request,
        "login.html",
        {"next": next_url, "login_csrf": login_csrf, "flash": flash, "oidc": _oidc(request)},
        status_code=status_code,
    )
    cookies.LOGIN.set(request, response, nonce, max_age=LOGIN_TTL_SECONDS)
    return response


def _oidc(request: Request) -> str | None:
    # The identity provider's display name when OIDC sign-in is configured
    # (app.state.oidc_sign_in, driven by app.console.oidc_pages).
    found = getattr(request.app.state, "oidc_sign_in", None)
    return str(found.provider_name) if found is not None else None


@router.get("/login")
async def login_form(
    request: Request, next: str | None = None, expired: str | None = None
) -> Response:
    """The sign-in form: paste an API key or a token once."""
    sessions.get_config(request)  # 503 page when the console is not configured
    notice = "Your session ended: sign in again." if expired else None
    return await login_page(request, next_url=safe_next(next), notice=notice)


@router.post("/login")
async def login(
    request: Request,
    # No length limits here: a field refused by FastAPI would be an error page without
    # the form. Each is judged below and answered with the form and a message: an
    # over-long token by start_session (400), a long login_csrf fails the comparison
    # (403), a long next falls back to the runs page (safe_next). The request guards
    # bound the body as a whole.
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "",
    login_csrf: Annotated[str, Form()] = "",
) -> Response:
    """Check the token with the API; on success start a session and go to ``next``.

    A refused token shows the form again with the message, at the refusal's status: 400
    for text that is no token (empty, over 16,384 characters, not printable), 401 for a
    token the API refuses, 403 for a suspended tenant.
    """
    config = sessions.get_config(request)
    assert config.secret is not None
    target = safe_next(next)
    nonce = cookies.LOGIN.read(request) or ""
    if not crypto.login_token_valid(
        login_csrf, nonce, secret=config.secret, now=int(time.time()), ttl=LOGIN_TTL_SECONDS
    ):
        return await login_page(
            request,
            next_url=target,
            error="This sign-in form expired or came from another site: nothing was done. "
            "Sign in again.",
            status_code=403,
        )
    response = redirect(target)
    try:
        await sessions.start_session(request, response, token)
    except TreadleAPIError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        status = exc.status if 400 <= exc.status < 500 else 401
        return await login_page(
            request, next_url=target, error=api_message(exc), status_code=status
        )
    cookies.LOGIN.clear(request, response)
    return response


@router.get("/logout")
async def logout_page(request: Request) -> Response:
    """``/ui/logout`` opened as a page: a **Sign out** button, or the sign-in page.

    Signed in: the confirmation page whose button posts the sign-out (a GET never ends a
    session, so a link or an image elsewhere cannot sign anyone out). Not signed in: a
    303 to ``/ui/login``.
    """
    session = await sessions.load_session(request)
    if session is None:
        return redirect("/ui/login")
    return await confirm_page(
        request,
        session,
        {
            "title": "Sign out?",
            "message": f"Sign out {session.subject} · {session.tenant_id}? The session ends "
            "on the server; sign in again to come back.",
            "action": "/ui/logout",
            "fields": [],
            "button": "Sign out",
            "back": "/ui/runs",
            "preview": None,
        },
    )


@router.post("/logout")
async def logout(request: Request, session: Session, form: CsrfForm) -> Response:
    """End the session (its row is deleted: the old cookie is refused from now on)."""
    response = redirect("/ui/login")
    await sessions.end_session(request, session, response)
    return response
