"""The order-total DAG example over real HTTP with two worker processes."""

from __future__ import annotations

import functools
from typing import Any

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync

HANDLERS = "examples.order_total"
EXPECTED = {"ORD-1001": (3399, 599), "ORD-1002": (6299, 1699), "ORD-1003": (13496, 0)}


def test_order_total_over_http_with_two_workers(stack: Stack) -> None:
    stack.start_worker(handlers=HANDLERS)
    stack.start_worker(handlers=HANDLERS)
    with stack.client() as c:
        workflows = {w["name"]: w for w in c.get("/workflows").json()["items"]}
        assert workflows["order-total"]["versions"][0]["kind"] == "dag"
        runs: dict[str, str] = {}
        for oid in [*EXPECTED, "ORD-404"] * 3:
            resp = c.post("/runs", json={"workflow": "order-total", "input": {"order_id": oid}})
            assert resp.status_code == 201, resp.text
            runs.setdefault(oid, resp.json()["run_id"])
        bad = c.post("/runs", json={"workflow": "order-total", "input": {"order": 1}})
        assert bad.status_code == 422

        def finished(run_id: str) -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()
            return body if body["done"] else None

        for oid, (subtotal, shipping) in EXPECTED.items():
            result = wait_for_sync(functools.partial(finished, runs[oid]), timeout=60, what=oid)
            assert result["status"] == "completed"
            assert result["output"]["total_cents"] == subtotal + shipping
            assert result["output"]["shipping_cents"] == shipping
        missing = wait_for_sync(lambda: finished(runs["ORD-404"]), timeout=60, what="ORD-404")
        assert (missing["status"], missing["reason"]) == ("failed", "failure_non_retryable")

        listed = c.get(f"/runs/{runs['ORD-404']}/steps", params={"status": "failed"}).json()
        assert [(s["step_id"], s["reason"]) for s in listed["items"]] == [
            ("load_order", "failure_non_retryable")
        ]
        nodes = c.get(f"/runs/{runs['ORD-1001']}/steps", params={"reason": "succeeded"}).json()
        assert [s["step_id"] for s in nodes["items"]] == [
            "load_order",
            "price_items",
            "price_shipping",
            "add",
        ]
