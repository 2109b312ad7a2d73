"""Refusing console forms sent from another origin (login CSRF included).

A session's CSRF token stops another site from acting *in* a signed-in session; it cannot
protect the sign-in itself, which has no session yet, and a cookie planted by a sibling
origin (another port of the host, a sibling subdomain: cookies separate by neither) can
stand in for any cookie-bound token. What the browser says about where a request comes
from cannot be planted: every POST under ``/ui`` passes :func:`same_origin` first, as Go's
``net/http.CrossOriginProtection`` decides:

1. ``Sec-Fetch-Site`` (Fetch Metadata, sent by every current browser): ``same-origin``
   or ``none`` (the user's own navigation) passes; ``same-site`` (a sibling port or
   subdomain) and ``cross-site`` are refused.
2. Without it, ``Origin``: it must name this request's host and port (``Host``); a
   different one, or ``null``, is refused.
3. Neither header: not a browser's form (curl, a script holding its own token): passes,
   it can carry no victim's cookies anyway.

The OIDC callback is a GET the identity provider redirects to; :func:`callback_from_elsewhere`
is its check (app.console.oidc_pages).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from fastapi import Request

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CrossOriginRefused(Exception):
    """A console form came from another origin: a 403 page, nothing done.

    ``source`` says how it was known (``Sec-Fetch-Site: same-site``, ``Origin: …``).
    """

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


async def same_origin(request: Request) -> None:
    """FastAPI dependency of every console route: refuse an unsafe request from elsewhere.

    Runs before the route's own dependencies (session, CSRF form), so nothing of the
    request is acted on or read first.

    Raises:
        CrossOriginRefused: the browser says the request comes from another origin.
    """
    if request.method in SAFE_METHODS:
        return
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site.lower() in ("same-origin", "none"):
            return
        raise CrossOriginRefused(f"Sec-Fetch-Site: {site}")
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "").lower()
    if origin == "null" or not host or urlsplit(origin).netloc.lower() != host:
        raise CrossOriginRefused(f"Origin: {origin}")


def _surely_other_site(a: str, b: str) -> bool:
    # Whether hosts a and b are on different sites, without the public-suffix list: two
    # different IP addresses are; two names are when their last two labels differ (a
    # registrable domain has at least two). Otherwise they may be one site: not sure.
    if _is_ip(a) or _is_ip(b):
        return a != b  # an address is a site of its own
    return a.split(".")[-2:] != b.split(".")[-2:]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def callback_from_elsewhere(request: Request, provider_url: str) -> str | None:
    """Why an OIDC callback request cannot be the provider's redirect, or None.

    A real callback is the provider's redirect, so its ``Sec-Fetch-Site`` is
    ``cross-site`` (or ``same-site`` when the provider shares the console's site). A
    ``same-site`` navigation while the provider (``provider_url``, its authorization
    endpoint or issuer) is surely on another site comes from a sibling page of the
    console's own site: a login CSRF carrying the attacker's code and planted state
    cookie. Over https the ``__Host-`` state cookie stops that already.
    """
    site = (request.headers.get("sec-fetch-site") or "").lower()
    if site != "same-site":
        return None
    ours = request.url.hostname or ""
    theirs = urlsplit(provider_url).hostname or ""
    if theirs and _surely_other_site(ours.lower(), theirs.lower()):
        return (
            "the answer was opened from another page of this site, not by the identity "
            "provider; start the sign-in again from the console"
        )
    return None
