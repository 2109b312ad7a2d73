"""Request and response models of ``/webhooks`` (kept apart from ``schemas.py``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas import WorkflowName

WebhookEvent = Literal["completed", "failed", "cancelled", "compensated"]
"""A terminal run status an endpoint receives (app/core/status.py)."""


class CreateWebhookRequest(BaseModel):
    """Body of ``POST /webhooks``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(
        min_length=1,
        max_length=8192,
        description="http(s) URL the deliveries are POSTed to (at most 2048 characters). "
        "It must resolve to public addresses only (the SSRF guard; docs/security.md).",
    )
    events: list[WebhookEvent] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        description="Terminal run statuses to deliver; default all four.",
    )
    workflow: WorkflowName | None = Field(
        default=None, description="Only runs of this workflow; default every workflow."
    )


class Webhook(BaseModel):
    """A webhook endpoint (its signing secret is shown only in the creation response)."""

    webhook_id: uuid.UUID
    url: str
    events: list[WebhookEvent]
    workflow: str | None
    created_by: str
    created_at: datetime


class CreatedWebhook(Webhook):
    """The endpoint just created, with its signing secret: store it, it is not shown again."""

    secret: str = Field(
        description="`whsec_` + base64 key of the HMAC-SHA256 signatures (Standard Webhooks)."
    )


class WebhookList(BaseModel):
    """The tenant's endpoints, oldest first (at most 50)."""

    items: list[Webhook]


class WebhookAttempt(BaseModel):
    """One POST of a delivery.

    ``finished_at`` null: in flight, or interrupted (the sender stopped mid-attempt; the
    delivery was then retried). ``http_status`` is the receiver's answer (2xx delivered
    it); ``error`` says why the attempt failed when there was no 2xx answer.
    """

    attempt: int
    started_at: datetime
    finished_at: datetime | None
    http_status: int | None
    error: str | None


class WebhookDelivery(BaseModel):
    """One terminal state of one run, delivered (or being delivered) to one endpoint.

    ``delivery_id`` is the ``webhook-id`` header of every attempt (dedupe on it).
    ``state``: ``pending`` (``next_attempt_at`` says when the next POST is due),
    ``delivered`` or ``failed`` (attempts exhausted); both are final.
    """

    delivery_id: uuid.UUID
    run_id: uuid.UUID
    workflow: str
    run_status: WebhookEvent
    run_reason: str | None
    finished_at: datetime
    state: Literal["pending", "delivered", "failed"]
    attempts: list[WebhookAttempt]
    next_attempt_at: datetime | None
    created_at: datetime


class WebhookDeliveryPage(BaseModel):
    """A page of an endpoint's deliveries, newest first."""

    items: list[WebhookDelivery]
    next_page_token: str | None = None
