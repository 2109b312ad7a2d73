"""The HTTP server of ``treadle serve`` and ``treadle dev``: uvicorn on h11, reads bounded.

uvicorn bounds only the idle time *between* requests (``timeout_keep_alive``, cancelled by
the first byte of the next request): a client that opens a connection and sends a byte
every few seconds, or never finishes its headers, holds the connection forever
(slowloris). :class:`BoundedH11Protocol` adds what Go's ``ReadHeaderTimeout`` and nginx's
``client_header_timeout`` give: a request head must be complete within
``TREADLE_HEADER_READ_TIMEOUT_SECONDS`` of its first byte (or of the connection opening),
and a body within ``TREADLE_BODY_READ_TIMEOUT_SECONDS`` of its head. The app answers a
slow body with ``408`` itself (:class:`app.api.request_guards.RequestGuards`); this layer
answers a slow head (the app never saw that request) and closes a connection whose body
still trickles in after its response.

It subclasses uvicorn's own h11 protocol (pinned by ``uv.lock``) and uses its per-request
state (``cycle``); ``tests/acceptance/test_slow_clients.py`` checks it over real sockets.
Why here and not in uvicorn options: docs/adr/0013-http-edge-read-bounds-and-strict-json.md.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.api.event_stream import close_streams
from app.core import json
from app.core.settings import Settings


class ReadPhase(StrEnum):
    """What part of a request the connection is waiting for under a deadline."""

    HEAD = "head"
    BODY = "body"


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request's head and body.

    Subclass with :func:`bounded_h11` to set the two bounds (seconds); the server builds
    one protocol per connection and passes only uvicorn's own arguments.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build the protocol for one connection (uvicorn's arguments)."""
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._phase: ReadPhase | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection: its first request head is due within the header bound."""
        super().connection_made(transport)
        self._arm(ReadPhase.HEAD)

    def data_received(self, data: bytes) -> None:
        """Feed h11, then move the deadline to the phase the request is in."""
        super().data_received(data)
        self._follow(idle_needs_bytes=False)

    def on_response_complete(self) -> None:
        """A response went out: a pipelined head or an unread body is still bounded."""
        super().on_response_complete()
        self._follow(idle_needs_bytes=True)

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: no deadline left to enforce."""
        self._disarm()
        super().connection_lost(exc)

    def _follow(self, *, idle_needs_bytes: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # Waiting for a head. Between requests uvicorn's keep-alive timer bounds an
            # idle connection; once bytes of a head are in, this deadline does.
            if self._phase is not ReadPhase.HEAD and (
                not idle_needs_bytes or self.conn.trailing_data[0]
            ):
                self._arm(ReadPhase.HEAD)
        elif state is h11.SEND_BODY:
            if self._phase is not ReadPhase.BODY:
                self._arm(ReadPhase.BODY)
        else:  # DONE, MUST_CLOSE, CLOSED, ERROR, SWITCHED_PROTOCOL: nothing more to read
            self._disarm()

    def _arm(self, phase: ReadPhase) -> None:
        self._disarm()
        seconds = self.header_timeout if phase is ReadPhase.HEAD else self.body_timeout
        self._phase = phase
        self._read_timer = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None
        self._phase = None

    def _expired(self, phase: ReadPhase) -> None:
        self._read_timer = None
        self._phase = None
        if self.transport.is_closing():
            return
        if phase is ReadPhase.HEAD:
            if self.conn.trailing_data[0]:
                # Part of a head arrived: say why before closing (RFC 9110 §15.5.9). h11
                # cannot send a response to a request it has not parsed: write it raw.
                self.transport.write(_head_timeout_response(self.header_timeout))
            self.transport.close()  # nothing arrived at all: just close
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            # Answered already (the route did not read the body), still trickling: close.
            self.transport.close()
        else:
            # The app is on it (RequestGuards answers 408 at the same bound): close the
            # connection once that response is out instead of reading on.
            cycle.keep_alive = False


def _head_timeout_response(seconds: float) -> bytes:
    body = json.dumps(
        {
            "type": "urn:treadle:problem:request_timeout",
            "title": "Request Timeout",
            "status": 408,
            "detail": f"request headers not received within {seconds:g} s",
            "code": "request_timeout",
            "timeout_seconds": seconds,
        }
    ).encode("ascii")
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class TreadleServer(uvicorn.Server):
    """uvicorn's server, ending the app's open event streams when it begins to shut down.

    uvicorn's graceful shutdown waits for open responses to finish; an SSE stream
    (``GET /runs/{run_id}/events?follow=true``) would never finish on its own and hold
    the shutdown for ``timeout_graceful_shutdown``. Each stream sends a last comment and
    ends instead; its client resumes with ``Last-Event-ID`` on another server.
    """

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        """End the event streams, then shut down as uvicorn does."""
        close_streams(self.config.app)
        await super().shutdown(sockets=sockets)


def bounded_h11(header_seconds: float, body_seconds: float) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` class with these bounds (seconds, > 0)."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {"header_timeout": header_seconds, "body_timeout": body_seconds},
    )


def server_config(
    app: Any, settings: Settings, *, graceful_shutdown_seconds: int
) -> uvicorn.Config:
    """The uvicorn configuration shared by ``treadle serve`` and ``treadle dev``.

    h11, not httptools: httptools buffers headers without a limit (a 20 MB header was
    accepted), while h11 refuses a request line plus headers over
    ``TREADLE_MAX_HEADER_BYTES`` with 400 before the app runs. Reads are bounded by
    :class:`BoundedH11Protocol`. httptools was measured against these tests and its
    saving weighed in docs/adr/0035-http-parser.md.

    Args:
        app: the ASGI app (``create_app(settings)``).
        settings: host, port, TLS files, trusted proxies and the header size and
            read-time bounds.
        graceful_shutdown_seconds: on SIGTERM, how long open requests (long-polls) get.

    Returns:
        A ``uvicorn.Config``.
    """
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # No logging config of uvicorn's own: its loggers propagate to the one handler
        # app.core.logging installs (JSON when asked), and the access line is the app's
        # (app/api/access_log.py), with the route template and the request id.
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=graceful_shutdown_seconds,
        http=bounded_h11(settings.header_read_timeout_seconds, settings.body_read_timeout_seconds),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # https served here (TREADLE_SSL_CERTFILE/KEYFILE): the request's scheme is https.
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        # TLS ended by a proxy: uvicorn's ProxyHeadersMiddleware takes the scheme and the
        # client address from X-Forwarded-Proto / X-Forwarded-For, from these peers only
        # (TREADLE_FORWARDED_ALLOW_IPS; never uvicorn's FORWARDED_ALLOW_IPS variable, so
        # one setting decides). The console's Secure and __Host- cookies follow the scheme.
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
