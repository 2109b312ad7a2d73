"""Schedules over real HTTP with two worker processes.

CRUD, validation, tenancy and trigger-now; the two workers' scheduler loops fire a one-off
tick exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.acceptance.conftest import Stack, token
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(300)  # two worker processes on a loaded machine


def _body(**extra: Any) -> dict[str, Any]:
    return {"name": "nightly", "workflow": "acc-echo", "input": {"value": "hi"}, **extra}


def test_schedule_lifecycle_over_http(stack: Stack) -> None:
    stack.start_worker()
    stack.start_worker()
    with stack.client() as c:
        created = c.post("/schedules", json=_body(cron="30 2 * * *", timezone="America/New_York"))
        assert created.status_code == 201, created.text
        sched = created.json()
        sid = sched["schedule_id"]
        assert created.headers["location"] == f"/schedules/{sid}"
        assert sched["state"] == "active" and sched["overlap"] == "skip"
        got = c.get(f"/schedules/{sid}", params={"next": 3}).json()
        ticks = [datetime.fromisoformat(t["tick"]) for t in got["next_fire_times"]]
        assert len(ticks) == 3
        # 02:30 New York time is 06:30 or 07:30 UTC (03:00 local on the spring-forward day).
        assert all(t.astimezone(UTC).hour in (6, 7) for t in ticks)
        assert ticks == sorted(ticks)

        # Bad input: clear 4xx problems, nothing stored.
        for bad, status in [
            (_body(name="b1", cron="* * *"), 422),
            (_body(name="b2", cron="* * * * *", timezone="Mars/Base"), 422),
            (_body(name="b3"), 422),  # neither cron nor at
            (_body(name="b4", cron="* * * * *", workflow="acc-approve", input={"name": 5}), 422),
            (_body(name="b5", cron="* * * * *", workflow="nope"), 404),
            (_body(cron="* * * * *"), 409),  # name taken
            (_body(name="b6", cron="* * * * *", overlap="sometimes"), 422),
            (_body(name="b7\u0000", cron="* * * * *"), 422),
            # absurd steps and numbers: cronsim itself lets these through
            (_body(name="b8", cron="*/99999999999999999999 * * * *"), 422),
            (_body(name="b9", cron="0 */25 * * *"), 422),
            (_body(name="b10", cron="0 0 * * MON/8"), 422),
            (_body(name="b11", cron="0 0 99999999999999999999 * *"), 422),
            (_body(name="b12", cron="0 0 * 13 *"), 422),
        ]:
            resp = c.post("/schedules", json=bad)
            assert resp.status_code == status, (bad, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
        assert len(c.get("/schedules").json()["items"]) == 1

        # Another tenant sees nothing and can touch nothing.
        with stack.client(token(tenant="other")) as o:
            assert o.get(f"/schedules/{sid}").status_code == 404
            assert o.post(f"/schedules/{sid}/trigger").status_code == 404
            assert o.delete(f"/schedules/{sid}").status_code == 404
            assert o.get("/schedules").json()["items"] == []
        assert c.get("/schedules/not-a-uuid").status_code == 404

        paused = c.post(f"/schedules/{sid}/pause").json()
        assert paused["state"] == "paused" and paused["next_fire_times"] == []
        assert c.post(f"/schedules/{sid}/resume").json()["state"] == "active"
        patched = c.patch(f"/schedules/{sid}", json={"cron": "0 9 * * 1-5", "jitter_seconds": 30})
        assert patched.status_code == 200, patched.text
        assert patched.json()["cron"] == "0 9 * * 1-5"
        for cron in ["*/99999999999999999999 * * * *", "5/99 * * * *", "0 0 */32 * *"]:
            bad_patch = c.patch(f"/schedules/{sid}", json={"cron": cron})
            assert bad_patch.status_code == 422, (cron, bad_patch.text)
            assert "bad cron expression" in bad_patch.json()["detail"]
        assert c.get(f"/schedules/{sid}").json()["cron"] == "0 9 * * 1-5"  # nothing stored

        fire = c.post(f"/schedules/{sid}/trigger").json()
        assert fire["outcome"] == "started" and fire["kind"] == "manual"
        run = wait_for_sync(
            lambda: (r := c.get(f"/runs/{fire['run_id']}").json())["status"] == "completed" and r,
            timeout=60,
            what="triggered run completed",
        )
        assert run["idempotency_key"].startswith(f"schedule:{sid}:manual:")

        # A one-off a few seconds ahead: the two workers' scheduler loops race for it.
        at = datetime.now(UTC) + timedelta(seconds=2)
        once = c.post(
            "/schedules", json=_body(name="once", at=at.isoformat(), overlap="allow_all")
        ).json()

        def fired() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/schedules/{once['schedule_id']}").json()
            return body if body["state"] == "completed" else None

        done = wait_for_sync(fired, timeout=60, what="one-off fired")
        assert done["fired_count"] == 1
        fires = c.get(f"/schedules/{once['schedule_id']}/fires").json()["items"]
        assert len(fires) == 1 and fires[0]["kind"] == "once"
        assert abs(datetime.fromisoformat(fires[0]["tick"]) - at) < timedelta(milliseconds=1)
    # The operator CLI goes over the same HTTP API.
    cli = [sys.executable, "-m", "app.cli.main", "schedules"]
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    shown = subprocess.run(
        [*cli, "get", sid, "--next", "2", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)["next_fire_times"]) == 2
    refused = subprocess.run(
        [*cli, "create", "x", "acc-echo", "--cron", "* * *"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # An error answer: exit 1, one line on stderr (status, code, detail).
    assert refused.returncode == 1 and "422" in refused.stderr and "5 fields" in refused.stderr
    refused = subprocess.run(
        [*cli, "create", "x", "acc-echo", "--cron", "*/99999999999999999999 * * * *"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "422" in refused.stderr, refused.stderr
    assert "number too large" in refused.stderr
    gone = subprocess.run(
        [*cli, "delete", sid], env=env, capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 0, gone.stderr
    with stack.client() as c:
        assert c.get(f"/schedules/{sid}").status_code == 404
