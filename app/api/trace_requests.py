"""ASGI middleware: the SERVER span of ``POST /runs`` (docs/operations.md#traces).

Installed by ``create_app`` only when tracing is on (:data:`app.core.tracing.ENABLED`),
so a process that does not trace pays nothing per request. It wraps the whole request
(authentication, body checks, the problem response of an error), so the span carries
the status the client saw. Only run submission is traced: it is where a run's trace
begins (its context is stored with the run); other routes are not spanned.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core import tracing

TRACED: frozenset[tuple[str, str]] = frozenset({("POST", "/runs")})
"""``(method, route)`` pairs that get a span (routes without path parameters)."""


class TraceRequests:
    """ASGI middleware: a span per request of a :data:`TRACED` route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in TRACED:
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", [])
            if name in (b"traceparent", b"tracestate", b"user-agent")
        }
        attributes: dict[str, str | int] = {
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        server = scope.get("server")
        if server:
            attributes["server.address"] = server[0]
            if server[1] is not None:
                attributes["server.port"] = int(server[1])
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        if "user-agent" in headers:
            attributes["user_agent.original"] = headers["user-agent"][:256]
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with tracing.request_span(scope["method"], scope["path"], headers, attributes) as span:
            try:
                await self.app(scope, receive, capture)
            finally:
                tracing.set_status_code(span, status)
