"""Following a run's events (``GET /runs/{run_id}/events?follow=true``): the shared parts.

The server's SSE format (docs/api.md, Live events): one message per event (``id`` the
event id, ``event`` its kind, ``data`` the event's JSON), comment lines as heartbeats,
and a last ``event: end`` message once the run is terminal and every event was sent. A
stream that closes without ``end`` (a dropped connection, a server shutting down) is
resumed with ``Last-Event-ID``; both clients' ``follow_events`` do that here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from app.client._http import segment

END = "end"
"""The ``event`` of the stream's last message."""

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
