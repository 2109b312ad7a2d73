"""*Start a run* over real HTTP: the form generated from the schema, POST /runs, errors.

The onboarding example is started from its form and runs on a real worker to its
approval wait.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from app.auth.principal import Scope
from tests.acceptance.conftest import Stack, token
from tests.console.pages.conftest import Browser, new_browser
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(400)  # an API and a worker process on a loaded machine

HOSTILE = "Zoë\x00 <script>alert(1)</script> \u202eGmbH"


def _runs(stack: Stack, workflow: str, tenant: str = "acme") -> list[dict[str, Any]]:
    with stack.client(token(tenant)) as c:
        items: list[dict[str, Any]] = c.get("/runs", params={"workflow": workflow}).json()["items"]
        return items


def _fields(page: str) -> dict[str, str]:
    """Label text → input name of the generated form."""
    out = {}
    for name, label in re.findall(r'<label for="(f\d+)">(.*?)</label>', page, re.S):
        out[html.unescape(re.sub(r"<[^>]+>", "", label)).strip()] = name
    return out


def _run_id(resp: Any) -> str:
    assert resp.status_code == 303, resp.text
    match = re.fullmatch(r"/ui/runs/([0-9a-f-]{36})", resp.headers["location"])
    assert match, resp.headers["location"]
    return match.group(1)


def test_start_onboarding_from_the_form(console: Stack, browser: Browser) -> None:
    form = browser.get("/ui/workflows/onboarding/start")
    assert form.status_code == 200 and form.text.count("<h1>") == 1
    fields = _fields(form.text)
    assert {
        "Customer Id (required)",
        "Company (required)",
        "Email (required)",
        "Plan",
        "Approval Timeout Seconds",
        "Docs Timeout Seconds",
    } == set(fields)
    assert f'name="{fields["Plan"]}" type="text" value="starter"' in form.text
    assert ">Start run</button>" in form.text
    typed = {
        fields["Customer Id (required)"]: "cust-<b>1</b>",
        fields["Company (required)"]: "",
        fields["Email (required)"]: "ops@zoe.example",
        fields["Plan"]: "growth",
    }
    action = "/ui/workflows/onboarding/start"

    # CSRF missing or wrong: 403, nothing started.
    for csrf in ("", "wrong"):
        assert browser.post(action, typed, csrf=csrf).status_code == 403
    # The API's 422 (company too short) next to the form, which keeps what was typed.
    refused = browser.post(action, typed)
    assert refused.status_code == 422, refused.text
    assert re.search(r'role="alert"[^>]*>Not started: ', refused.text), refused.text
    assert "company" in refused.text
    assert 'value="cust-&lt;b&gt;1&lt;/b&gt;"' in refused.text and "<b>1</b>" not in refused.text
    assert 'value="growth"' in refused.text
    assert _runs(console, "onboarding") == []

    # Valid: POST /runs through the API, then the run's page with a status message.
    typed[fields["Company (required)"]] = HOSTILE
    started = browser.post(action, {**typed, "idempotency_key": "form-key-1"})
    run_id = _run_id(started)
    with console.client() as c:
        run = c.get(f"/runs/{run_id}").json()
    assert run["workflow"] == "onboarding" and run["idempotency_key"] == "form-key-1"
    assert run["input"]["company"] == HOSTILE and run["input"]["plan"] == "growth"
    assert run["input"]["customer_id"] == "cust-<b>1</b>"
    assert "approval_timeout_seconds" not in run["input"]  # empty: the schema default
    shown = browser.get("/ui/runs")
    assert re.search(rf'role="status"[^>]*>Run {run_id} of onboarding v\d+ started', shown.text)
    # The example runs on the worker to its approval wait.
    with console.client() as c:
        wait_for_sync(
            lambda: c.get(f"/runs/{run_id}").json()["status"] == "waiting_approval",
            timeout=90,
            what="onboarding waiting for its approval",
        )
    # Same key, same request: the same run.
    again = browser.post(action, {**typed, "idempotency_key": "form-key-1"})
    assert _run_id(again) == run_id
    assert len(_runs(console, "onboarding")) == 1

    # Read-only token: the API's 403 on the form, nothing started.
    reader = new_browser(console, token("acme", "rita", [Scope.RUNS_READ]))
    try:
        reader.get(action)
        out = reader.post(action, typed)
        assert out.status_code == 403 and re.search(r'role="alert"[^>]*>Not started: ', out.text)
        assert "runs:write" in out.text and 'value="growth"' in out.text
    finally:
        reader.close()
    assert len(_runs(console, "onboarding")) == 1
    # Another tenant's start is its own run: acme's list does not show it.
    globex = new_browser(console, token("globex"))
    try:
        globex.get(action)
        theirs = _run_id(globex.post(action, {**typed, "idempotency_key": "form-key-1"}))
    finally:
        globex.close()
    assert theirs != run_id and theirs not in browser.get("/ui/runs").text
    # No runs:read: the API's refusal page, not a 500.
    blind = new_browser(console, token("acme", "bob", [Scope.SIGNALS_WRITE]))
    try:
        page = blind.get(action)
        assert page.status_code == 403 and "runs:read" in page.text
    finally:
        blind.close()


def test_start_form_json_fields_versions_and_errors(console: Stack, browser: Browser) -> None:
    action = "/ui/workflows/console-form/start"
    form = browser.get(action)
    fields = _fields(form.text)
    assert set(fields) == {
        "Title (required)",
        "Count (required)",
        "Ratio",
        "Urgent",
        "Color",
        "Tags (JSON)",
        "Address (required) (JSON)",
        "Note",
    }
    # Nested object and array: JSON textareas with a skeleton; the enum a select.
    address = fields["Address (required) (JSON)"]
    assert re.search(
        rf'<textarea id="{address}" name="{address}" rows="6">\{{\s*&#34;street&#34;: &#34;&#34;,'
        r"\s*&#34;zip_code&#34;: &#34;&#34;\s*\}</textarea>",
        form.text,
    ), form.text
    assert '<option value="&#34;green&#34;" selected>green</option>' in form.text
    # Hostile schema description: escaped, invisible override made visible.
    assert "<script>alert('schema')" not in form.text and "&lt;script&gt;" in form.text
    assert "\u202e" not in form.text and "\\u202e" in form.text

    typed = {
        fields["Title (required)"]: "T",
        fields["Count (required)"]: "3",
        fields["Urgent"]: "true",
        fields["Color"]: '"red"',
        fields["Tags (JSON)"]: '["a", "b"]',
        address: '{"street": "Main 1", "zip_code": ',  # malformed
    }
    bad = browser.post(action, typed)
    assert bad.status_code == 422
    assert re.search(r'role="alert"[^>]*>Address is not valid JSON', bad.text), bad.text
    assert "&#34;zip_code&#34;: </textarea>" in bad.text  # what was typed, kept
    assert _runs(console, "console-form") == []
    # A count that is no number: the API's schema error, naming the field.
    typed[address] = '{"street": "Main 1", "zip_code": "75001"}'
    nan = browser.post(action, {**typed, fields["Count (required)"]: "three"})
    assert nan.status_code == 422 and "count" in nan.text and 'value="three"' in nan.text
    assert _runs(console, "console-form") == []

    run_id = _run_id(browser.post(action, typed))
    with console.client() as c:
        done = wait_for_sync(
            lambda: (r := c.get(f"/runs/{run_id}").json())["status"] == "completed" and r,
            timeout=90,
            what="console-form completed",
        )
    assert done["output"] == {
        "title": "T",
        "count": 3,
        "ratio": 0.5,
        "urgent": True,
        "color": "red",
        "tags": ["a", "b"],
        "address": {"street": "Main 1", "zip_code": "75001"},
        "note": None,
    }

    # ?version= pins a registered version; unknown ones are a 404 page.
    pinned = browser.get("/ui/workflows/acc-migrate/start", version="1")
    assert 'name="version" value="1"' in pinned.text
    (name,) = _fields(pinned.text).values()
    run_id = _run_id(browser.post("/ui/workflows/acc-migrate/start", {"version": "1", name: "x"}))
    with console.client() as c:
        assert c.get(f"/runs/{run_id}").json()["version"] == "1"
    assert browser.get("/ui/workflows/acc-migrate/start", version="9").status_code == 404
    # No properties: one textarea for the whole input, malformed JSON refused here.
    whole = browser.get("/ui/workflows/console-empty/start")
    assert '<label for="input_json">Input (JSON)</label>' in whole.text
    assert re.search(
        r'<textarea id="input_json" name="input_json"[^>]*>\{\}</textarea>', whole.text
    )
    bad = browser.post("/ui/workflows/console-empty/start", {"input_json": '{"a": <script>'})
    assert bad.status_code == 422 and "The input is not valid JSON (line 1" in bad.text
    assert "<script>" not in bad.text and "&#34;a&#34;: &lt;script&gt;</textarea>" in bad.text
    for text in ('{"x": 1, "x": 2}', '["a", "\\ud800"]', "[" * 3000 + "]" * 3000):
        refused = browser.post("/ui/workflows/console-empty/start", {"input_json": text})
        assert refused.status_code == 422 and "nothing was submitted" in refused.text, text[:20]
    assert _runs(console, "console-empty") == []
    run_id = _run_id(browser.post("/ui/workflows/console-empty/start", {"input_json": " {} "}))
    assert [r["run_id"] for r in _runs(console, "console-empty")] == [run_id]
    assert browser.get("/ui/workflows/nope/start").status_code == 404
    assert browser.post("/ui/workflows/nope/start", {}).status_code == 404
