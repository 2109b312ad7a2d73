"""Order fulfilment: validate → (reserve inventory ‖ price shipping) → charge → confirm.

The external services (inventory, shipping rates, payment gateway) are simulated in this
module with deterministic behaviour derived from the order data and the step's attempt, so
that every run of the example reproduces the same outcomes:

* addresses with no postal code or an unsupported country fail validation (``Permanent``);
* the inventory service fails transiently on some attempts (retried, exponential backoff);
* card tokens ``tok_declined`` / ``tok_insufficient_funds`` / ``tok_stolen`` are declined
  (``Permanent``: no retry); ``tok_processing_error`` fails once then succeeds;
* SKUs starting ``DISCONTINUED-`` are out of stock for good (``Permanent``).
"""

from __future__ import annotations

import asyncio
import hashlib

from pydantic import BaseModel, Field

from app.sdk import Permanent, RetryPolicy, WorkflowContext, current_step, workflow

SUPPORTED_COUNTRIES = {"US", "CA", "GB", "DE", "FR", "NL", "SE", "JP", "AU", "NZ", "IE", "ES"}
DECLINED_TOKENS = {"tok_declined", "tok_insufficient_funds", "tok_stolen"}


class Address(BaseModel):
    """Where the order ships."""

    name: str = Field(min_length=1, max_length=200)
    line1: str = Field(min_length=1, max_length=200)
    line2: str | None = Field(default=None, max_length=200)
    city: str = Field(min_length=1, max_length=100)
    postal_code: str = Field(default="", max_length=20)
    country: str = Field(min_length=2, max_length=2, description="ISO 3166-1 alpha-2")


class LineItem(BaseModel):
    """One product line."""

    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=1000)
    unit_price_cents: int = Field(ge=0)


class Order(BaseModel):
    """Input of the ``orders`` workflow."""

    order_id: str = Field(min_length=1, max_length=64)
    customer_email: str = Field(min_length=3, max_length=254)
    items: list[LineItem] = Field(min_length=1, max_length=100)
    shipping_address: Address
    card_token: str = Field(min_length=1, max_length=64)
    express: bool = False


class Reservation(BaseModel):
    """Inventory held for the order."""

    reservation_id: str
    skus: list[str]


class Confirmation(BaseModel):
    """Output of the ``orders`` workflow."""

    order_id: str
    reservation_id: str
    charge_id: str
    total_cents: int
    shipping_cents: int


class InventoryUnavailable(Exception):
    """The inventory service answered 503 (transient)."""


class OutOfStock(Exception):
    """A SKU cannot be reserved (permanent)."""


class CardDeclined(Exception):
    """The payment gateway declined the card (permanent)."""


class GatewayError(Exception):
    """The payment gateway failed to process (transient)."""


def _fraction(*parts: object) -> float:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def validate_order(order: Order) -> int:
    """Check the address and compute the items subtotal in cents."""
    addr = order.shipping_address
    if addr.country.upper() not in SUPPORTED_COUNTRIES:
        raise Permanent(ValueError(f"we do not ship to country {addr.country!r}"))
    if not addr.postal_code.strip():
        raise Permanent(ValueError("shipping address has no postal code"))
    return sum(i.quantity * i.unit_price_cents for i in order.items)


async def reserve_inventory(order: Order) -> Reservation:
    """Hold stock for every line (simulated remote call; transiently unavailable)."""
    step = current_step()
    await asyncio.sleep(0.002)
    # About a third of first attempts hit a 503; later attempts mostly succeed.
    if _fraction("inventory", order.order_id, step.attempt) < 0.35 / step.attempt:
        raise InventoryUnavailable(f"inventory service unavailable (attempt {step.attempt})")
    for item in order.items:
        if item.sku.startswith("DISCONTINUED-"):
            raise Permanent(OutOfStock(f"{item.sku} is discontinued"))
    return Reservation(
        reservation_id="res_" + step.idempotency_key.replace(":", "_")[-24:],
        skus=[i.sku for i in order.items],
    )


async def price_shipping(order: Order) -> int:
    """Quote shipping in cents from the destination, weight proxy and speed."""
    await asyncio.sleep(0.001)
    units = sum(i.quantity for i in order.items)
    base = 499 if order.shipping_address.country.upper() in {"US", "CA"} else 1299
    return base + 50 * max(units - 1, 0) + (1500 if order.express else 0)


async def charge_card(order: Order, amount_cents: int) -> str:
    """Charge the card once per idempotency key (simulated gateway)."""
    step = current_step()
    await asyncio.sleep(0.002)
    if order.card_token in DECLINED_TOKENS:
        raise Permanent(CardDeclined(f"card declined ({order.card_token.removeprefix('tok_')})"))
    if order.card_token == "tok_processing_error" and step.attempt == 1:
        raise GatewayError("gateway timeout while processing")
    # The gateway deduplicates on our idempotency key, so a retried charge is not doubled.
    return (
        "ch_" + hashlib.sha256(f"{step.idempotency_key}:{amount_cents}".encode()).hexdigest()[:20]
    )


def send_confirmation(order: Order, charge_id: str) -> str:
    """Queue the confirmation e-mail (simulated)."""
    return f"queued mail to {order.customer_email} for {charge_id}"


# Submitted with ``concurrency_key`` = the customer, at most two of a customer's orders are
# in flight at once (a burst of charges on one card trips the gateway's fraud checks);
# more wait their turn, in the order they were placed. Orders without a key are not held.
@workflow("orders", version=1, key_limit=2, on_limit="queue")
async def fulfil_order(ctx: WorkflowContext, order: Order) -> Confirmation:
    """Validate, reserve stock and price shipping in parallel, charge, confirm."""
    subtotal = await ctx.step(validate_order, order, retry=RetryPolicy(max_attempts=1))
    reservation, shipping = await asyncio.gather(
        ctx.step(
            reserve_inventory,
            order,
            retry=RetryPolicy(
                max_attempts=5, backoff="exponential", delay=0.05, max_delay=1.0, jitter=0.5
            ),
            timeout=10,
        ),
        ctx.step(price_shipping, order),
    )
    total = subtotal + shipping
    charge_id = await ctx.step(
        charge_card,
        order,
        total,
        retry=RetryPolicy(max_attempts=4, backoff="exponential", delay=0.1, jitter=0.2),
        timeout=15,
    )
    await ctx.step(send_confirmation, order, charge_id)
    return Confirmation(
        order_id=order.order_id,
        reservation_id=reservation.reservation_id,
        charge_id=charge_id,
        total_cents=total,
        shipping_cents=shipping,
    )
