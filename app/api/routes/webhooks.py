"""``/webhooks``: outbound webhook endpoints of the tenant and their delivery logs.

docs/api.md "Webhooks", docs/adr/0030-outbound-webhooks.md. Every route needs the
``webhooks:manage`` scope; another tenant's endpoint is 404 like a missing one.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api import webhook_schemas as ws
from app.api.deps import DB, SettingsDep, WebhooksManage, lagging_read_or_primary
from app.api.links import WEBHOOK_OPERATIONS, links_to
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES as _PROBLEMS
from app.core.errors import BadRequest, WebhookNotFound
from app.db.queries import webhooks as webhooks_q
from app.engine import webhooks as engine

router = APIRouter(prefix="/webhooks", tags=["webhooks"])


def parse_webhook_id(webhook_id: str) -> uuid.UUID:
    """Parse a path webhook id; anything that is not a UUID is simply not found (404)."""
    try:
        return uuid.UUID(webhook_id)
    except ValueError:
        raise WebhookNotFound(f"webhook {webhook_id[:100]!r} not found") from None


def webhook_view(row: RowMapping) -> ws.Webhook:
    """Build a :class:`ws.Webhook` from a ``webhook_endpoints`` row (never the secret)."""
    return ws.Webhook(
        webhook_id=row["endpoint_id"],
        url=row["url"],
        events=webhooks_q.events_of(row["events"]),
        workflow=row["workflow"],
        created_by=row["created_by"],
        created_at=row["created_at"],
    )


@router.post(
    "",
    operation_id="create_webhook",
    status_code=201,
    response_model=ws.CreatedWebhook,
    responses={**_PROBLEMS, 201: {"links": links_to(WEBHOOK_OPERATIONS, "webhook_id")}},
)
async def create_webhook(
    body: ws.CreateWebhookRequest,
    response: Response,
    principal: WebhooksManage,
    db: DB,
    settings: SettingsDep,
) -> ws.CreatedWebhook:
    """Register an endpoint; the response holds its signing secret, shown this once.

    From then on, every run of the tenant (of ``workflow``, if given) that reaches one of
    ``events`` is POSTed there, signed (Standard Webhooks headers ``webhook-id``,
    ``webhook-timestamp``, ``webhook-signature``, plus ``Treadle-Signature``), with
    retries and backoff until a 2xx answer. Errors: 422 ``webhook_target_refused`` for a
    URL that is not http(s), malformed, longer than 2048 characters, or resolving to a
    private, loopback, link-local, multicast or reserved address (unless the server
    sets ``TREADLE_WEBHOOK_ALLOW_PRIVATE``); 422 for unknown ``events`` or a 51st endpoint.
    """
    row = await engine.create_endpoint(
        db,
        settings,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        url=body.url,
        events=body.events,
        workflow=body.workflow,
    )
    response.headers["Location"] = f"/webhooks/{row['endpoint_id']}"
    return ws.CreatedWebhook(**webhook_view(row).model_dump(), secret=row["secret"])


@router.get("", operation_id="list_webhooks", response_model=ws.WebhookList, responses=_PROBLEMS)
async def list_webhooks(principal: WebhooksManage, db: DB) -> ws.WebhookList:
    """The tenant's endpoints, oldest first (secrets are never listed)."""
    async with db.lagging_read() as conn:  # may lag (docs/adr/0033-…)
        rows = await webhooks_q.list_endpoints(conn, principal.tenant_id)
    return ws.WebhookList(items=[webhook_view(r) for r in rows])


@router.get(
    "/{webhook_id}", operation_id="get_webhook", response_model=ws.Webhook, responses=_PROBLEMS
)
async def get_webhook(webhook_id: str, principal: WebhooksManage, db: DB) -> ws.Webhook:
    """One endpoint (without its secret)."""
    async with db.read() as conn:
        row = await webhooks_q.get_endpoint(conn, principal.tenant_id, parse_webhook_id(webhook_id))
    return webhook_view(row)


@router.delete(
    "/{webhook_id}",
    operation_id="delete_webhook",
    status_code=204,
    response_class=Response,
    responses=_PROBLEMS,
)
async def delete_webhook(webhook_id: str, principal: WebhooksManage, db: DB) -> Response:
    """Delete an endpoint with its delivery log; its pending deliveries are not sent."""
    endpoint_id = parse_webhook_id(webhook_id)

    async def delete(conn: AsyncConnection) -> None:
        await webhooks_q.delete_endpoint(conn, principal.tenant_id, endpoint_id)

    await db.write_retrying(delete, what="delete webhook")
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    operation_id="list_webhook_deliveries",
    response_model=ws.WebhookDeliveryPage,
    responses=_PROBLEMS,
)
async def list_webhook_deliveries(
    webhook_id: str,
    principal: WebhooksManage,
    db: DB,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ws.WebhookDeliveryPage:
    """The endpoint's delivery log, newest first: one entry per terminal state of a run.

    Each delivery lists its attempts (time, HTTP status or error), its state
    (``pending`` / ``delivered`` / ``failed``) and, while pending, when the next attempt is
    due.
    """
    endpoint_id = parse_webhook_id(webhook_id)
    scope = f"webhook-deliveries:{endpoint_id}"
    before = None
    if page_token:
        position = decode_token(page_token, principal.tenant_id, scope, {})
        try:
            at, last = position
            before = (datetime.fromisoformat(str(at)), uuid.UUID(str(last)))
        except (ValueError, TypeError):
            raise BadRequest("page_token is malformed") from None

    async def read(
        conn: AsyncConnection,
    ) -> tuple[list[RowMapping], dict[uuid.UUID, list[RowMapping]]]:
        await webhooks_q.get_endpoint(conn, principal.tenant_id, endpoint_id)
        return await webhooks_q.list_deliveries(conn, endpoint_id, before=before, limit=limit + 1)

    rows, attempts = await lagging_read_or_primary(db, read)
    items = [
        ws.WebhookDelivery(
            delivery_id=r["delivery_id"],
            run_id=r["run_id"],
            workflow=r["workflow"],
            run_status=r["run_status"],
            run_reason=r["run_reason"],
            finished_at=r["finished_at"],
            state=r["state"],
            attempts=[
                ws.WebhookAttempt(
                    attempt=a["attempt"],
                    started_at=a["started_at"],
                    finished_at=a["finished_at"],
                    http_status=a["http_status"],
                    error=a["error"],
                )
                for a in attempts[r["delivery_id"]]
            ],
            next_attempt_at=r["next_attempt_at"],
            created_at=r["created_at"],
        )
        for r in rows[:limit]
    ]
    token = None
    if len(rows) > limit:
        last_row = rows[limit - 1]
        token = encode_token(
            principal.tenant_id,
            scope,
            {},
            [last_row["created_at"].isoformat(), str(last_row["delivery_id"])],
        )
    return ws.WebhookDeliveryPage(items=items, next_page_token=token)
