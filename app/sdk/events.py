"""What ``ctx.wait_for_event`` returns: a posted event (docs/adr/0029-event-triggers.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ReceivedEvent(BaseModel):
    """An event posted to ``POST /events`` and delivered to a ``ctx.wait_for_event``.

    Attributes:
        event_id: the event's id (``GET /events/{event_id}``).
        name: the event name.
        key: the idempotency key it was posted with, or None.
        data: its JSON data.
        received_at: when the API recorded it (ISO 8601, UTC, database clock).
    """

    event_id: str
    name: str
    key: str | None = None
    data: Any = None
    received_at: str
