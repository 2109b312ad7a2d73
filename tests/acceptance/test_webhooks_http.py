"""Outbound webhooks end to end: API and worker processes, a real receiver over HTTP.

"A webhook target that is down receives the delivery once it is back, signed, exactly
once per terminal state as seen by its delivery log"; and a worker killed (-9) in the
middle of a POST does not lose the delivery. docs/adr/0030-outbound-webhooks.md.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.sdk.webhooks import verify_signature
from tests.acceptance.conftest import Stack, cli, cli_run, token
from tests.helpers import wait_for_sync
from tests.support.oidc_provider import UvicornThread


@dataclass
class Receiver:
    """A webhook receiver: 503 while ``down``; holds a request while ``hang`` is set."""

    down: bool = True
    hang: threading.Event = field(default_factory=threading.Event)
    received: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    hung: int = 0

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        if self.hang.is_set():
            self.hung += 1
            deadline = time.monotonic() + 30
            # Never answer while held: the sender is killed meanwhile.
            while self.hang.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return Response(status_code=599)
        status = 503 if self.down else 200
        self.received.append((headers, body, status))
        return Response(status_code=status)

    def accepted(self) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b, s in self.received if s == 200]


@pytest.fixture
def stack_env(stack_env: dict[str, str]) -> dict[str, str]:
    """Private targets allowed (the receiver is on 127.0.0.1), fast backoff."""
    stack_env.update(
        {
            "TREADLE_WEBHOOK_ALLOW_PRIVATE": "true",
            "TREADLE_WEBHOOK_RETRY_DELAY_SECONDS": "0.2",
            "TREADLE_WEBHOOK_RETRY_MAX_DELAY_SECONDS": "0.5",
            "TREADLE_WEBHOOK_TIMEOUT_SECONDS": "2",
        }
    )
    return stack_env


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    state = Receiver()
    server = UvicornThread(Starlette(routes=[Route("/hook", state.hook, methods=["POST"])]))
    server.start()
    try:
        yield state, f"{server.url}/hook"
    finally:
        state.hang.clear()
        server.stop()


def _run(c: httpx.Client, name: str) -> str:
    r = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": name}})
    assert r.status_code == 201, r.text
    run_id = str(r.json()["run_id"])
    wait_for_sync(
        lambda: c.get(f"/runs/{run_id}").json()["status"] == "completed",
        timeout=60,
        what=f"run {run_id} completed",
    )
    return run_id


def _delivery(c: httpx.Client, webhook_id: str, run_id: str) -> dict[str, Any] | None:
    items = c.get(f"/webhooks/{webhook_id}/deliveries").json()["items"]
    mine = [d for d in items if d["run_id"] == run_id]
    assert len(mine) <= 1, mine  # one delivery per terminal state
    return mine[0] if mine else None


def test_a_down_target_receives_the_delivery_once_back_signed_once(
    stack: Stack, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    stack.start_worker()
    with stack.client() as c:
        r = c.post("/webhooks", json={"url": url, "events": ["completed"]})
        assert r.status_code == 201, r.text
        webhook_id, secret = r.json()["webhook_id"], r.json()["secret"]
        run_id = _run(c, "first")

        def failed_twice() -> bool:
            d = _delivery(c, webhook_id, run_id)
            return d is not None and sum(a["http_status"] == 503 for a in d["attempts"]) >= 2

        wait_for_sync(failed_twice, timeout=30, what="two refused attempts")
        assert state.accepted() == []
        state.down = False

        def delivered() -> dict[str, Any] | None:
            d = _delivery(c, webhook_id, run_id)
            return d if d is not None and d["state"] == "delivered" else None

        wait_for_sync(delivered, timeout=30, what="delivered")
        # A later terminal state is delivered too: the sender has passed again since.
        second = _run(c, "second")
        wait_for_sync(
            lambda: (
                (x := _delivery(c, webhook_id, second)) is not None and x["state"] == "delivered"
            ),
            timeout=30,
            what="second delivered",
        )
        found = _delivery(c, webhook_id, run_id)
        assert found is not None
        d = found
    # The log: refused attempts, then one success, nothing after it.
    statuses = [a["http_status"] for a in d["attempts"]]
    assert statuses[-1] == 200 and set(statuses[:-1]) == {503} and len(statuses) >= 3
    assert d["next_attempt_at"] is None and d["run_status"] == "completed"
    # The receiver accepted it exactly once, signed, every attempt with one webhook-id.
    mine = [(h, b) for h, b, _ in state.received if h["webhook-id"] == d["delivery_id"]]
    assert len(mine) == len(statuses)
    accepted = [(h, b) for h, b in state.accepted() if h["webhook-id"] == d["delivery_id"]]
    assert len(accepted) == 1
    headers, body = accepted[0]
    assert verify_signature(secret, headers, body) == d["delivery_id"]
    assert headers["treadle-signature"].startswith(f"t={headers['webhook-timestamp']},v1=")
    assert b'"run_id":"' + run_id.encode() + b'"' in body
    # The CLI shows the same log, lists and removes the endpoint.
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    log = json.loads(cli(env, "webhooks", "deliveries", webhook_id, "-o", "json"))
    shown = {x["run_id"]: x for x in log["items"]}
    assert shown[run_id]["state"] == "delivered"
    assert [a["http_status"] for a in shown[run_id]["attempts"]] == statuses
    assert "delivered" in cli(env, "webhooks", "deliveries", webhook_id)
    listed = json.loads(cli(env, "webhooks", "list", "-o", "json"))["items"]
    assert [w["webhook_id"] for w in listed] == [webhook_id] and "secret" not in listed[0]
    added = json.loads(cli(env, "webhooks", "add", url, "--event", "failed", "-o", "json"))
    assert added["secret"].startswith("whsec_") and added["events"] == ["failed"]
    assert "deleted" in cli(env, "webhooks", "rm", webhook_id)
    refused = cli_run(env, "webhooks", "deliveries", webhook_id)
    assert refused.returncode == 1 and "webhook_not_found" in refused.stderr


def test_a_worker_killed_mid_post_does_not_lose_the_delivery(
    stack: Stack, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    state.down = False
    state.hang.set()
    first = stack.start_worker()
    with stack.client() as c:
        r = c.post("/webhooks", json={"url": url})
        assert r.status_code == 201, r.text
        webhook_id, secret = r.json()["webhook_id"], r.json()["secret"]
        run_id = _run(c, "crash")
        wait_for_sync(lambda: state.hung >= 1, timeout=30, what="the POST in flight")
        first.kill()  # SIGKILL mid-POST: its claim is never released
        first.wait(timeout=30)
        state.hang.clear()
        stack.start_worker()

        def delivered() -> dict[str, Any] | None:
            d = _delivery(c, webhook_id, run_id)
            return d if d is not None and d["state"] == "delivered" else None

        d = wait_for_sync(delivered, timeout=45, what="delivered after the crash")
    attempts = d["attempts"]
    # The killed attempt has no outcome; the next one (another worker) delivered it.
    assert attempts[0]["finished_at"] is None and attempts[0]["http_status"] is None
    assert attempts[-1]["http_status"] == 200
    accepted = state.accepted()
    assert len(accepted) == 1
    assert verify_signature(secret, accepted[0][0], accepted[0][1]) == d["delivery_id"]
