"""Workflows for tests/acceptance/test_events_http.py (event triggers and waits)."""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Paid(BaseModel):
    order_id: str
    amount: int


class Shipment(BaseModel):
    order_id: str


@workflow("acc-on-paid", on_event="acc.order.paid", event_filter={"currency": "EUR"})
async def on_paid(ctx: WorkflowContext, paid: Paid) -> str:
    return f"paid {paid.order_id}: {paid.amount}"


@workflow("acc-await-delivery")
async def await_delivery(ctx: WorkflowContext, shipment: Shipment) -> dict[str, object]:
    event = await ctx.wait_for_event(
        "acc.parcel.delivered", match={"parcel.order_id": shipment.order_id}, timeout=120
    )
    return {"event_id": event.event_id, "signed_by": event.data["parcel"]["signed_by"]}
