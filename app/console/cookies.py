"""The console's three cookies, named and scoped by the request's scheme.

Cookies do not separate by port, and a sibling subdomain may set one for the parent
domain: a page served elsewhere on the same host or domain can plant a cookie the console
then reads (cookie tossing), such as its own session id or a sign-in form's token. On
https every console cookie therefore carries the ``__Host-`` prefix (RFC 6265bis
section 4.1.3.2): a browser keeps such a cookie only when it was set by a secure origin,
with ``Secure``, ``Path=/`` and no ``Domain``, so neither a sibling subdomain nor a
plain-http page of the same host can set one, and the console reads no other name there.
On plain http no prefix helps (docs/console.md says why the console leaves a laptop only
behind https); the cookies keep their bare names and narrow paths.

"https" is the request's scheme as uvicorn reports it: TLS served by ``treadle serve``
itself (``TREADLE_SSL_CERTFILE``) or ``X-Forwarded-Proto: https`` from a proxy in
``TREADLE_FORWARDED_ALLOW_IPS`` (docs/deployment.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection
from starlette.responses import Response

HOST_PREFIX = "__Host-"


@dataclass(frozen=True, slots=True)
class ConsoleCookie:
    """One console cookie: its bare name and its path on plain http.

    Attributes:
        name: the name on http; on https it is ``__Host-`` + this, with ``Path=/``.
        http_path: the path on http (narrowest path that reads it).
    """

    name: str
    http_path: str

    def name_for(self, request: HTTPConnection) -> str:
        """The cookie's name for this request's scheme."""
        return HOST_PREFIX + self.name if is_https(request) else self.name

    def read(self, request: HTTPConnection) -> str | None:
        """The cookie's value on ``request`` (only the name of its scheme), or None."""
        return request.cookies.get(self.name_for(request)) or None

    def set(self, request: HTTPConnection, response: Response, value: str, *, max_age: int) -> None:
        """Set the cookie on ``response``: HttpOnly, SameSite=Lax, ``max_age`` seconds.

        On https: ``__Host-`` name, ``Secure``, ``Path=/``; on http: the bare name and path.
        """
        https = is_https(request)
        response.set_cookie(
            self.name_for(request),
            value,
            max_age=max_age,
            path="/" if https else self.http_path,
            secure=https,
            httponly=True,
            # Lax: a top-level GET from another site (the identity provider's redirect
            # back, a link to a run) carries it; a cross-site POST does not.
            samesite="lax",
        )

    def clear(self, request: HTTPConnection, response: Response) -> None:
        """Expire the cookie in the browser (same name, path and flags as it was set)."""
        https = is_https(request)
        response.delete_cookie(
            self.name_for(request),
            path="/" if https else self.http_path,
            secure=https,
            httponly=True,
            samesite="lax",
        )


def is_https(request: HTTPConnection) -> bool:
    """Whether the browser reached the console over https (as uvicorn reports the scheme)."""
    return request.url.scheme in ("https", "wss")


# The third, the OIDC sign-in's state, is app.console.oidc_pages.STATE (its name is
# app.auth.oidc's).
SESSION = ConsoleCookie("treadle_console", "/ui")
"""The session id (``app.console.sessions``)."""
LOGIN = ConsoleCookie("treadle_console_login", "/ui/login")
"""The sign-in form's nonce (``app.console.auth_pages``)."""
