"""OpenID Connect sign-in of the console: ``/ui/login/oidc`` and its callback.

The protocol (authorization code with PKCE, state, nonce, id_token checks) is
:class:`app.auth.oidc.OidcSignIn`'s, built by ``create_app`` as ``app.state.oidc_sign_in``
when ``TREADLE_OIDC_CLIENT_ID`` is set (docs/adr/0018-oidc-discovery-and-jwks-refresh-
through-authlib.md). These two routes only drive it: redirect to the provider with a
short-lived encrypted state cookie, then on the way back exchange the code and start a
console session with the token the API accepts, exactly as a pasted token would
(:func:`app.console.sessions.start_session`). Without an identity provider both are 404.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from app.auth.oidc import STATE_COOKIE, STATE_TTL_SECONDS, OidcError, OidcSignIn
from app.client import TreadleAPIError
from app.console import auth_pages, cookies, origin, sessions
from app.console.web import api_message, redirect, safe_next

router = APIRouter()

STATE = cookies.ConsoleCookie(STATE_COOKIE, "/ui/login/oidc")
"""One sign-in's encrypted state (``__Host-treadle_oidc`` on https, app.console.cookies)."""


def provider(request: Request) -> OidcSignIn | None:
    """The configured OIDC sign-in, or None (the login page then shows no link)."""
    found = getattr(request.app.state, "oidc_sign_in", None)
    return found if isinstance(found, OidcSignIn) else None


def _required(request: Request) -> OidcSignIn:
    found = provider(request)
    if found is None:
        raise HTTPException(404, "no identity provider is configured")
    return found


async def _refused(request: Request, message: str) -> Response:
    response = await auth_pages.login_page(
        request,
        next_url="/ui/runs",
        error=f"Sign-in with the identity provider failed: {message}",
        status_code=401,
    )
    STATE.clear(request, response)
    return response


@router.get("/login/oidc")
async def begin(request: Request, next: str | None = None) -> Response:
    """Redirect (303) to the provider's authorization endpoint with a fresh state cookie.

    ``next``: the console page first asked for (a relative ``/ui/…`` path, checked by
    :func:`app.console.web.safe_next`; anything else means Runs). It travels in the
    encrypted state cookie and the callback goes there once signed in.
    """
    oidc = _required(request)
    sessions.get_config(request)  # 503 page when the console has no session secret
    base = str(request.base_url).rstrip("/")
    try:
        url, cookie = await oidc.begin(oidc.redirect_url(base), return_to=safe_next(next))
    except OidcError as exc:
        return await _refused(request, str(exc))
    response = RedirectResponse(url, status_code=303)
    # __Host- on https, so no sibling origin can plant a state of its own (login CSRF).
    STATE.set(request, response, cookie, max_age=STATE_TTL_SECONDS)
    return response


CALLBACK_PARAMETERS = ("state", "code", "error", "error_description")
"""The callback's query parameters read by the sign-in, each refused when given twice."""


@router.get("/login/oidc/callback")
async def callback(request: Request) -> Response:
    """Finish the sign-in: check state and id_token, then start a session.

    The answer is a 303 to the page the sign-in began for (``next`` of the login page),
    else to Runs.

    Any failure (state mismatch or expiry, the provider's error, a bad id_token, a token
    the API refuses, a navigation from a sibling page of this site while the provider
    is elsewhere: :func:`app.console.origin.callback_from_elsewhere`) shows the login
    page with the reason, status 401, and no session.
    """
    oidc = _required(request)
    # The provider sends each of these once (RFC 6749 §4.1.2); a second copy would be read
    # instead of the first, so an answer carrying one is refused rather than guessed at.
    repeated = [n for n in CALLBACK_PARAMETERS if len(request.query_params.getlist(n)) > 1]
    if repeated:
        names = ", ".join(repeated)
        return await _refused(request, f"the answer repeats {names}; start the sign-in again")
    if why := origin.callback_from_elsewhere(request, oidc.issuer):
        return await _refused(request, why)
    try:
        login = await oidc.complete(request.query_params, STATE.read(request))
    except OidcError as exc:
        return await _refused(request, str(exc))
    # Checked again on the way out: the cookie's key is the server's, but a page path
    # is never followed unvalidated.
    response = redirect(safe_next(login.return_to))
    try:
        await sessions.start_session(request, response, login.token)
    except TreadleAPIError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        return await _refused(request, api_message(exc))
    STATE.clear(request, response)  # one sign-in, one cookie
    return response
