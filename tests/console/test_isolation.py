"""What a session may see and do: scopes, tenants, and hostile text escaped."""

from __future__ import annotations

from tests.console.conftest import ConsoleStack, alerts, tok


def test_scopes_and_tenants_are_the_apis(console: ConsoleStack) -> None:
    c = console
    a_token = tok(tenant="acme", subject="alice")
    a_run = c.submit("con-signal", {"text": "acme secret"}, a_token, idempotency_key="acme-key")
    c.wait_status(a_run, "waiting_signal")
    a_approval = c.submit("con-approve", {"note": "acme approval"}, a_token)
    c.wait_status(a_approval, "waiting_approval")

    # A token without runs:read signs in, and sees nothing: the API's 403, no runs.
    eve = tok(tenant="acme", subject="eve", scopes=["signals:write"])
    with c.api(eve) as api:
        who = api.get("/whoami").json()  # any valid token may ask who it is
    assert who == {
        "tenant_id": "acme",
        "subject": "eve",
        "scopes": ["signals:write"],
        "groups": [],
        "api_key": False,
    }
    blind = c.browser(eve)
    page = blind.get("/ui/runs")
    assert page.status_code == 403
    assert "runs:read" in alerts(page.text)[0] and a_run not in page.text
    run_page = blind.get(f"/ui/runs/{a_run}")
    assert run_page.status_code == 403 and "acme secret" not in run_page.text
    assert blind.get(f"/ui/runs/{a_run}/live").status_code == 403
    assert blind.get("/ui/approvals").status_code == 403
    assert blind.get("/ui/runs", params={"q": a_run}).status_code == 403

    # Tenant B: none of A's runs, by list, search, id, fragment or action.
    b = c.browser(tok(tenant="beta", subject="bob", groups=("finance",)))
    listing = b.get("/ui/runs")
    assert listing.status_code == 200 and a_run not in listing.text and "all: 0" in listing.text
    assert a_run not in b.get("/ui/runs", params={"q": "acme-key"}).text
    searched = b.get("/ui/runs", params={"q": a_run})
    assert searched.status_code == 200 and "No runs match." in searched.text
    direct = b.get(f"/ui/runs/{a_run}")
    assert direct.status_code == 404 and "acme secret" not in direct.text
    assert b.get(f"/ui/runs/{a_run}/live").status_code == 404
    inbox = b.get("/ui/approvals")
    assert a_approval not in inbox.text and "Nothing is waiting for you." in inbox.text
    for action, data in [
        ("cancel", {"reason": "x"}),
        ("signal", {"name": "go", "payload": '"from beta"'}),
        ("resume", {}),
    ]:
        shown = b.flash_after(b.act(f"/ui/runs/{a_run}/{action}", data))
        assert shown.startswith("Refused: ") and "not found" in shown, (action, shown)
    with c.api(tok(tenant="beta")) as api:
        step = "sign-off"
        approve = api.post(f"/runs/{a_approval}/approvals/{step}", json={"decision": "approve"})
    assert approve.status_code == 404
    forced = b.act(
        "/ui/approvals/decide", {"run_id": a_approval, "step_id": step, "decision": "approve"}
    )
    assert "not found" in b.flash_after(forced)
    # A's runs are untouched.
    with c.api(a_token) as api:
        assert api.get(f"/runs/{a_run}").json()["status"] == "waiting_signal"
        assert api.get(f"/runs/{a_approval}").json()["status"] == "waiting_approval"
        kinds = [e["kind"] for e in api.get(f"/runs/{a_run}/events").json()["items"]]
    assert "signal_received" not in kinds and "run_cancel_requested" not in kinds


HOSTILE = "<script>alert('x')</script>\x00NUL \u202eevil\u202c \u200bzw \U0001f600 \"quote\" &amp;"


def test_hostile_text_is_escaped_everywhere(console: ConsoleStack) -> None:
    c = console
    # A bidi control is refused in an idempotency key (app.core.text.text_problem); a
    # zero-width space is not, and must be shown escaped.
    run_id = c.submit("con-echo", {"text": HOSTILE}, idempotency_key="<b>key</b>\u200b")
    c.wait_status(run_id, "completed")
    failing = c.submit("con-fail", {"text": HOSTILE})
    c.wait_status(failing, "failed")
    asking = c.submit("con-approve", {"note": HOSTILE}, tok(subject="someone-else"))
    c.wait_status(asking, "waiting_approval")
    b = c.browser(tok())
    pages = [
        b.get(f"/ui/runs/{run_id}"),
        b.get(f"/ui/runs/{run_id}/live"),
        b.get(f"/ui/runs/{failing}"),
        b.get("/ui/runs"),
        b.get("/ui/runs", params={"q": "<b>key</b>\u200b"}),
        b.get("/ui/approvals"),
        b.get("/ui/runs", params={"workflow": "<script>x</script>"}),
        b.get("/ui/runs", params={"q": "<b>key</b>\u202e"}),  # the page's own 422
    ]
    assert pages[-1].status_code == 422, pages[-1].text[-2000:]
    for page in pages:
        assert page.status_code in (200, 422), page.status_code
        text = page.text
        assert "<script>alert" not in text and "<b>key" not in text
        assert "\x00" not in text and "\u202e" not in text and "\u200b" not in text
        assert "\ufffd" not in text
    run_page = pages[0].text
    assert "&lt;script&gt;alert(" in run_page
    assert "\\u0000NUL" in run_page and "\\u202eevil" in run_page and "\\u200bzw" in run_page
    assert "\U0001f600" in run_page  # ordinary characters stay as they are
    assert "&amp;amp;" in run_page
    assert "&lt;b&gt;key&lt;/b&gt;\\u200b" in pages[4].text  # the search box echoes it escaped
    assert "exploded: &lt;script&gt;" in pages[2].text
    assert "&lt;script&gt;alert(" in pages[5].text  # the approval's payload
    # The sign-in form with a hostile next: escaped, and not followed.
    login = c.browser().get("/ui/login", params={"next": '/ui/"><script>x</script>'})
    assert "<script>x" not in login.text
