"""examples/orders.py with the test kit: at most two orders per customer in flight.

``orders`` declares ``key_limit=2, on_limit="queue"``: submitted with the customer as the
concurrency key, a customer's third order waits (``queued``, ``blocked_reason``) until
one of the first two finishes, then completes too; another customer is not held up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.sdk.testing import RunStatus, WorkflowTestEnv
from examples.orders import Order, fulfil_order

SAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data" / "orders.json"


def order(n: int, **changes: Any) -> Order:
    sample = json.loads(SAMPLES.read_text())[0]
    return Order.model_validate(
        {**sample, "order_id": f"T-{n}", "card_token": "tok_visa", **changes}
    )


async def test_a_customers_third_order_waits_for_one_of_the_first_two() -> None:
    async with WorkflowTestEnv([fulfil_order]) as env:
        ann = [
            await env.start(fulfil_order, order(n), concurrency_key="ann", settle=False)
            for n in range(3)
        ]
        bob = await env.start(fulfil_order, order(9), concurrency_key="bob", settle=False)
        first, second, third = [await env.get(r) for r in ann]
        assert (first.concurrency_slot, second.concurrency_slot) == (1, 2)
        assert (third.status, third.concurrency_slot) == (RunStatus.QUEUED, None)
        assert third.blocked_reason is not None and "'ann' (key_limit 2)" in third.blocked_reason
        assert (await env.get(bob)).concurrency_slot == 1

        results = [await env.result(r) for r in [*ann, bob]]
        assert [r.order_id for r in results] == ["T-0", "T-1", "T-2", "T-9"]
        admitted = [e.kind for e in await env.events(ann[2])]
        assert admitted.index("run_admitted") < admitted.index("run_claimed")
        assert "run_admitted" not in [e.kind for e in await env.events(ann[0])]
