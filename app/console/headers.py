"""ASGI middleware: security headers on every console response (``/ui…``)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Only the console's own scripts, styles and forms; never framed (clickjacking on the
# Approve button); pages hold a tenant's data, so no shared cache keeps them.
_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]
_NO_STORE = (b"cache-control", b"no-store")


def page_headers() -> dict[str, str]:
    """The headers of a console page, for a response sent where this middleware is not.

    Starlette answers an unexpected exception (500) outside every middleware, so
    ``app.console.web.problem_page`` sets them itself; the middleware does not add a
    header the response already has.
    """
    return {name.decode(): value.decode() for name, value in [*_HEADERS, _NO_STORE]}


class ConsoleHeaders:
    """Add CSP, nosniff, frame and referrer headers (and ``no-store`` on pages) under ``/ui``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/ui" or path.startswith("/ui/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith("/ui/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                wanted = _HEADERS if static else [*_HEADERS, _NO_STORE]
                headers.extend(h for h in wanted if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
