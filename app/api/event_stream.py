"""``GET /runs/{run_id}/events?follow=true``: a run's timeline as Server-Sent Events.

Framing is FastAPI's own (``fastapi.sse.format_sse_event``, the encoder behind its
``EventSourceResponse``); this module decides what to send and when:

- each event is one message: ``id:`` its ``event_id``, ``event:`` its kind, ``data:`` the
  JSON of the view ``GET /runs/{run_id}/events`` pages (ASCII, one line);
- a stream ends with one last ``event: end`` message (no ``id:``, data ``{"run_id",
  "cause", "status", "reason", "last_event_id"}``), then closes. ``cause``
  (:class:`~app.core.status.StreamEnd`) is ``run_ended`` once the run is terminal and
  every event was sent, ``run_gone`` once it was archived or deleted, and
  ``credential_expired`` / ``credential_revoked`` / ``tenant_suspended`` once the
  credential that opened the stream is no longer accepted (re-checked while the stream
  is open, :mod:`app.auth.credential_watch`); ``status`` and ``reason`` are the run's as
  last read. A stream closed without ``end`` (server shutdown, a dropped connection) is
  resumed with ``Last-Event-ID``;
- an idle stream sends a comment line every ``TREADLE_EVENT_STREAM_HEARTBEAT_SECONDS``.

The stream polls: one primary-key read of the run with its highest event id (one index
entry), then the new events only when there are some, backing off from 20 ms to
``TREADLE_EVENT_STREAM_POLL_SECONDS`` while nothing happens. Why polling and not
LISTEN/NOTIFY: docs/adr/0028-live-event-streams.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncGenerator

import anyio
from fastapi import FastAPI
from fastapi.sse import EventSourceResponse, format_sse_event
from starlette.types import Receive, Scope, Send

from app.api.views import event_view
from app.auth.credential_watch import CredentialWatch
from app.core import json
from app.core.errors import BadRequest, TooManyRequests
from app.core.settings import Settings
from app.core.status import RunReason, RunStatus, StreamEnd
from app.db.database import Database
from app.db.queries import events as events_q

PAGE = 500
"""Events read per query while catching up."""

RETRY_MS = 1000
"""The ``retry:`` hint of the first message: how soon an ``EventSource`` reconnects."""

MAX_EVENT_ID = 2**63 - 1


def parse_last_event_id(value: str) -> int:
    """The event id of a ``Last-Event-ID`` header.

    Raises:
        BadRequest: not a decimal integer within 0..2^63-1 (``event_id`` is a BIGINT).
    """
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_EVENT_ID:
        raise BadRequest(
            "Last-Event-ID must be an event id: a decimal integer within 0..2^63-1",
            header="Last-Event-ID",
        )
    return int(text)


class EventStreams:
    """The open streams of one API process: the per-tenant bound and the shutdown switch.

    Args:
        limit: ``TREADLE_EVENT_STREAM_MAX_PER_TENANT``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()
        self.closing = asyncio.Event()

    def acquire(self, tenant_id: str) -> None:
        """Count one more open stream for ``tenant_id``.

        Raises:
            TooManyRequests: the tenant holds ``limit`` streams on this process (429 with
                ``Retry-After``).
        """
        with self._lock:
            held = self._open.get(tenant_id, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"tenant holds {held} open event streams on this server, "
                    f"TREADLE_EVENT_STREAM_MAX_PER_TENANT={self.limit}",
                    limit=self.limit,
                    retry_after_seconds=5,
                )
            self._open[tenant_id] = held + 1

    def release(self, tenant_id: str) -> None:
        """Count one stream of ``tenant_id`` closed."""
        with self._lock:
            left = self._open.get(tenant_id, 0) - 1
            if left > 0:
                self._open[tenant_id] = left
            else:
                self._open.pop(tenant_id, None)

    def open_count(self, tenant_id: str) -> int:
        """Streams ``tenant_id`` holds now."""
        with self._lock:
            return self._open.get(tenant_id, 0)

    def close(self) -> None:
        """Server shutdown: every stream sends a last comment and ends (clients resume)."""
        self.closing.set()


def streams_of(app: FastAPI, settings: Settings) -> EventStreams:
    """The app's :class:`EventStreams`, made on first use."""
    found: EventStreams | None = getattr(app.state, "event_streams", None)
    if found is None:
        found = EventStreams(settings.event_stream_max_per_tenant)
        app.state.event_streams = found
    return found


