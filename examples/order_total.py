"""Order total as a typed DAG: load order → (price items ‖ price shipping) → add.

``flow()`` starts the DAG at ``load_order``; the two pricing nodes both take the loaded
order and run in parallel; ``join(...).then(add)`` receives both prices. Adjacent type hints
are checked when this module is imported: change ``add``'s ``shipping`` parameter to
``ItemsPrice`` and the import fails with a ``DagDefinitionError`` naming both nodes.

The order store is simulated in this module (three demo orders) so the example runs
anywhere; an unknown order id fails at once (``Permanent``: retrying cannot find it).

Try it with ``treadle dev`` and::

    treadle runs start order-total --input '{"order_id": "ORD-1001"}'
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.sdk import Permanent, flow, join

# Shipping: flat rate per destination country, free from this subtotal on.
SHIPPING_CENTS = {"US": 599, "CA": 899, "GB": 799, "DE": 699}
INTERNATIONAL_SHIPPING_CENTS = 1499
FREE_SHIPPING_FROM_CENTS = 10_000
EXPRESS_SURCHARGE_CENTS = 1000


class OrderRef(BaseModel):
    """Input of the ``order-total`` workflow."""

    order_id: str = Field(min_length=1, max_length=64)


class Line(BaseModel):
    """One product line of a stored order."""

    sku: str
    quantity: int
    unit_price_cents: int


class StoredOrder(BaseModel):
    """An order as the store returns it."""

    order_id: str
    country: str
    express: bool
    lines: list[Line]


class ItemsPrice(BaseModel):
    """Subtotal of the order's lines."""

    order_id: str
    subtotal_cents: int


class ShippingPrice(BaseModel):
    """What shipping the order costs."""

    order_id: str
    shipping_cents: int


class OrderTotal(BaseModel):
    """Output of the ``order-total`` workflow."""

    order_id: str
    subtotal_cents: int
    shipping_cents: int
    total_cents: int


ORDERS: dict[str, StoredOrder] = {
    order.order_id: order
    for order in (
        StoredOrder(
            order_id="ORD-1001",
            country="US",
            express=False,
            lines=[
                Line(sku="MUG-CERAMIC-WHT", quantity=2, unit_price_cents=1250),
                Line(sku="TEA-EARLGREY-100G", quantity=1, unit_price_cents=899),
            ],
        ),
        StoredOrder(
            order_id="ORD-1002",
            country="DE",
            express=True,
            lines=[Line(sku="HEADPHONE-BT-BLK", quantity=1, unit_price_cents=6299)],
        ),
        StoredOrder(
            order_id="ORD-1003",
            country="JP",
            express=False,
            lines=[
                Line(sku="HOODIE-ZIP-GRY-M", quantity=1, unit_price_cents=7499),
                Line(sku="PLANT-POT-M-GLAZED", quantity=3, unit_price_cents=1999),
            ],
        ),
    )
}


async def load_order(ref: OrderRef) -> StoredOrder:
    """Fetch the order from the (simulated) order store."""
    order = ORDERS.get(ref.order_id)
    if order is None:
        raise Permanent(LookupError(f"order {ref.order_id!r} not found"))
    return order


async def price_items(order: StoredOrder) -> ItemsPrice:
    """Sum the lines (quantity × unit price)."""
    subtotal = sum(line.quantity * line.unit_price_cents for line in order.lines)
    return ItemsPrice(order_id=order.order_id, subtotal_cents=subtotal)


async def price_shipping(order: StoredOrder) -> ShippingPrice:
    """Rate shipping by destination; free over the threshold, express always costs extra."""
    subtotal = sum(line.quantity * line.unit_price_cents for line in order.lines)
    base = SHIPPING_CENTS.get(order.country, INTERNATIONAL_SHIPPING_CENTS)
    if subtotal >= FREE_SHIPPING_FROM_CENTS:
        base = 0
    if order.express:
        base += EXPRESS_SURCHARGE_CENTS
    return ShippingPrice(order_id=order.order_id, shipping_cents=base)


async def add(items: ItemsPrice, shipping: ShippingPrice) -> OrderTotal:
    """Combine both prices into the order's total."""
    return OrderTotal(
        order_id=items.order_id,
        subtotal_cents=items.subtotal_cents,
        shipping_cents=shipping.shipping_cents,
        total_cents=items.subtotal_cents + shipping.shipping_cents,
    )


loaded = flow("order-total", load_order)
order_total = join(loaded.then(price_items), loaded.then(price_shipping)).then(add)
