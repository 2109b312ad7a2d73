"""Following a run's events (``GET /runs/{run_id}/events?follow=true``): the shared parts.

The server's SSE format (docs/api.md, Live events): one message per event (``id`` the
event id, ``event`` its kind, ``data`` the event's JSON), comment lines as heartbeats,
and a last ``event: end`` message whose data's ``cause`` says why the stream ended:
``run_ended`` (the run is terminal and every event was sent) or ``run_gone`` end the
follow; ``credential_expired``, ``credential_revoked`` and ``tenant_suspended`` (the
token is no longer accepted) raise :class:`TreadleAPIError` with that code, since
reconnecting with the same token would only be refused (:func:`end_error`). A stream
that closes without ``end`` (a dropped connection, a server shutting down) is resumed
with ``Last-Event-ID``; both clients' ``follow_events`` do that here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.client._http import segment
from app.client.errors import TreadleAPIError
from app.core.status import StreamEnd

END = "end"
"""The ``event`` of the stream's last message."""

_LAPSE_STATUS: dict[str, int] = {
    StreamEnd.CREDENTIAL_EXPIRED: 401,
    StreamEnd.CREDENTIAL_REVOKED: 401,
    StreamEnd.TENANT_SUSPENDED: 403,
}
_LAPSE_DETAIL: dict[str, str] = {
    StreamEnd.CREDENTIAL_EXPIRED: "the event stream ended: the token expired",
    StreamEnd.CREDENTIAL_REVOKED: "the event stream ended: the token is no longer accepted",
    StreamEnd.TENANT_SUSPENDED: "the event stream ended: the tenant is suspended",
}

MAX_RECONNECT_WAIT = 5.0


@dataclass
class Message:
    """One SSE message (fields joined as the SSE spec says)."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class Parser:
    """Turns the lines of a ``text/event-stream`` body into :class:`Message` objects."""

    _event: str | None = None
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> Message | None:
        """Take one line (without its line break); return a message an empty line ends."""
        if line == "":
            if not self._data and self._event is None and self._id is None:
                return None
            msg = Message(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = None, [], None
            return msg
        if line.startswith(":"):
            return None  # a comment: heartbeats
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self._id = value
        return None


def follow_path(run_id: str | uuid.UUID) -> str:
    """The path of a run's event stream."""
    return f"/runs/{segment(run_id)}/events"


def follow_headers(cursor: int | None) -> dict[str, str]:
    """Request headers: SSE, and ``Last-Event-ID`` to resume after ``cursor``."""
    headers = {"Accept": "text/event-stream"}
    if cursor is not None:
        headers["Last-Event-ID"] = str(cursor)
    return headers


def reconnect_wait(failures: int) -> float:
    """Seconds before reconnect number ``failures`` (1-based): 0.25 s doubling, 5 s at most."""
    return float(min(0.25 * 2 ** (failures - 1), MAX_RECONNECT_WAIT))


def end_error(data: str) -> TreadleAPIError | None:
    """The error an ``end`` message with data ``data`` stands for, or None for a run's end.

    A credential cause (``credential_expired``, ``credential_revoked``: status 401;
    ``tenant_suspended``: 403) becomes a :class:`TreadleAPIError` with the cause as its
    ``code`` and the message's data as its ``problem``; so does a cause this client does
    not know (status None): following on would be guessing. ``run_ended``, ``run_gone``
    and an ``end`` without a cause (servers before the cause was added) end the follow.
    """
    try:
        body: Any = json.loads(data)
    except ValueError:
        body = None
    cause = body.get("cause") if isinstance(body, dict) else None
    if not isinstance(cause, str) or cause in (StreamEnd.RUN_ENDED, StreamEnd.RUN_GONE):
        return None
    return TreadleAPIError(
        _LAPSE_DETAIL.get(cause, f"the event stream ended: {cause}"),
        code=cause,
        status=_LAPSE_STATUS.get(cause),
        title="Event stream ended",
        problem=body,
    )
