"""Request and response models of ``POST /events`` and ``GET /events`` (docs/api.md)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas import Identifier

EventName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")]


class PostEventRequest(BaseModel):
    """Body of ``POST /events``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "order.paid",
                    "data": {"order_id": "A-1001", "amount": 42},
                    "key": "payment-7781",
                }
            ]
        },
    )

    name: EventName = Field(description="Event name, 1..200 of `[A-Za-z0-9_.-]`.")
    data: Any = Field(
        default_factory=dict,
        description="JSON data: the input of every run it starts, what waits match on.",
    )
    key: Identifier | None = Field(
        default=None,
        description="Idempotency key (per tenant): the same key and event again starts and "
        "delivers nothing more and returns the first post's event (200); with another "
        "name or data it is 409.",
    )


class InboundEvent(BaseModel):
    """A posted event, what its triggers started and which waiting runs it resumed."""

    event_id: uuid.UUID
    name: str
    key: str | None
    data: Any
    sent_by: str = Field(description="Subject of the token that posted it.")
    received_at: datetime
    started_run_ids: list[uuid.UUID] = Field(
        description="Runs started by workflows declaring `on_event` = name (filter held)."
    )
    resumed_run_ids: list[uuid.UUID] = Field(
        description="Runs it was delivered to in a `ctx.wait_for_event`: at the post, or "
        "since, to a wait that started later and looked back (docs/authoring.md)."
    )


class InboundEventPage(BaseModel):
    """One page of ``GET /events``."""

    items: list[InboundEvent]
    next_page_token: str | None
