"""The console's OIDC sign-in over real HTTP: the API under uvicorn, a local provider.

The browser's part is played by one cookie-keeping httpx client that follows each
redirect by hand: console → provider (auto-approved user) → console callback → Runs.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from app.api.app import create_app
from app.core.settings import AuthMode
from tests.conftest import make_settings
from tests.support.oidc_provider import OidcProvider, UvicornThread

SECRET = "console-oidc-secret-" + "z" * 32


@pytest.fixture
def sso(database_url: str, tmp_path: Path) -> Iterator[tuple[OidcProvider, str]]:
    """A provider and the API (jwt mode, OIDC sign-in configured); yields both."""
    provider = OidcProvider().start()
    settings = make_settings(
        database_url,
        tmp_path,
        auth_mode=AuthMode.JWT,
        oidc_issuer=provider.issuer,
        jwt_audience="treadle-api",
        jwks_refresh_interval_seconds=0,
        oidc_client_id=provider.client_id,
        oidc_client_secret=provider.client_secret,
        oidc_provider_name="Acme SSO",
        console_secret=SECRET,
    )
    api = UvicornThread(create_app(settings)).start()
    provider.redirect_uris.append(api.url + "/ui/login/oidc/callback")
    try:
        yield provider, api.url
    finally:
        api.stop()
        provider.stop()


def _authorize(url: str) -> str:
    """The provider's answer to the authorize URL: the callback URL it redirects to."""
    answer = httpx.get(url, follow_redirects=False, timeout=30)
    assert answer.status_code == 302, answer.text
    return answer.headers["location"]


def _alerts(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'role="alert"[^>]*>(.*?)</div>', page, re.S)]


def test_sign_in_with_the_identity_provider_then_sign_out(sso: tuple[OidcProvider, Any]) -> None:
    provider, url = sso
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as browser:
        login = browser.get("/ui/login")
        assert 'href="/ui/login/oidc"' in login.text and "Sign in with Acme SSO" in login.text
        begin = browser.get("/ui/login/oidc")
        assert begin.status_code == 303
        assert begin.headers["location"].startswith(provider.issuer)
        state_cookie = next(h for h in begin.headers.get_list("set-cookie") if "treadle_oidc" in h)
        assert "HttpOnly" in state_cookie and "Path=/ui/login/oidc" in state_cookie
        callback = urlsplit(_authorize(begin.headers["location"]))
        done = browser.get(f"{callback.path}?{callback.query}")
        assert done.status_code == 303, done.text
        assert done.headers["location"] == "/ui/runs"
        assert browser.cookies.get("treadle_console")
        runs = browser.get("/ui/runs")
        assert runs.status_code == 200 and "<h1>Runs</h1>" in runs.text, runs.text[:2000]
        assert "alice" in runs.text  # the provider's user, as the API saw its token
        # The code was single-use: replaying the callback signs nobody in.
        replay = httpx.get(f"{url}{callback.path}?{callback.query}", timeout=30)
        assert replay.status_code == 401 and _alerts(replay.text)


def test_a_tampered_or_missing_state_signs_nobody_in(sso: tuple[OidcProvider, Any]) -> None:
    _, url = sso
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as browser:
        begin = browser.get("/ui/login/oidc")
        callback = urlsplit(_authorize(begin.headers["location"]))
        query = {k: v[0] for k, v in parse_qs(callback.query).items()}
        forged = urlunsplit(("", "", callback.path, urlencode({**query, "state": "x"}), ""))
        refused = browser.get(forged)
        assert refused.status_code == 401
        assert any("identity provider failed" in a for a in _alerts(refused.text))
        assert not browser.cookies.get("treadle_console")
    # Another browser, without the state cookie, brings a valid code: refused too.
    stranger = httpx.get(f"{url}{callback.path}?{callback.query}", timeout=30)
    assert stranger.status_code == 401
    assert not any(
        h.startswith("treadle_console=") for h in stranger.headers.get_list("set-cookie")
    )


