"""The console's API client: ``app.client`` over ``httpx.ASGITransport`` of the same app.

Every console read and action is an HTTP request to the public API, made in-process with
the signed-in user's own bearer token, so tenant scoping, scopes, groups, N-of-M and
no-self-approval are exactly the API's (docs/adr/0017-console-architecture.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.types import ASGIApp

from app.client import AsyncTreadleClient

# Never resolved: the transport hands requests straight to the ASGI app.
INTERNAL_BASE_URL = "http://treadle-console.internal"
USER_AGENT = "treadle-console"


@contextlib.asynccontextmanager
async def in_process_client(
    app: ASGIApp, token: str, *, request_id: str | None = None
) -> AsyncIterator[AsyncTreadleClient]:
    """Yield an :class:`AsyncTreadleClient` calling ``app`` with ``Bearer token``.

    Retries are off (``max_retries=0``): a 429/503 is shown to the user, not slept on
    inside their page load. An error the API did not handle reaches the console as the
    API's own 500 answer (already logged there), so the page shows the console's error
    page instead of the exception escaping the page request and uvicorn dropping the
    browser's connection. ``request_id`` is forwarded as ``X-Request-ID`` so the API's
    log records of the inner calls share the page request's id.
    """
    headers = {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}
    if request_id:
        headers["X-Request-ID"] = request_id
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url=INTERNAL_BASE_URL,
        headers=headers,
        timeout=30.0,
    )
    try:
        yield AsyncTreadleClient(INTERNAL_BASE_URL, http_client=http, max_retries=0)
    finally:
        await http.aclose()
