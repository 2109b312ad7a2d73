"""The *Dead letters* page over real HTTP: list, filters, paging, requeue, refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.auth.principal import Scope
from tests.acceptance.conftest import Stack, token
from tests.console.pages.conftest import Browser, new_browser
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(400)  # an API and a worker process on a loaded machine

HOSTILE = "<script>alert(1)</script> \u202egnp.exe Zoë"


def _fail(stack: Stack, tenant: str, name: str) -> str:
    with stack.client(token(tenant)) as c:
        resp = c.post("/runs", json={"workflow": "acc-fail", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _pending(stack: Stack, tenant: str, count: int) -> list[dict[str, Any]]:
    with stack.client(token(tenant)) as c:

        def probe() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = c.get("/dead-letters", params={"limit": 200}).json()[
                "items"
            ]
            return items if len(items) >= count else None

        return wait_for_sync(probe, timeout=90, what=f"{count} dead letters of {tenant}")


def _status(stack: Stack, dead_letter_id: str) -> str:
    with stack.client() as c:
        items = c.get("/dead-letters", params={"status": "all", "limit": 200}).json()["items"]
    return next(str(d["status"]) for d in items if d["dead_letter_id"] == dead_letter_id)


def test_dead_letters_page(console: Stack, browser: Browser) -> None:
    runs = [_fail(console, "acme", f"job-{i}") for i in range(2)]
    runs.append(_fail(console, "acme", HOSTILE))
    other = _fail(console, "globex", "globex-secret-job")
    letters = _pending(console, "acme", 3)
    _pending(console, "globex", 1)

    page = browser.get("/ui/dead-letters")
    assert page.status_code == 200, page.text
    assert page.text.count("<h1>") == 1
    for run_id in runs:
        assert f'href="/ui/runs/{run_id}"' in page.text
    assert other not in page.text and "globex-secret-job" not in page.text
    # Hostile text from the error message is escaped, the invisible override made visible.
    assert "<script>alert(1)" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text, page.text[
        page.text.find("<tbody>") :
    ][:3000]
    assert "\u202e" not in page.text and "\\u202e" in page.text

    # Paging with the API's page token: two a page, then the rest, no run twice.
    first = browser.get("/ui/dead-letters", limit="2")
    nxt = re.search(r'href="(/ui/dead-letters\?[^"]*page_token=[^"]*)">Next page', first.text)
    assert nxt, first.text
    second = browser.get(nxt.group(1).replace("&amp;", "&"))
    seen = [r for r in runs if r in first.text] + [r for r in runs if r in second.text]
    assert sorted(seen) == sorted(runs)
    assert "First page" in second.text

    # Filters: another workflow shows none; a malformed one is the API's 422, as an alert.
    assert "No dead letters match." in browser.get("/ui/dead-letters", workflow="acc-echo").text
    # A workflow the API refuses (not its name alphabet) is its refusal as an alert; one
    # holding a NUL is refused by the page's own query rules (422 page, docs/console.md).
    bad = browser.get("/ui/dead-letters", workflow="a<b>")
    assert bad.status_code == 200 and 'role="alert"' in bad.text
    assert "<b>" not in bad.text
    nul = browser.get("/ui/dead-letters", workflow="a\x00<b>")
    assert nul.status_code == 422 and "<code>query.workflow</code>" in nul.text, nul.text[-2000:]
    assert "<b>" not in nul.text and "\x00" not in nul.text

    target = str(letters[0]["dead_letter_id"])
    action = f"/ui/dead-letters/{target}/requeue"
    form = {"reason": "provider fixed", "correlation_id": "INC-1"}
    # CSRF: missing or wrong → 403, nothing done (even with confirm=yes).
    for csrf in ("", "wrong"):
        refused = browser.post(action, {**form, "confirm": "yes"}, csrf=csrf)
        assert refused.status_code == 403, refused.text
    assert _status(console, target) == "pending"
    # The first POST only asks for confirmation.
    ask = browser.post(action, form)
    assert ask.status_code == 200 and ">Requeue</button>" in ask.text
    assert _status(console, target) == "pending"
    # An empty reason: the API's refusal, shown as an alert; nothing done.
    empty = browser.follow(browser.act(action, {"reason": ""}))
    assert 'role="alert"' in empty.text and "Not requeued" in empty.text
    assert _status(console, target) == "pending"
    # Confirmed: requeued through the API, a status message.
    done = browser.follow(browser.act(action, form))
    assert re.search(r'role="status"[^>]*>Requeued dead letter ' + target, done.text), done.text
    assert _status(console, target) == "requeued"
    # Again: the API's 409 in role=alert.
    again = browser.follow(browser.act(action, form))
    assert re.search(r'role="alert"[^>]*>Not requeued: ', again.text), again.text

    # Another tenant can neither see nor requeue acme's dead letter.
    globex = new_browser(console, token("globex"))
    try:
        page = globex.get("/ui/dead-letters")
        assert all(r not in page.text for r in runs)
        hostile_id = str(letters[1]["dead_letter_id"])
        out = globex.follow(globex.act(f"/ui/dead-letters/{hostile_id}/requeue", form))
        assert 'role="alert"' in out.text and "not found" in out.text
        assert _status(console, hostile_id) == "pending"
    finally:
        globex.close()

    # Read-only: sees the list, the requeue is the API's 403 as an alert.
    reader = new_browser(console, token("acme", "rita", [Scope.RUNS_READ]))
    try:
        hostile_id = str(letters[1]["dead_letter_id"])
        assert hostile_id in reader.get("/ui/dead-letters").text
        out = reader.follow(reader.act(f"/ui/dead-letters/{hostile_id}/requeue", form))
        assert 'role="alert"' in out.text and "runs:write" in out.text
        assert _status(console, hostile_id) == "pending"
    finally:
        reader.close()
    # No runs:read: the API's refusal on the page, not a 500.
    blind = new_browser(console, token("acme", "bob", [Scope.SIGNALS_WRITE]))
    try:
        page = blind.get("/ui/dead-letters")
        assert page.status_code == 403 and "runs:read" in page.text
        assert all(r not in page.text for r in runs)
    finally:
        blind.close()
