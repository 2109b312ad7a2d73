"""Every console form refuses another origin (login CSRF included), over real HTTP.

A page on another port of the host or on a sibling subdomain can plant cookies (they
separate by neither), so no cookie-bound token alone stops it; the browser's
``Sec-Fetch-Site`` / ``Origin`` headers can't be planted (app/console/origin.py). These
tests send what Chromium sends for such a page's auto-posted form.
"""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi.routing import APIRoute

from app.console import PREFIX
from app.console.pages import ROUTERS
from tests.acceptance.conftest import Stack, token
from tests.console.conftest import Browser, alerts, field

# What the browser says about a form auto-posted by a page elsewhere: a sibling port or
# subdomain (same-site), another site, or an old browser's Origin alone.
FOREIGN = [
    {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    {"Origin": "http://127.0.0.1:1"},
    {"Origin": "null"},
]


def console_posts() -> list[str]:
    """Every POST path of the console's page modules, path parameters filled in."""
    paths = [
        PREFIX + re.sub(r"\{[^}]+\}", "x", route.path)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute) and "POST" in (route.methods or set())
    ]
    assert "/ui/login" in paths and "/ui/logout" in paths and len(paths) > 8, paths
    return sorted(paths)


def test_every_console_post_refuses_a_form_from_another_origin(console_api: Stack) -> None:
    victim = Browser(console_api.url)
    try:
        assert victim.sign_in(token()).status_code == 303
        csrf = victim.csrf()
        for path in console_posts():
            for headers in FOREIGN:
                # The victim's own session and CSRF token ride along, as they would.
                answer = victim.http.post(
                    path, data={"csrf_token": csrf, "confirm": "yes"}, headers=headers
                )
                assert answer.status_code == 403, (path, headers, answer.text[:500])
                assert "cross_origin_refused" in answer.text, (path, answer.text[:500])
                assert "nothing was done" in " ".join(alerts(answer.text))
        # Still signed in (the sign-out form from elsewhere did nothing), and the same
        # form from the console's own page works.
        assert victim.get("/ui/runs").status_code == 200
        own = {"Sec-Fetch-Site": "same-origin", "Origin": console_api.url}
        out = victim.http.post("/ui/logout", data={"csrf_token": csrf}, headers=own)
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    finally:
        victim.close()


@pytest.mark.parametrize("headers", FOREIGN, ids=["same-site", "cross-site", "origin", "null"])
def test_login_csrf_with_the_attackers_own_valid_form_signs_nobody_in(
    console_api: Stack, headers: dict[str, str]
) -> None:
    """The attacker's own sign-in form (nonce cookie + signed field), replayed elsewhere."""
    attacker = Browser(console_api.url)
    victim = Browser(console_api.url)
    try:
        form = attacker.get("/ui/login")
        nonce = attacker.http.cookies["treadle_console_login"]
        # Planted in the victim's browser by the sibling page; posted by its form.
        victim.http.cookies.set("treadle_console_login", nonce, path="/ui/login")
        answer = victim.http.post(
            "/ui/login",
            data={
                "token": token("evil", "mallory"),
                "login_csrf": field(form.text, "login_csrf"),
                "next": "/ui/runs",
            },
            headers=headers,
        )
        assert answer.status_code == 403, answer.text[:500]
        assert not any("treadle_console=" in h for h in answer.headers.get_list("set-cookie"))
        assert victim.get("/ui/runs").status_code == 303  # to the sign-in: nobody signed in
    finally:
        attacker.close()
        victim.close()


def test_the_sign_in_token_is_signed_by_the_server(console_api: Stack) -> None:
    """A nonce the attacker chose has no valid field: the old double-submit copy fails."""
    b = Browser(console_api.url)
    try:
        form = b.get("/ui/login")
        nonce = b.http.cookies["treadle_console_login"]
        good = field(form.text, "login_csrf")
        assert good != nonce  # not a copy of the cookie
        for cookie, sent in [
            ("planted-nonce", "planted-nonce"),  # a bare double-submit pair
            ("planted-nonce", good),  # the server's token for another nonce
            (nonce, good.split(".")[0] + ".forged"),
            (nonce, str(int(good.split(".")[0]) - 7200) + "." + good.split(".")[1]),
        ]:
            b.http.cookies.set("treadle_console_login", cookie, path="/ui/login")
            answer = b.post("/ui/login", {"token": token(), "login_csrf": sent})
            assert answer.status_code == 403, (cookie, sent)
            assert "came from another site" in " ".join(alerts(answer.text))
            assert b.get("/ui/runs").status_code == 303
        b.http.cookies.set("treadle_console_login", nonce, path="/ui/login")
        assert b.post("/ui/login", {"token": token(), "login_csrf": good}).status_code == 303
    finally:
        b.close()


def test_signing_in_again_ends_the_browsers_previous_session(console_api: Stack) -> None:
    b = Browser(console_api.url)
    try:
        assert b.sign_in(token("acme", "alice")).status_code == 303
        first = b.http.cookies["treadle_console"]
        assert b.sign_in(token("acme", "bob")).status_code == 303
        assert b.http.cookies["treadle_console"] != first
        # The first session's id no longer opens anything.
        with httpx.Client(base_url=console_api.url, timeout=60) as other:
            other.cookies.set("treadle_console", first, path="/ui")
            assert other.get("/ui/runs").status_code == 303
        assert "bob" in b.get("/ui/runs").text
    finally:
        b.close()


def test_origin_of_this_host_and_requests_without_browser_headers_pass(console_api: Stack) -> None:
    """Go's rule 3: a client sending neither header is no browser (no victim's cookies)."""
    b = Browser(console_api.url)
    try:
        form = b.get("/ui/login")
        answer = b.http.post(
            "/ui/login",
            data={"token": token(), "login_csrf": field(form.text, "login_csrf")},
            headers={"Origin": console_api.url},
        )
        assert answer.status_code == 303, answer.text[:500]
    finally:
        b.close()


def test_logout_opened_as_a_page_asks_to_sign_out(console_api: Stack) -> None:
    """``GET /ui/logout`` (a bookmark, a typed address): a Sign out button, or sign-in."""
    stranger = Browser(console_api.url)
    b = Browser(console_api.url)
    try:
        assert stranger.get("/ui/logout").headers.get("location") == "/ui/login"
        assert b.sign_in(token()).status_code == 303
        page = b.get("/ui/logout")
        assert page.status_code == 200, page.text[:500]
        assert "<h1>Sign out?</h1>" in page.text
        assert 'action="/ui/logout"' in page.text and ">Sign out</button>" in page.text
        # The GET itself ended nothing; the page's own form does.
        assert b.get("/ui/runs").status_code == 200
        out = b.post("/ui/logout", {"csrf_token": field(page.text, "csrf_token"), "confirm": "yes"})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert b.get("/ui/runs").status_code == 303
    finally:
        stranger.close()
        b.close()
