"""Sign-in, session cookies, sign-out and CSRF of the console, over real HTTP."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
from sqlalchemy import select

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.db.database import Database
from app.db.tables import console_sessions
from tests.conftest import make_settings
from tests.console.conftest import Browser, ConsoleStack, alerts, field, tok


def _api_detail(c: ConsoleStack, token: str) -> str:
    # The API's own words for a token, to compare with what the console shows.
    r = httpx.get(c.url + "/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 401, r.text
    return str(r.json()["detail"])


async def test_sign_in_cookie_and_sign_out(
    console: ConsoleStack, database_url: str, tmp_path: Path
) -> None:
    c = console
    anon = c.browser()
    # Entry points: / → /ui/ → /ui/runs → sign-in.
    assert anon.get("/").status_code == 307 and anon.get("/").headers["location"] == "/ui/"
    assert anon.get("/ui/").headers["location"] == "/ui/runs"
    to_login = anon.get("/ui/runs?status=failed")
    assert to_login.status_code == 303
    assert to_login.headers["location"] == "/ui/login?next=%2Fui%2Fruns%3Fstatus%3Dfailed"
    form = anon.get("/ui/login")
    assert '<label for="token">API key or token</label>' in form.text
    assert '<input id="token" name="token" type="password"' in form.text
    assert ">Sign in</button>" in form.text
    assert "frame-ancestors 'none'" in form.headers["content-security-policy"]

    # Refused tokens: the form again, 401, with the API's message; no session cookie.
    bad_tokens = {
        "garbage": "not-a-token",
        "forged": DevTokens("f" * 32).mint(tenant_id="acme", subject="alice", scopes=ALL_SCOPES),
        "expired": DevTokens(c.stack.env["TREADLE_DEV_SECRET"]).mint(
            tenant_id="acme", subject="alice", scopes=ALL_SCOPES, ttl_seconds=-3600
        ),
        "unknown key": "trd_abcdefgh_" + "x" * 43,
    }
    for what, bad in bad_tokens.items():
        b = c.browser()
        answer = b.sign_in(bad)
        assert answer.status_code == 401, (what, answer.text[:500])
        assert alerts(answer.text) == [_api_detail(c, bad)], what
        assert "treadle_console=" not in answer.headers.get("set-cookie", ""), what
        assert b.get("/ui/runs").status_code == 303, what

    # A sign-in form without its login CSRF cookie value: refused, no session.
    b = c.browser()
    b.get("/ui/login")
    forged_form = b.post("/ui/login", {"token": tok(), "login_csrf": "wrong", "next": ""})
    assert forged_form.status_code == 403 and "treadle_console=" not in forged_form.headers.get(
        "set-cookie", ""
    )

    # A good token: 303 to a safe next, and the cookie's flags.
    user = c.browser()
    good = tok()
    signed = user.sign_in(good, next_url="/ui/runs?status=failed")
    assert signed.status_code == 303 and signed.headers["location"] == "/ui/runs?status=failed"
    cookie_header = next(
        h for h in signed.headers.get_list("set-cookie") if h.startswith("treadle_console=")
    )
    flags = [p.strip().lower() for p in cookie_header.split(";")]
    assert "httponly" in flags and "samesite=lax" in flags and "path=/ui" in flags
    assert "secure" not in flags  # plain http here; https requests get Secure
    session_id = cookie_header.split(";")[0].split("=", 1)[1]
    assert len(session_id) >= 43
    page = user.get("/ui/runs")
    assert page.status_code == 200 and page.text.count("<h1>") == 1
    for text, href in [
        ("Runs", "/ui/runs"),
        ("Approvals", "/ui/approvals"),
        ("Dead letters", "/ui/dead-letters"),
        ("Schedules", "/ui/schedules"),
        ("Workflows", "/ui/workflows"),
    ]:
        assert f'href="{href}"' in page.text and f">{text}</a>" in page.text
    assert page.headers["cache-control"] == "no-store"
    missing = user.get("/ui/no-such-page")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    css = user.get("/ui/static/console.css")
    assert css.status_code == 200 and ":focus-visible" in css.text
    assert user.get("/ui/static/console.js").status_code == 200

    # The database holds the id's hash and a sealed token, never the id or the token.
    db = Database(make_settings(database_url, tmp_path))
    try:
        async with db.read() as conn:
            rows = (await conn.execute(select(console_sessions))).mappings().all()
    finally:
        await db.dispose()
    id_hash = hashlib.sha256(session_id.encode()).hexdigest()
    mine = [r for r in rows if r["id_hash"] == id_hash]
    assert len(mine) == 1 and mine[0]["subject"] == "alice" and mine[0]["tenant_id"] == "acme"
    for r in rows:
        assert good not in r["token_ciphertext"] and session_id not in str(dict(r))

    # A background refresh does not count as activity; a page view does.
    async def last_seen() -> object:
        db = Database(make_settings(database_url, tmp_path))
        try:
            async with db.read() as conn:
                stmt = select(console_sessions.c.last_seen_at).where(
                    console_sessions.c.id_hash == id_hash
                )
                return (await conn.execute(stmt)).scalar_one()
        finally:
            await db.dispose()

    before = await last_seen()
    refresh = user.get("/ui/runs/table", headers={"X-Console-Fragment": "1"})
    assert refresh.status_code == 200 and "<html" not in refresh.text
    assert await last_seen() == before
    assert user.get("/ui/runs").status_code == 200
    assert await last_seen() != before

    # Open redirects are refused: next must be a console path.
    other = c.browser()
    for evil in ["https://evil.example/", "//evil.example/ui/", "/ui/\\evil", "/elsewhere"]:
        assert other.sign_in(good, next_url=evil).headers["location"] == "/ui/runs"

    # Sign-out needs the CSRF token; without it nothing happens.
    csrf = user.csrf()
    refused = user.post("/ui/logout", {"csrf_token": "nope"})
    assert refused.status_code == 403 and alerts(refused.text)
    assert user.get("/ui/runs").status_code == 200
    out = user.post("/ui/logout", {"csrf_token": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert 'treadle_console=""' in out.headers["set-cookie"]
    # The old cookie, replayed by another client, is refused: the row is gone.
    replay = Browser(c.url)
    try:
        replay.http.cookies.set("treadle_console", session_id, path="/ui")
        assert replay.get("/ui/runs").status_code == 303
    finally:
        replay.close()
    assert user.get("/ui/runs").status_code == 303

    # The ready line names the console's URL.
    assert f"console {c.url}/ui/" in c.stack.logs[0].read_text()


def test_csrf_token_is_checked_on_every_action(console: ConsoleStack) -> None:
    c = console
    run_id = c.submit("con-signal", {"text": "csrf"})
    c.wait_status(run_id, "waiting_signal")
    b = c.browser(tok())
    page = b.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200
    csrf = field(page.text, "csrf_token")
    for action, data in [
        ("cancel", {"confirm": "yes"}),
        ("signal", {"name": "go", "payload": "1", "confirm": "yes"}),
        ("resume", {"confirm": "yes"}),
    ]:
        for sent in ({}, {"csrf_token": ""}, {"csrf_token": csrf[:-1] + "x"}):
            answer = b.post(f"/ui/runs/{run_id}/{action}", {**data, **sent})
            assert answer.status_code == 403, (action, sent, answer.text[:300])
            assert "nothing was done" in " ".join(alerts(answer.text))
    decided = b.post(
        "/ui/approvals/decide",
        {"run_id": run_id, "step_id": "x", "decision": "approve", "confirm": "yes"},
    )
    assert decided.status_code == 403
    # Nothing happened: still waiting, no signal received, no cancel requested.
    with c.api() as api:
        assert api.get(f"/runs/{run_id}").json()["status"] == "waiting_signal"
        kinds = [e["kind"] for e in api.get(f"/runs/{run_id}/events").json()["items"]]
    assert "signal_received" not in kinds and "run_cancel_requested" not in kinds
