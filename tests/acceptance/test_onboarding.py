"""The onboarding example over HTTP through every path.

Approve, reject (on_reject), approval timeout, signal before and after the wait,
compensation after a failure, and a decision sent while no worker runs after the waiting
worker was killed.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from tests.acceptance.conftest import Stack
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

HANDLERS = "examples.onboarding"
MANAGER = DevTokens(DEV_SECRET).mint(
    tenant_id="acme", subject="maria", scopes=ALL_SCOPES, groups=["sales-manager"]
)
DOCS = {"files": ["kbis.pdf", "id.pdf"], "tax_id": "FR123"}


def _start(stack: Stack, **overrides: Any) -> str:
    applicant = {
        "customer_id": f"cust-{uuid.uuid4().hex[:8]}",
        "company": "Zoë & Søren GmbH",
        "email": "ops@zoe.example",
        "plan": "growth",
        **overrides,
    }
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "onboarding", "input": applicant})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _run(stack: Stack, run_id: str, *statuses: str) -> dict[str, Any]:
    with stack.client() as c:

        def probe() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return body if body["status"] in statuses else None

        return wait_for_sync(probe, timeout=60, what=f"{run_id} in {statuses}")


def _decide(stack: Stack, run_id: str, decision: str, comment: str = "ok") -> None:
    with stack.client(MANAGER) as c:
        resp = c.post(
            f"/runs/{run_id}/approvals/manager", json={"decision": decision, "comment": comment}
        )
        assert resp.status_code == 200, resp.text


def _signal(stack: Stack, run_id: str, payload: Any) -> None:
    with stack.client() as c:
        resp = c.post(f"/runs/{run_id}/signals/docs_uploaded", json={"payload": payload})
        assert resp.status_code == 202, resp.text


def test_onboarding_paths(stack: Stack) -> None:
    stack.start_worker(handlers=HANDLERS)
    approved = _start(stack)
    early = _start(stack)
    rejected = _start(stack)
    timed_out = _start(stack, approval_timeout_seconds=1)
    broken = _start(stack)
    _signal(stack, early, DOCS)  # before the run waits for it: buffered
    for run_id in (approved, early, rejected, broken):
        _run(stack, run_id, "waiting_approval")
        _decide(stack, run_id, "reject" if run_id == rejected else "approve")
    _run(stack, approved, "waiting_signal")
    _signal(stack, approved, DOCS)  # after the wait was recorded
    _run(stack, broken, "waiting_signal")
    _signal(stack, broken, {"files": ["scan.pdf"], "tax_id": ""})

    done = _run(stack, approved, "completed")
    assert done["output"]["approved_by"] == ["maria"]
    assert done["output"]["billing_profile"].endswith("_FR123")
    assert _run(stack, early, "completed")["output"]["account_id"].startswith("acct_")
    assert _run(stack, rejected, "completed")["output"] is None
    late = _run(stack, timed_out, "failed")
    assert late["reason"] == "failure_timed_out"
    undone = _run(stack, broken, "compensated")
    assert undone["reason"] == "failure_non_retryable"
    assert undone["error"]["compensated"] == ["create_account"]

    with stack.client() as c:
        steps = {s["step_id"]: s for s in c.get(f"/runs/{rejected}/steps").json()["items"]}
        report = c.get(f"/runs/{broken}/report", params={"format": "text"}).text
        dead = c.get("/dead-letters").json()["items"]
    assert steps["manager.on_reject"]["output"] == "rejected by maria: ok"
    assert "create_account__compensate" in report
    assert "compensated" in report
    assert [d["run_id"] for d in dead] == [timed_out]


def test_decision_and_signal_while_the_waiting_worker_is_dead(stack: Stack) -> None:
    worker = stack.start_worker(handlers=HANDLERS)
    run_id = _start(stack)
    _run(stack, run_id, "waiting_approval")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    _decide(stack, run_id, "approve")  # no worker is running
    _signal(stack, run_id, DOCS)
    stack.start_worker(handlers=HANDLERS)
    assert _run(stack, run_id, "completed")["output"]["approved_by"] == ["maria"]
