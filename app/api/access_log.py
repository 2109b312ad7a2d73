"""The API's request id and access log: one line per HTTP request, with the route template.

One pure ASGI middleware (no ``BaseHTTPMiddleware``: that one runs the app in another task
and buffers streaming responses) does both: it echoes or mints ``X-Request-ID``, binds it
to every log record of the request (structlog contextvars), and logs the request when it
ends. One layer, not two: both wrap the same ``send`` for the same response start
(docs/adr/0035-http-parser.md, "Middleware"). It replaces uvicorn's own access log,
which knows only the raw path (ids, query strings) and no request id.
Choices: docs/adr/0024-one-log-pipeline-and-an-access-log.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core import metrics

log = structlog.get_logger("treadle.access")

# Probes poll every few seconds forever: their lines would drown the rest at info.
PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})

# Logged when the client went away (or the server stopped) before any response started;
# nginx's code for "client closed request", so it cannot be mistaken for a status we sent.
CLIENT_CLOSED = 499


def route_template(scope: Scope) -> str:
    """The matched route's template (``/runs/{run_id}``), or ``unmatched``.

    Read after the app ran (the router stores the route in the scope). The template,
    never the raw path: it holds no ids or query strings and keeps metric labels and log
    values bounded.
    """
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str) or not path:
        return "unmatched"
    # FastAPI 0.16x leaves the router's own route in the scope, without the prefix it
    # was included under (``/ui`` for the console), so console and API pages sharing a
    # template (``/runs/{run_id}``) would be counted as one; older versions put the
    # prefixed route there. The prefix is what precedes the part of the path the
    # template matches: static text of our own routing, never an id.
    regex = getattr(route, "path_regex", None)
    request_path = scope.get("path", "")
    if regex is None or not isinstance(request_path, str) or regex.match(request_path):
        return path
    parts = request_path.split("/")
    cut = len(parts) - path.count("/")
    if cut <= 1:
        return path
    prefix = "/".join(parts[:cut])
    if regex.match(request_path[len(prefix) :]):
        return prefix + path
    return path


def request_id_of(scope: Scope) -> str:
    """The request's ``X-Request-ID`` if short and printable, else a new random id (hex).

    Only short, printable ids are echoed: a header must not inject anything.
    """
    request_id = ""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            if 0 < len(candidate) <= 128 and candidate.isprintable():
                request_id = candidate
    return request_id or uuid.uuid4().hex


class AccessLog:
    """ASGI middleware: the request id, then one line per request, its count and time.

    ``X-Request-ID`` is echoed on the response (or minted, :func:`request_id_of`) and
    bound as ``request_id`` to every log record of the request, this line's included.

    The line is ``request`` at info (probes at debug); the series are
    ``treadle_http_requests_total`` and ``treadle_http_request_duration_seconds``.

    Fields: ``method``, ``route`` (template), ``status`` (the response's, 500 when the app
    raised before answering, :data:`CLIENT_CLOSED` when it was cancelled before
    answering), ``duration_ms`` (float, to the end of the response body), ``client``
    (the peer's host as uvicorn saw it, after its proxy-header handling) and, from the
    context, ``request_id``. Never headers (tokens), query strings or bodies.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_of(scope)
        id_header = (b"x-request-id", request_id.encode("latin-1"))
        status: int | None = None

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        failed: type[BaseException] | None = None
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, capture)
            except BaseException as exc:
                failed = type(exc)
                raise
            finally:
                self._log(scope, status, failed, time.perf_counter() - started)

    @staticmethod
    def _log(
        scope: Scope, status: int | None, failed: type[BaseException] | None, elapsed: float
    ) -> None:
        route = route_template(scope)
        method = scope.get("method", "GET")
        # The HTTP metrics are this layer's too (one status capture per request); an
        # unanswered request counts as 500 there, as it always has.
        metrics.HTTP_REQUESTS.labels(method, route, str(status or 500)).inc()
        metrics.HTTP_DURATION.labels(method, route).observe(elapsed)
        if status is None:
            status = CLIENT_CLOSED if failed is asyncio.CancelledError else 500
        client = scope.get("client")
        line = log.debug if route in PROBE_ROUTES else log.info
        line(
            "request",
            method=scope.get("method", ""),
            route=route,
            status=status,
            duration_ms=round(elapsed * 1000, 3),
            client=client[0] if client else None,
        )
