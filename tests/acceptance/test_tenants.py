"""Tenant suspension end to end: ``treadle serve``, real worker processes, the CLI.

A tenant's queued run and its run waiting on an approval both end ``failed`` /
``failure_authorization`` once the tenant is suspended with ``treadle tenants suspend``
(redacted in every read, a dead letter each, the timeline saying why); the API process
notices the CLI's change within its cache window; after a resume through the admin
endpoint new runs complete, and a requeued dead letter runs to completion.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest

from app.auth.principal import ALL_SCOPES, Scope
from app.core.settings import Settings
from app.db.database import Database
from app.engine.registry import Registry
from tests.acceptance.conftest import ROOT, Stack, token
from tests.acceptance.conftest import cli as _cli
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

TENANT = "initech"
USER_SCOPES = [s for s in ALL_SCOPES if s != Scope.ADMIN]


def _reach(c: httpx.Client, run_id: str, status: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
        return run if run["status"] == status else None

    return wait_for_sync(probe, timeout=60, what=f"run {run_id} {status}")


async def test_suspension_fails_runs_and_resume_lets_work_in(
    stack: Stack, database_url: str
) -> None:
    # The stack runs with the default cache window (TREADLE_TENANT_CACHE_SECONDS=2): the
    # test waits for the API process to notice the CLI's change.
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.write() as conn:
            await Registry.from_modules(["tests.acceptance.handlers"]).register(conn)
    finally:
        await db.dispose()
    user = stack.client(token(tenant=TENANT, subject="alice", scopes=USER_SCOPES))
    # The tenant's own operator: exempt from the suspension, reads what the users cannot.
    root = stack.client(token(tenant=TENANT, subject="root", scopes=ALL_SCOPES))
    ops = stack.client(token(tenant="ops", subject="ops-root", scopes=["admin"]))
    with user, root, ops:
        # A run waiting on an approval (a worker takes it there), then a queued run.
        worker = stack.start_worker()
        waiting = user.post("/runs", json={"workflow": "acc-approve", "input": {"name": "w41t"}})
        waiting_id = waiting.json()["run_id"]
        _reach(user, waiting_id, "waiting_approval")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        queued = user.post("/runs", json={"workflow": "acc-echo", "input": {"value": "qu3ued"}})
        assert queued.status_code == 201, queued.text
        queued_id = queued.json()["run_id"]

        out = _cli(stack.env, "tenants", "suspend", TENANT, "--reason", "invoice unpaid")
        assert f"{TENANT}  suspended" in out and "invoice unpaid" in out
        listed = _cli(stack.env, "tenants", "list", "--suspended")
        assert TENANT in listed and "cli:" in listed

        # The API process notices within its cache window (TREADLE_TENANT_CACHE_SECONDS).
        def refusing() -> httpx.Response | None:
            resp = user.get("/runs")
            return resp if resp.status_code == 403 else None

        refused = wait_for_sync(refusing, timeout=10, what="the API refusing the tenant")
        assert refused.json()["code"] == "tenant_suspended"
        assert refused.json()["tenant"] == TENANT and "invoice" not in refused.text
        blocked = user.post("/runs", json={"workflow": "acc-echo", "input": {"value": 1}})
        assert blocked.status_code == 403
        # The admin endpoint shows the CLI's suspension.
        state = ops.get("/admin/tenants", params={"status": "suspended"}).json()["items"]
        assert [(t["tenant"], t["reason"]) for t in state] == [(TENANT, "invoice unpaid")]

        # A worker: the queued run fails at its first attempt.
        stack.start_worker()
        run = _reach(root, queued_id, "failed")
        assert run["reason"] == "failure_authorization"
        assert run["redacted"] is True and run["input"] is None
        assert run["error"]["cause"] == "tenant_suspended"
        # The waiting run is caught at its next attempt (an operator re-checks it now).
        assert root.post(f"/runs/{waiting_id}/resume").status_code == 200
        run = _reach(root, waiting_id, "failed")
        assert run["reason"] == "failure_authorization" and run["redacted"] is True

        letters = root.get("/dead-letters").json()["items"]
        by_run = {d["run_id"]: d for d in letters}
        assert {by_run[queued_id]["reason"], by_run[waiting_id]["reason"]} == {
            "failure_authorization"
        }
        for run_id in (queued_id, waiting_id):
            events = root.get(f"/runs/{run_id}/events").json()["items"]
            failed = [e for e in events if e["kind"] == "run_failed"]
            assert failed and failed[0]["data"]["cause"] == "tenant_suspended"
            report = root.get(f"/runs/{run_id}/report", params={"format": "text"}).text
            cross = ops.get(f"/runs/{run_id}/report", params={"tenant": TENANT}).text
            for text in (report, cross, str(events)):
                assert "qu3ued" not in text and "w41t" not in text
            assert "failure_authorization" in report

        # Resume through the admin endpoint (this API process sees it at once).
        resumed = ops.post(f"/admin/tenants/{TENANT}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "active"
        assert resumed.json()["changed_by"] == "ops-root"
        fresh = user.post("/runs", json={"workflow": "acc-echo", "input": {"value": "fr3sh"}})
        assert fresh.status_code == 201, fresh.text
        assert _reach(user, fresh.json()["run_id"], "completed")["output"] == "fr3sh"
        # The suspension's dead letter, requeued, runs to completion.
        requeued = user.post(
            f"/dead-letters/{by_run[queued_id]['dead_letter_id']}/requeue",
            json={"reason": "tenant resumed", "correlation_id": "INC-1"},
        )
        assert requeued.status_code == 200, requeued.text
        run = _reach(user, queued_id, "completed")
        assert run["redacted"] is False and run["output"] == "qu3ued"
        assert f"{TENANT}  active" in _cli(stack.env, "tenants", "list")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cli_refuses_bad_input(stack_env: dict[str, str]) -> None:
    """Validation is the engine's, the same for both databases; nothing is stored."""
    for args in (
        ["suspend", "bad tenant", "--reason", "r"],
        ["suspend", "x" * 129, "--reason", "r"],
        ["suspend", TENANT, "--reason", ""],
        ["suspend", TENANT, "--reason", "x" * 1001],
        ["suspend", TENANT, "--reason", "line\nbreak"],
        ["resume", "bad/tenant"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "tenants", *args],
            cwd=ROOT,
            env=stack_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "tenant must be" in done.stderr or "reason must be" in done.stderr
    assert "(no tenants)" in _cli(stack_env, "tenants", "list")
    suspend = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "tenants", "suspend", TENANT],
        cwd=ROOT,
        env=stack_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert suspend.returncode == 2 and "--reason" in suspend.stderr  # the reason is required