def close_streams(app: object) -> None:
    """End the open streams of ``app`` (called when the server begins to shut down)."""
    state = getattr(app, "state", None)
    found = getattr(state, "event_streams", None)
    if isinstance(found, EventStreams):
        found.close()


class EventStreamResponse(EventSourceResponse):
    """``text/event-stream`` that stops as soon as the client disconnects.

    Starlette stops a streaming response on disconnect only when its next write fails (on
    ASGI 2.4 servers) or by listening for ``http.disconnect`` (earlier ones); this always
    listens, so a stream waiting between polls ends at once. It also gives the stream's
    slot back and closes the generator however the response ends, so a stream left
    suspended at a ``yield`` by a disconnect never runs (nor reads the database) again.
    """

    def __init__(
        self, content: AsyncGenerator[bytes, None], streams: EventStreams, tenant_id: str
    ) -> None:
        """Stream ``content``; ``streams`` already counts it for ``tenant_id``."""
        self._content = content
        super().__init__(
            content,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._streams = streams
        self._tenant_id = tenant_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the stream until it ends or the client goes away."""
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self._streams.release(self._tenant_id)
            await self._content.aclose()


def _end(
    run_id: uuid.UUID, cause: StreamEnd, status: str | None, reason: str | None, cursor: int
) -> bytes:
    body = {
        "run_id": str(run_id),
        "cause": cause.value,
        "status": status,
        "reason": reason,
        "last_event_id": cursor,
    }
    return format_sse_event(event="end", data_str=json.dumps(body))


async def follow(
    db: Database,
    streams: EventStreams,
    settings: Settings,
    watch: CredentialWatch,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    after: int,
) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of a run's events after ``after``, until the run is done.

    ``tenant_id`` is the run's own tenant (the loaded run's). ``watch`` is the credential
    the stream was opened with: it is re-checked before every read of the database, and
    once it lapses the stream sends its ``end`` message with the lapse's cause and
    returns, reading nothing more (docs/adr/0051-long-lived-responses-recheck-their-credential.md).
    """
    heartbeat = settings.event_stream_heartbeat_seconds
    longest = settings.event_stream_poll_seconds
    cursor = after
    pause = 0.02
    last_sent = time.monotonic()
    status: str | None = None
    reason: str | None = None
    # First bytes at once: the client sees 200 and the headers without waiting for news.
    yield format_sse_event(comment=f"events of run {run_id} after {cursor}", retry=RETRY_MS)
    while not streams.closing.is_set():
        lapse = await watch.lapsed()
        if lapse is not None:
            yield _end(run_id, lapse.cause, status, reason, cursor)
            return
        async with db.read() as conn:
            position = await events_q.follow_position(conn, tenant_id, run_id)
        if position is None:  # archived or deleted meanwhile: nothing more will come
            yield _end(run_id, StreamEnd.RUN_GONE, "gone", None, cursor)
            return
        status, reason, top = position
        redacted = reason == RunReason.FAILURE_AUTHORIZATION.value
        more = False
        if top is not None and top > cursor:
            async with db.read() as conn:
                rows = await events_q.list_events(
                    conn, tenant_id, run_id, after_id=cursor, limit=PAGE
                )
            for row in rows:
                view = event_view(row, redacted)
                yield format_sse_event(
                    id=str(view.event_id),
                    event=view.kind,
                    data_str=json.dumps(view.model_dump(mode="json")),
                )
                cursor = view.event_id
            more = len(rows) == PAGE
            if rows:
                last_sent = time.monotonic()
                pause = 0.02
        if more:
            continue
        if RunStatus(status).is_terminal:
            # The status was read before the events: every event up to it was sent.
            yield _end(run_id, StreamEnd.RUN_ENDED, status, reason, cursor)
            return
        idle = time.monotonic() - last_sent
        if idle >= heartbeat:
            yield b": heartbeat\n\n"
            last_sent = time.monotonic()
            idle = 0.0
        # Wake for the next poll, the next heartbeat or the credential's next check
        # (its expiry timer among them), whichever comes first.
        wait = min(pause, heartbeat - idle, watch.seconds_left())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(streams.closing.wait(), wait)
        pause = min(pause * 1.5, longest)
    yield format_sse_event(comment="server shutting down: resume with Last-Event-ID")
