"""Approvals and signals over real HTTP with real worker processes (kill -9 included)."""

from __future__ import annotations

import signal
import uuid
from typing import Any

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES, Scope
from tests.acceptance.conftest import Stack, token
from tests.conftest import DEV_SECRET, WITH_PGBOUNCER
from tests.helpers import wait_for_sync


def manager_token(subject: str = "bob", tenant: str = "acme") -> str:
    return DevTokens(DEV_SECRET).mint(
        tenant_id=tenant, subject=subject, scopes=ALL_SCOPES, groups=["sales-manager"]
    )


def _status(stack: Stack, run_id: str, *wanted: str) -> dict[str, Any]:
    with stack.client() as c:

        def probe() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return body if body["status"] in wanted else None

        return wait_for_sync(probe, timeout=60, what=f"run in {wanted}")


@WITH_PGBOUNCER
def test_approval_and_signal_survive_a_killed_worker(stack: Stack) -> None:
    worker = stack.start_worker()
    name = f"cust-{uuid.uuid4().hex[:6]}"
    with stack.client() as c:
        run_id = c.post("/runs", json={"workflow": "acc-approve", "input": {"name": name}}).json()[
            "run_id"
        ]
        # The signal arrives before the run waits for it: buffered.
        sent = c.post(f"/runs/{run_id}/signals/docs_uploaded", json={"payload": {"files": 3}})
        assert sent.status_code == 202, sent.text
    run = _status(stack, run_id, "waiting_approval")
    waiting = run["waiting_on"]
    assert isinstance(waiting, dict)
    assert (waiting["kind"], waiting["name"]) == ("approval", "manager")
    assert waiting["deadline"] is not None
    # The worker that recorded the wait dies; the decision is sent while no worker runs.
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    other = DevTokens(DEV_SECRET).mint(
        tenant_id="globex", subject="eve", scopes=ALL_SCOPES, groups=["sales-manager"]
    )
    outsider = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="mallory", scopes=ALL_SCOPES)
    no_scope = DevTokens(DEV_SECRET).mint(
        tenant_id="acme", subject="bob", scopes=[Scope.RUNS_READ], groups=["sales-manager"]
    )
    decision = {"decision": "approve", "comment": "welcome"}
    with stack.client(other) as c:
        assert c.post(f"/runs/{run_id}/approvals/manager", json=decision).status_code == 404
        assert c.post(f"/runs/{run_id}/signals/docs_uploaded", json={}).status_code == 404
    with stack.client(outsider) as c:
        resp = c.post(f"/runs/{run_id}/approvals/manager", json=decision)
        assert resp.status_code == 403 and resp.json()["required_group"] == "sales-manager"
    with stack.client(no_scope) as c:
        resp = c.post(f"/runs/{run_id}/approvals/manager", json=decision)
        assert resp.status_code == 403 and resp.json()["required_scope"] == "approvals:write"
    with stack.client() as c:  # alice submitted the run: no self-approval
        assert c.post(f"/runs/{run_id}/approvals/manager", json=decision).status_code == 403
    with stack.client(manager_token()) as c:
        bad = c.post(f"/runs/{run_id}/approvals/manager", json={"decision": "maybe"})
        assert bad.status_code == 422
        assert c.post(f"/runs/{run_id}/approvals/nope", json=decision).status_code == 404
        big = c.post(f"/runs/{run_id}/signals/x", json={"payload": "x" * (1024 * 1024)})
        assert big.status_code == 413
        ok = c.post(f"/runs/{run_id}/approvals/manager", json=decision)
        assert ok.status_code == 200, ok.text
        assert ok.json()["resolved"] is True
        again = c.post(f"/runs/{run_id}/approvals/manager", json=decision)
        assert again.status_code == 409
    with stack.client() as c:
        events = c.get(f"/runs/{run_id}/events").json()["items"]
    decided = [e for e in events if e["kind"] == "approval_decided"]
    assert [(e["actor"], e["data"]["decision"]) for e in decided] == [("bob", "approve")]
    signals = [e for e in events if e["kind"] == "signal_received"]
    assert len(signals) == 1  # the oversized and cross-tenant ones recorded nothing
    stack.start_worker()
    with stack.client() as c:
        result = wait_for_sync(
            lambda: (b := c.get(f"/runs/{run_id}/result", params={"wait": 5}).json())["done"] and b,
            timeout=60,
            what="run result",
        )
        report = c.get(f"/runs/{run_id}/report", params={"format": "text"}).text
    assert result["status"] == "completed", result
    assert result["output"] == {
        "account": f"acct-{name}-bob",
        "docs": {"files": 3},
        "comment": "welcome",
    }
    assert "approval_decided [manager] by bob" in report
    assert "signal_consumed [signal:docs_uploaded]" in report
    with stack.client() as c:
        late = c.post(f"/runs/{run_id}/signals/docs_uploaded", json={})
        assert late.status_code == 409
    assert token()  # the default token is alice's


def test_run_without_a_live_worker_says_it_is_blocked(stack: Stack) -> None:
    worker = stack.start_worker()
    worker.send_signal(signal.SIGTERM)  # registered, then gone: the definition stays
    assert worker.wait(timeout=30) == 0
    with stack.client() as c:
        created = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": 1}})
        assert created.status_code == 201, created.text
        run = c.get(f"/runs/{created.json()['run_id']}").json()
        report = c.get(f"/runs/{run['run_id']}/report", params={"format": "text"}).text
    assert run["status"] == "queued"
    assert run["blocked_reason"] == "no live worker has registered acc-echo@1"
    assert "blocked      no live worker has registered acc-echo@1" in report
    stack.start_worker()
    with stack.client() as c:
        done = wait_for_sync(
            lambda: (b := c.get(f"/runs/{run['run_id']}").json())["status"] == "completed" and b,
            timeout=60,
            what="run completed",
        )
    assert done["blocked_reason"] is None
