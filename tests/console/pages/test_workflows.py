"""The *Workflows* page over real HTTP: versions, schemas, live workers, open/blocked runs."""

from __future__ import annotations

import re
import signal

import pytest

from app.auth.principal import Scope
from tests.acceptance.conftest import Stack, token
from tests.console.pages.conftest import Browser, new_browser
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(400)  # an API and a worker process on a loaded machine


def _cell(page: str, version: str, label: str) -> str:
    row = re.search(rf'<tr data-version="{re.escape(version)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {version}"
    cell = re.search(rf'<td data-label="{label}">([^<]*)</td>', row.group(1))
    assert cell, row.group(1)
    return cell.group(1)


def _submit(stack: Stack, tenant: str, workflow: str, version: int | None = None) -> str:
    body: dict[str, object] = {"workflow": workflow, "input": {"name": "w"}}
    if version is not None:
        body["version"] = version
    with stack.client(token(tenant)) as c:
        resp = c.post("/runs", json=body)
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def test_workflows_page(console: Stack, browser: Browser) -> None:
    for _ in range(2):
        _submit(console, "acme", "acc-migrate", 1)  # each waits on an approval: open
    _submit(console, "globex", "acc-migrate", 2)
    with console.client() as c:
        api = c.get("/workflows").json()["items"]
    worker = console.workers[0]

    page = browser.get("/ui/workflows")
    assert page.status_code == 200 and page.text.count("<h1>") == 1
    names = {wf["name"] for wf in api}
    assert {"onboarding", "acc-migrate", "console-form"} <= names
    for wf in api:
        for v in wf["versions"]:
            key = f"{wf['name']}@{v['version']}"
            assert f'href="/ui/workflows/{wf["name"]}/start?version={v["version"]}"' in page.text
            assert _cell(page.text, key, "Open runs") == str(v["open_runs"])
            assert _cell(page.text, key, "Blocked runs") == str(v["blocked_runs"])
            for w in v["live_workers"]:
                assert f"<li>{w}</li>" in page.text
    assert any(f":{worker.pid}:" in w for w in re.findall(r"<li>([^<]*)</li>", page.text))
    # Open runs are the tenant's own: acme has two at v1 and none at v2 (globex's one).
    assert _cell(page.text, "acc-migrate@1", "Open runs") == "2"
    assert _cell(page.text, "acc-migrate@2", "Open runs") == "0"
    # Input schemas, pretty and collapsible, hostile descriptions escaped.
    assert '<details class="json">' in page.text and "<summary>Input schema</summary>" in page.text
    assert "<script>alert(" not in page.text and "&lt;script&gt;alert(" in page.text
    assert "\u202e" not in page.text and "\\u202e" in page.text

    globex = new_browser(console, token("globex"))
    try:
        other = globex.get("/ui/workflows").text
        assert _cell(other, "acc-migrate@1", "Open runs") == "0"
        assert _cell(other, "acc-migrate@2", "Open runs") == "1"
    finally:
        globex.close()
    blind = new_browser(console, token("acme", "bob", [Scope.SIGNALS_WRITE]))
    try:
        refused = blind.get("/ui/workflows")
        assert refused.status_code == 403 and "runs:read" in refused.text
    finally:
        blind.close()

    # With the worker gone, a new run has no live worker: blocked, and the page says so.
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    _submit(console, "acme", "acc-hold")

    def blocked() -> bool:
        with console.client() as c:
            items = c.get("/workflows").json()["items"]
        hold = next(wf for wf in items if wf["name"] == "acc-hold")["versions"][0]
        return hold["blocked_runs"] == 1 and not hold["live_workers"]

    wait_for_sync(blocked, timeout=60, what="acc-hold run blocked")
    page = browser.get("/ui/workflows")
    assert _cell(page.text, "acc-hold@1", "Blocked runs") == "1"
    assert _cell(page.text, "acc-hold@1", "Open runs") == "1"
