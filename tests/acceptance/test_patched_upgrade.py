"""The patched-upgrade example with two worker processes.

Runs waiting on an approval survive a redeploy that adds a step before the approval
(``examples.expenses``).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.acceptance.conftest import Stack, token
from tests.helpers import wait_for_sync

# Four worker processes start one after another: slow on a loaded CI machine.
pytestmark = pytest.mark.timeout(300)


def _wait(stack: Stack, run_id: str, *statuses: str) -> dict[str, Any]:
    with stack.client() as c:

        def probe() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return body if body["status"] in statuses else None

        return wait_for_sync(probe, timeout=90, what=f"run {run_id} in {statuses}")


def _start(stack: Stack, employee: str) -> str:
    with stack.client() as c:
        resp = c.post(
            "/runs",
            json={
                "workflow": "expense-report",
                "input": {"employee": employee, "amount_cents": 500},
            },
        )
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def test_runs_waiting_on_an_approval_survive_a_patched_upgrade(stack: Stack) -> None:
    before = [stack.start_worker("examples.expenses_before") for _ in range(2)]
    old_runs = [_start(stack, f"old{i}") for i in range(2)]
    for run_id in old_runs:
        _wait(stack, run_id, "waiting_approval")
    for proc in before:  # redeploy: stop the old code ...
        proc.send_signal(signal.SIGTERM)
    for proc in before:
        assert proc.wait(timeout=30) == 0
    for _ in range(2):  # ... and start the new one (same version "1")
        stack.start_worker("examples.expenses")
    new_runs = [_start(stack, f"new{i}") for i in range(2)]
    for run_id in new_runs:
        _wait(stack, run_id, "waiting_approval")
    with stack.client(token(subject="manager-bob")) as boss:
        for run_id in old_runs + new_runs:
            resp = boss.post(f"/runs/{run_id}/approvals/manager", json={"decision": "approve"})
            assert resp.status_code == 200, resp.text
    for run_id in old_runs:
        done = _wait(stack, run_id, "completed", "failed")
        assert done["status"] == "completed", done["error"]
        assert done["output"]["audit"] is None
    for i, run_id in enumerate(new_runs):
        done = _wait(stack, run_id, "completed", "failed")
        assert done["status"] == "completed", done["error"]
        assert done["output"]["audit"] == f"audited claim-new{i}-500"
    with stack.client() as c:
        steps = [s["step_id"] for s in c.get(f"/runs/{new_runs[0]}/steps").json()["items"]]
        assert steps == ["prepare", "patch:audit-before-approval", "audit", "manager", "pay"]
        old_steps = [s["step_id"] for s in c.get(f"/runs/{old_runs[0]}/steps").json()["items"]]
        assert old_steps == ["prepare", "manager", "pay"]
