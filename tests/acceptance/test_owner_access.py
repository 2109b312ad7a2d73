"""``access="owner"`` holds for every definition kind and every path that starts work.

Real ``treadle serve`` and a worker process running tests/acceptance/owner_handlers.py: an
owner-policy workflow (with a joined and a detached tenant-policy child), DAG and state
machine, each submitted by alice and run to completion, and an owner-policy workflow's
schedule triggered by her. For her colleague bob (same tenant, every non-admin scope)
each run, child and the schedule does not exist: 404 on every read and action, absent
from every list; an ``admin`` principal sees them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from app.auth.principal import ALL_SCOPES, Scope
from tests.acceptance.conftest import Stack, token

pytestmark = pytest.mark.timeout(300)  # API and worker processes on a loaded machine
USER = [s for s in Scope if s != Scope.ADMIN]


@pytest.fixture
def clients() -> Iterator[ExitStack]:
    """Closes every HTTP client a test opens."""
    with ExitStack() as opened:
        yield opened


def _result(c: httpx.Client, run_id: str) -> dict[str, Any]:
    resp = c.get(f"/runs/{run_id}/result", params={"wait": 30})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    assert body["status"] == "completed", body
    return body


def _invisible(bob: httpx.Client, run_id: str) -> list[str]:
    """Every run endpoint bob tries on ``run_id``; returns the ones that were not 404."""
    calls: list[tuple[str, str, Any]] = [
        ("GET", f"/runs/{run_id}", None),
        ("GET", f"/runs/{run_id}/result", None),
        ("GET", f"/runs/{run_id}/steps", None),
        ("GET", f"/runs/{run_id}/events", None),
        ("GET", f"/runs/{run_id}/report", None),
        ("POST", f"/runs/{run_id}/cancel", {"reason": "mine now"}),
        ("POST", f"/runs/{run_id}/resume", None),
        ("POST", f"/runs/{run_id}/retry", {"reason": "mine now"}),
        ("POST", f"/runs/{run_id}/signals/go", {"payload": 1}),
    ]
    wrong = []
    for method, path, body in calls:
        resp = bob.request(method, path, json=body)
        if resp.status_code != 404:
            wrong.append(f"{method} {path}: {resp.status_code} {resp.text[:200]}")
    return wrong


def test_owner_policy_holds_for_every_kind_children_and_schedules(
    stack: Stack, clients: ExitStack
) -> None:
    stack.start_worker("tests.acceptance.owner_handlers")
    alice = clients.enter_context(stack.client(token("acme", "alice", USER)))
    bob = clients.enter_context(stack.client(token("acme", "bob", USER)))
    root = clients.enter_context(stack.client(token("acme", "root", ALL_SCOPES)))

    submitted = {
        "own-wf": alice.post("/runs", json={"workflow": "own-wf", "input": {"n": 3}}),
        "own-dag": alice.post("/runs", json={"workflow": "own-dag", "input": {"n": 3}}),
        "own-sm": alice.post(
            "/runs",
            json={"workflow": "own-sm", "input": {"n": 3}, "concurrency_key": "ticket-1"},
        ),
    }
    run_ids = {}
    for name, resp in submitted.items():
        assert resp.status_code == 201, (name, resp.text)
        assert resp.json()["access"] == "owner", (name, resp.json())
        run_ids[name] = resp.json()["run_id"]
    outputs = {name: _result(alice, rid)["output"] for name, rid in run_ids.items()}
    assert outputs["own-dag"] == 6
    assert outputs["own-sm"]["name"] == "Closed"
    assert outputs["own-wf"]["joined"] == 30

    # Both children of the owner-policy parent are alice's alone, though own-child is a
    # tenant-policy workflow.
    children = alice.get("/runs", params={"workflow": "own-child"}).json()["items"]
    assert len(children) == 2, children
    assert {c["run_id"] for c in children} >= {outputs["own-wf"]["detached"]}
    for child in children:
        assert child["access"] == "owner" and child["created_by"] == "alice", child
        _result(alice, child["run_id"])

    # The schedule of an owner-policy workflow: bob cannot see, change or fire it.
    created = alice.post(
        "/schedules",
        json={"name": "mine", "workflow": "own-wf", "input": {"n": 1}, "cron": "0 0 1 1 *"},
    )
    assert created.status_code == 201, created.text
    sid = created.json()["schedule_id"]
    for method, path, body in [
        ("GET", f"/schedules/{sid}", None),
        ("GET", f"/schedules/{sid}/fires", None),
        ("PATCH", f"/schedules/{sid}", {"input": {"n": 99}}),
        ("POST", f"/schedules/{sid}/pause", None),
        ("POST", f"/schedules/{sid}/resume", None),
        ("POST", f"/schedules/{sid}/trigger", None),
        ("DELETE", f"/schedules/{sid}", None),
    ]:
        resp = bob.request(method, path, json=body)
        assert resp.status_code == 404, (method, path, resp.text)
    assert sid not in bob.get("/schedules").text
    assert alice.get(f"/schedules/{sid}").json()["input"] == {"n": 1}
    fired = alice.post(f"/schedules/{sid}/trigger").json()
    assert fired["outcome"] == "started", fired
    scheduled = _result(alice, fired["run_id"])
    assert scheduled["run_id"] == fired["run_id"]
    run_ids["scheduled"] = fired["run_id"]

    everything = [*run_ids.values(), *(c["run_id"] for c in children)]
    scheduled_children = alice.get("/runs", params={"workflow": "own-child"}).json()["items"]
    everything += [c["run_id"] for c in scheduled_children]
    wrong = [w for rid in everything for w in _invisible(bob, rid)]
    assert not wrong, "\n".join(wrong)
    listed = bob.get("/runs", params={"limit": 200}).text
    assert not [rid for rid in everything if rid in listed]
    assert bob.get("/dead-letters", params={"status": "all"}).json()["items"] == []
    seen = root.get("/runs", params={"limit": 200}).text
    assert all(rid in seen for rid in everything)
    for rid in everything:
        run = alice.get(f"/runs/{rid}").json()
        assert run["access"] == "owner" and run["created_by"] == "alice", run
