"""The *Schedules* pages over real HTTP: list, state filter, detail, pause/resume/trigger."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest

from app.auth.principal import Scope
from tests.acceptance.conftest import Stack, token
from tests.console.pages.conftest import Browser, new_browser

pytestmark = pytest.mark.timeout(400)  # an API and a worker process on a loaded machine

# Schedule names are identifiers (the API refuses others); hostile text goes in the input
# the detail page shows and in the form fields the confirm step echoes.
HOSTILE = "<script>alert(1)</script> \u202eevil Zoë"


def _create(stack: Stack, tenant: str, name: str, **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "workflow": "acc-echo",
        "input": {"value": HOSTILE},
        "cron": "30 2 * * *",
        "timezone": "Europe/Paris",
        **extra,
    }
    with stack.client(token(tenant)) as c:
        resp = c.post("/schedules", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())


def _api(stack: Stack, path: str, **params: Any) -> Any:
    with stack.client() as c:
        resp = c.get(path, params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()


def test_schedules_pages(console: Stack, browser: Browser) -> None:
    hostile = _create(console, "acme", "nightly")
    plain = _create(console, "acme", "hourly", cron="0 * * * *")
    paused = _create(console, "acme", "weekly", cron="0 9 * * 1")
    with console.client() as c:
        assert c.post(f"/schedules/{paused['schedule_id']}/pause").status_code == 200
    other = _create(console, "globex", "globex-secret-schedule")

    page = browser.get("/ui/schedules")
    assert page.status_code == 200 and page.text.count("<h1>") == 1
    for s in (hostile, plain, paused):
        assert f'href="/ui/schedules/{s["schedule_id"]}"' in page.text
    assert "globex-secret-schedule" not in page.text and other["schedule_id"] not in page.text
    # State filter and the API's paging.
    only_paused = browser.get("/ui/schedules", state="paused").text
    assert paused["schedule_id"] in only_paused and plain["schedule_id"] not in only_paused
    first = browser.get("/ui/schedules", limit="2").text
    nxt = re.search(r'href="(/ui/schedules\?[^"]*page_token=[^"]*)">Next page', first)
    assert nxt, first
    second = browser.get(nxt.group(1).replace("&amp;", "&")).text
    ids = [s["schedule_id"] for s in (hostile, plain, paused)]
    assert sorted(i for i in ids if i in first or i in second) == sorted(ids)
    assert not any(i in first and i in second for i in ids)

    # Detail: the API's next ten fire times, no fires yet, the input escaped.
    sid = hostile["schedule_id"]
    detail = browser.get(f"/ui/schedules/{sid}")
    assert detail.status_code == 200, detail.text
    ticks = _api(console, f"/schedules/{sid}", next=10)["next_fire_times"]
    assert len(ticks) == 10
    for t in ticks:
        assert f'datetime="{datetime.fromisoformat(t["fire_at"]).isoformat()}"' in detail.text
    assert "Not fired yet." in detail.text
    assert "<script>alert(1)" not in detail.text and "&lt;script&gt;alert(1)" in detail.text
    assert "\u202e" not in detail.text and "\\u202e" in detail.text

    # Trigger now: CSRF first, then the confirm step, then it fires once.
    action = f"/ui/schedules/{sid}/trigger"
    for csrf in ("", "wrong"):
        assert browser.post(action, {"confirm": "yes"}, csrf=csrf).status_code == 403
    ask = browser.post(action, {"name": HOSTILE})
    assert ask.status_code == 200 and ">Trigger now</button>" in ask.text
    assert "<script>alert(1)" not in ask.text and "&lt;script&gt;alert(1)" in ask.text
    assert _api(console, f"/schedules/{sid}/fires")["items"] == []
    done = browser.follow(browser.act(action, {"name": HOSTILE}))
    fires = _api(console, f"/schedules/{sid}/fires")["items"]
    assert len(fires) == 1 and fires[0]["kind"] == "manual"
    run_id = fires[0]["run_id"]
    assert re.search(r'role="status"[^>]*>Triggered: started, run ' + run_id, done.text)
    assert f'href="/ui/runs/{run_id}"' in done.text

    # Pause, then "Resume schedule", each confirmed; the page offers the other.
    assert ">Pause</button>" in done.text
    out = browser.follow(browser.act(f"/ui/schedules/{sid}/pause", {"name": "x"}))
    assert _api(console, f"/schedules/{sid}")["state"] == "paused"
    assert 'role="status"' in out.text and ">Resume schedule</button>" in out.text
    assert "None: the schedule is paused." in out.text
    browser.follow(browser.act(f"/ui/schedules/{sid}/resume", {"name": "x"}))
    assert _api(console, f"/schedules/{sid}")["state"] == "active"
    # No such action, no such schedule.
    assert browser.post(f"/ui/schedules/{sid}/delete", {}).status_code == 404
    assert browser.get("/ui/schedules/not-a-uuid").status_code == 404

    # Another tenant: 404 for the detail, the action refused, nothing done.
    globex = new_browser(console, token("globex"))
    try:
        assert sid not in globex.get("/ui/schedules").text
        assert globex.get(f"/ui/schedules/{sid}").status_code == 404
        out = globex.follow(globex.act(f"/ui/schedules/{sid}/pause", {"name": "x"}))
        assert 'role="alert"' in out.text
        assert _api(console, f"/schedules/{sid}")["state"] == "active"
    finally:
        globex.close()
    # Read-only: the API's 403 as an alert; no runs:read: the API's refusal page.
    reader = new_browser(console, token("acme", "rita", [Scope.RUNS_READ]))
    try:
        out = reader.follow(reader.act(f"/ui/schedules/{sid}/pause", {"name": "x"}))
        assert re.search(r'role="alert"[^>]*>Pause refused: .*runs:write', out.text), out.text
        assert _api(console, f"/schedules/{sid}")["state"] == "active"
    finally:
        reader.close()
    blind = new_browser(console, token("acme", "bob", [Scope.SIGNALS_WRITE]))
    try:
        page = blind.get("/ui/schedules")
        assert page.status_code == 403 and "runs:read" in page.text
        assert blind.get(f"/ui/schedules/{sid}").status_code == 403
    finally:
        blind.close()