@pytest.mark.parametrize("name", ["state", "code", "error", "error_description"])
def test_a_repeated_callback_parameter_signs_nobody_in(
    sso: tuple[OidcProvider, Any], name: str
) -> None:
    """A second copy of a parameter the sign-in reads: refused (401), no session.

    The first copy is the provider's own, so the answer would sign in if either copy
    were read alone: the refusal comes from the repeat.
    """
    _, url = sso
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as browser:
        begin = browser.get("/ui/login/oidc")
        callback = urlsplit(_authorize(begin.headers["location"]))
        pairs = parse_qsl(callback.query)
        value = dict(pairs).get(name, "")
        doubled = (
            urlencode([*pairs, (name, value)])
            if value
            else urlencode([*pairs, (name, "x"), (name, "y")])
        )
        refused = browser.get(f"{callback.path}?{doubled}")
        assert refused.status_code == 401, refused.text
        assert any(f"repeats {name}" in a for a in _alerts(refused.text)), refused.text
        assert not browser.cookies.get("treadle_console")


def test_without_an_identity_provider_there_is_no_oidc_sign_in(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path, console_secret=SECRET)
    api = UvicornThread(create_app(settings)).start()
    try:
        assert "/ui/login/oidc" not in httpx.get(api.url + "/ui/login", timeout=30).text
        assert httpx.get(api.url + "/ui/login/oidc", timeout=30).status_code == 404
    finally:
        api.stop()


@pytest.mark.parametrize(("fetch_site", "signed_in"), [("same-site", False), ("cross-site", True)])
def test_a_callback_opened_from_a_sibling_page_signs_nobody_in(
    sso: tuple[OidcProvider, Any], fetch_site: str, signed_in: bool
) -> None:
    """Login CSRF through the callback, sent by a sibling page of the console's site.

    That page brings the attacker's code (and, over http, a planted state cookie). The
    console is reached as ``localhost`` and the provider is ``127.0.0.1``: other sites,
    so the provider's real redirect is ``cross-site`` to the browser, and a ``same-site``
    callback came from a page beside the console (app/console/origin.py).
    """
    provider, url = sso
    local = url.replace("127.0.0.1", "localhost")
    provider.redirect_uris.append(local + "/ui/login/oidc/callback")
    with httpx.Client(base_url=local, timeout=30, follow_redirects=False) as browser:
        begin = browser.get("/ui/login/oidc")
        callback = urlsplit(_authorize(begin.headers["location"]))
        done = browser.get(
            f"{callback.path}?{callback.query}", headers={"Sec-Fetch-Site": fetch_site}
        )
        if signed_in:
            assert done.status_code == 303, done.text[:2000]
            assert browser.cookies.get("treadle_console")
        else:
            assert done.status_code == 401, done.text[:2000]
            assert any("another page of this site" in a for a in _alerts(done.text))
            assert not browser.cookies.get("treadle_console")


@pytest.mark.parametrize(
    ("asked", "lands"),
    [
        ("/ui/runs?status=failed", "/ui/runs?status=failed"),
        ("/ui/approvals", "/ui/approvals"),
        ("https://evil.example/ui/runs", "/ui/runs"),  # never another site
        ("//evil.example/ui/", "/ui/runs"),
        ("/docs", "/ui/runs"),  # only console pages
    ],
)
def test_sign_in_returns_to_the_page_first_asked_for(
    sso: tuple[OidcProvider, Any], asked: str, lands: str
) -> None:
    _, url = sso
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as browser:
        # The page asked for sends the browser to sign in with next=...; the login
        # page's OIDC link carries it on.
        login = browser.get("/ui/login", params={"next": asked})
        link = re.search(r'href="(/ui/login/oidc[^"]*)"', login.text)
        assert link, login.text[:2000]
        begin = browser.get(html.unescape(link.group(1)))
        assert begin.status_code == 303, begin.text[:2000]
        callback = urlsplit(_authorize(begin.headers["location"]))
        done = browser.get(f"{callback.path}?{callback.query}")
        assert done.status_code == 303, done.text[:2000]
        assert done.headers["location"] == lands
    # Straight to the begin URL with the same next: the same landing.
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as browser:
        begin = browser.get("/ui/login/oidc", params={"next": asked})
        callback = urlsplit(_authorize(begin.headers["location"]))
        done = browser.get(f"{callback.path}?{callback.query}")
        assert done.status_code == 303 and done.headers["location"] == lands
