"""Schedules stop acting for a principal that may no longer act: real API, real workers.

A schedule created with an API key: its run started before the key is revoked fails
``failure_authorization`` at its first attempt on a worker process; after the revocation
its ticks (the worker's scheduler loop, and a manual trigger) start nothing and are
recorded ``failed`` with why, and ``GET /schedules/{id}`` says why in ``blocked_reason``.
The same for a suspended tenant's schedule. A schedule created with a JWT is unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.auth.principal import ALL_SCOPES, Scope
from app.core.settings import Settings
from app.db.database import Database
from app.engine.registry import Registry
from tests.acceptance.conftest import Stack, token
from tests.acceptance.handlers import echo_flow
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(300)  # API and worker processes on a loaded machine
USER = [s for s in Scope if s != Scope.ADMIN]


@pytest.fixture
def clients() -> Iterator[ExitStack]:
    """Closes every HTTP client a test opens."""
    with ExitStack() as opened:
        yield opened


def _wait_run(c: httpx.Client, run_id: str, *statuses: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
        return body if body["status"] in statuses else None

    return wait_for_sync(probe, timeout=60, what=f"run {run_id} in {statuses}")


def _wait_fire(c: httpx.Client, schedule_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        items: list[dict[str, Any]] = c.get(f"/schedules/{schedule_id}/fires").json()["items"]
        return items[0] if items else None

    return wait_for_sync(probe, timeout=60, what=f"a fire of schedule {schedule_id}")


def _register(database_url: str) -> None:
    """Register the echo workflow as a worker would, without running one yet."""

    async def register() -> None:
        db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
        try:
            async with db.write() as conn:
                await Registry([echo_flow]).register(conn)
        finally:
            await db.dispose()

    asyncio.run(register())


def _soon() -> str:
    return (datetime.now(UTC) + timedelta(seconds=2)).isoformat()


def test_a_revoked_keys_schedule_stops_firing_and_its_runs_fail(
    stack: Stack, clients: ExitStack
) -> None:
    _register(stack.database_url)
    root = clients.enter_context(stack.client(token("acme", "root", ALL_SCOPES)))
    alice = clients.enter_context(stack.client(token("acme", "alice", USER)))
    made = root.post("/admin/api-keys", json={"name": "cron", "scopes": ["runs:write"]})
    assert made.status_code == 201, made.text
    key = made.json()
    as_key = clients.enter_context(stack.client(key["api_key"]))
    echo = {"workflow": "acc-echo", "input": {"value": 1}, "overlap": "allow_all"}
    recurring = as_key.post("/schedules", json={"name": "k-cron", "cron": "0 0 1 1 *", **echo})
    assert recurring.status_code == 201, recurring.text
    recurring_id = recurring.json()["schedule_id"]
    # Started while the key is live, before any worker runs: queued in the key's name.
    before = as_key.post(f"/schedules/{recurring_id}/trigger").json()
    assert before["outcome"] == "started", before
    once = as_key.post(
        "/schedules",
        json={"name": "k-once", "at": _soon(), "catchup_window_seconds": 3600, **echo},
    )
    assert once.status_code == 201, once.text
    once_id = once.json()["schedule_id"]
    # The control: a schedule of a JWT principal, triggered before the worker starts.
    jwt = alice.post("/schedules", json={"name": "jwt", "cron": "0 0 1 1 *", **echo})
    jwt_run = alice.post(f"/schedules/{jwt.json()['schedule_id']}/trigger").json()["run_id"]

    assert root.delete(f"/admin/api-keys/{key['key_id']}").status_code == 200
    shown = root.get(f"/schedules/{recurring_id}").json()
    assert shown["blocked_reason"] is not None and "revoked" in shown["blocked_reason"]
    refused = root.post(f"/schedules/{recurring_id}/trigger").json()
    assert refused["outcome"] == "failed" and refused["run_id"] is None, refused
    assert "revoked" in refused["error"]

    stack.start_worker()
    failed = _wait_run(root, before["run_id"], "failed", "completed")
    assert failed["status"] == "failed" and failed["reason"] == "failure_authorization"
    assert _wait_run(alice, jwt_run, "completed", "failed")["status"] == "completed"
    # The worker's scheduler loop reaches the one-off tick: refused, recorded, no run.
    fire = _wait_fire(root, once_id)
    assert fire["outcome"] == "failed" and fire["run_id"] is None, fire
    assert "revoked" in fire["error"]
    after = root.get(f"/schedules/{once_id}").json()
    assert after["fired_count"] == 0 and "revoked" in after["last_error"]
    listed = root.get("/runs", params={"workflow": "acc-echo"}).json()["items"]
    assert sorted(r["run_id"] for r in listed) == sorted([before["run_id"], jwt_run])


def test_a_suspended_tenants_schedule_stops_firing(stack: Stack, clients: ExitStack) -> None:
    _register(stack.database_url)
    alice = clients.enter_context(stack.client(token("initech", "alice", USER)))
    ops = clients.enter_context(stack.client(token("ops", "root", ALL_SCOPES)))
    root = clients.enter_context(stack.client(token("initech", "root", ALL_SCOPES)))
    once = alice.post(
        "/schedules",
        json={
            "name": "once",
            "workflow": "acc-echo",
            "input": {"value": 2},
            "at": _soon(),
            "catchup_window_seconds": 3600,
        },
    )
    assert once.status_code == 201, once.text
    once_id = once.json()["schedule_id"]
    assert ops.post("/admin/tenants/initech/suspend", json={"reason": "r"}).status_code == 200
    assert "suspended" in root.get(f"/schedules/{once_id}").json()["blocked_reason"]
    stack.start_worker()
    fire = _wait_fire(root, once_id)
    assert fire["outcome"] == "failed" and fire["error"] == "tenant 'initech' is suspended"
    assert root.get("/runs").json()["items"] == []
