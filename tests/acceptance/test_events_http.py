"""POST /events over real HTTP with a worker process (docs/adr/0029-event-triggers.md).

A workflow declaring ``on_event`` is started by a post and completes; a run waiting in
``ctx.wait_for_event`` resumes when a matching event is posted; a post repeated with one
key starts one run (checked from ``GET /runs``). Through the client and the CLI too.
"""

from __future__ import annotations

import json
import uuid

from app.client import TreadleClient
from tests.acceptance.conftest import Stack, cli, token
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.event_handlers"


def _output(c: TreadleClient, run_id: uuid.UUID | str) -> object:
    result = c.wait(run_id, timeout=60)
    assert result.status == "completed", result
    return result.output


def test_trigger_wait_and_idempotent_key(stack: Stack) -> None:
    stack.start_worker(HANDLERS)
    order = uuid.uuid4().hex[:8]
    with TreadleClient(stack.url, token()) as c:
        posted = c.post_event(
            "acc.order.paid", {"order_id": order, "amount": 42, "currency": "EUR"}, key=order
        )
        assert len(posted.started_run_ids) == 1
        (run_id,) = posted.started_run_ids
        assert _output(c, run_id) == f"paid {order}: 42"
        again = c.post_event(
            "acc.order.paid", {"amount": 42, "currency": "EUR", "order_id": order}, key=order
        )
        assert again.event_id == posted.event_id and again.started_run_ids == [run_id]
        runs = c.list(workflow="acc-on-paid").items
        assert [r.run_id for r in runs if r.run_id == run_id] == [run_id]
        assert len(runs) == 1
        # Another currency: the filter does not hold, nothing starts.
        usd = c.post_event("acc.order.paid", {"order_id": order, "amount": 1, "currency": "USD"})
        assert usd.started_run_ids == []

        waiting = c.submit("acc-await-delivery", {"order_id": order})
        wait_for_sync(
            lambda: c.get(waiting.run_id).status == "waiting_event", what="run waits for event"
        )
        other = c.post_event(
            "acc.parcel.delivered", {"parcel": {"order_id": "someone-else", "signed_by": "x"}}
        )
        assert other.resumed_run_ids == []
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    data = json.dumps({"parcel": {"order_id": order, "signed_by": "Ana"}})
    out = cli(env, "events", "post", "acc.parcel.delivered", "--data", data, "--output", "json")
    delivered = json.loads(out)
    assert delivered["resumed_run_ids"] == [str(waiting.run_id)]
    with TreadleClient(stack.url, token()) as c:
        assert _output(c, waiting.run_id) == {
            "event_id": delivered["event_id"],
            "signed_by": "Ana",
        }
        shown = c.get_event(delivered["event_id"])
        assert shown.resumed_run_ids == [waiting.run_id]
