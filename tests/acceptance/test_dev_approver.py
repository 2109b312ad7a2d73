"""``treadle dev`` prints what one person needs to take the onboarding example through.

Started from the checkout as a new user would (examples loaded, embedded SQLite in a fresh
data directory): the ``TREADLE_TOKEN`` starts a run and the printed approver token decides
its approval, which the dev token itself may not (no self-approval, not in the group).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.acceptance.conftest import ROOT, free_port
from tests.helpers import wait_for_sync, wait_until_serving


def test_dev_prints_an_approver_token_that_can_decide_the_example_approval(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env["TREADLE_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "dev.log"
    with log.open("w") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "dev", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def printed() -> tuple[str, str] | None:
            assert dev.poll() is None, log.read_text()
            text = log.read_text()
            user = re.search(r"^export TREADLE_TOKEN=(\S+)$", text, re.M)
            approver = re.search(
                r"^approver token \(.*sales-manager.*scopes approvals:write,runs:read;.*\): (\S+)$",
                text,
                re.M,
            )
            return (user.group(1), approver.group(1)) if user and approver else None

        user, approver = wait_for_sync(printed, timeout=90, what="treadle dev's tokens")
        assert f"console: {url}/ui/" in log.read_text()
        as_user = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {user}"})
        as_approver = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {approver}"})
        with as_user, as_approver:
            # The banner is printed before uvicorn binds its socket: connect until it serves.
            wait_until_serving(url, dev, log, timeout=90)
            started = as_user.post(
                "/runs",
                json={
                    "workflow": "onboarding",
                    "input": {"customer_id": "c-1", "company": "Acme", "email": "a@acme.test"},
                },
            )
            assert started.status_code == 201, started.text
            run_id = started.json()["run_id"]

            def waiting() -> str | None:
                body = as_user.get(f"/runs/{run_id}").json()
                return body["status"] if body["status"] == "waiting_approval" else None

            wait_for_sync(waiting, timeout=60, what="the approval wait")
            step = as_user.get(f"/runs/{run_id}/steps").json()["items"]
            approval = next(s["step_id"] for s in step if s["kind"] == "approval")
            decision = {"decision": "approve", "comment": "welcome"}
            refused = as_user.post(f"/runs/{run_id}/approvals/{approval}", json=decision)
            assert refused.status_code == 403, refused.text
            accepted = as_approver.post(f"/runs/{run_id}/approvals/{approval}", json=decision)
            assert accepted.status_code == 200, accepted.text
            # Only what an approver needs: reading runs and deciding approvals.
            assert as_approver.get(f"/runs/{run_id}").status_code == 200
            for method, path, body in [
                ("POST", "/runs", {"workflow": "onboarding", "input": {}}),
                ("POST", f"/runs/{run_id}/cancel", {}),
                ("POST", f"/runs/{run_id}/signals/x", {"payload": {}}),
                ("POST", "/events", {"name": "x", "payload": {}}),
                ("GET", "/webhooks", None),
                ("GET", "/admin/tenants", None),
            ]:
                resp = as_approver.request(method, path, json=body)
                assert resp.status_code == 403, (method, path, resp.text)
    finally:
        dev.terminate()
        dev.wait(timeout=30)
