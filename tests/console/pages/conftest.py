"""The console over real HTTP: ``treadle serve`` under uvicorn plus a real worker process.

:class:`Browser` is a cookie-keeping httpx client that signs in through ``/ui/login`` as a
browser does and reads the CSRF token from the pages it gets.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.auth.principal import ALL_SCOPES
from tests.acceptance.conftest import Stack, stack_env, token
from tests.helpers import TLS

__all__ = ["Browser", "stack_env"]

HANDLERS = ("tests.acceptance.handlers", "examples.onboarding", "tests.console.pages.form_handlers")
CONSOLE_SECRET = "console-test-secret-" + "y" * 40
_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
_LOGIN_CSRF = re.compile(r'name="login_csrf" value="([^"]*)"')


class Browser:
    """A signed-in console user: cookies kept, redirects not followed (tests check them).

    A POST sends the ``csrf_token`` of the form with that action on the last page it got
    (as a browser submitting that form would), so a form rendered without the session's
    token fails the test; only when the last page has no such form does it use the
    session's token from the sign-out form.
    """

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60, follow_redirects=False, verify=TLS)
        self.csrf_token = ""
        self.last_page = ""

    def _form_csrf(self, path: str) -> str:
        for form in re.findall(r"<form[^>]*>.*?</form>", self.last_page, re.S):
            action = re.search(r'action="([^"]*)"', form)
            if action and html.unescape(action.group(1)) == path:
                match = _CSRF.search(form)
                return html.unescape(match.group(1)) if match else ""
        return self.csrf_token

    def sign_in(self, tok: str) -> None:
        """Sign in with ``tok`` through the login form; assert the 303 to the console."""
        page = self.http.get("/ui/login")
        match = _LOGIN_CSRF.search(page.text)
        assert match, page.text
        resp = self.http.post(
            "/ui/login", data={"token": tok, "login_csrf": match.group(1), "next": "/ui/runs"}
        )
        assert resp.status_code == 303, resp.text
        self.get("/ui/runs")

    def get(self, path: str, **params: str) -> httpx.Response:
        """GET a page; remember the CSRF token it carries."""
        resp = self.http.get(path, params=params or None)
        self.last_page = resp.text
        match = _CSRF.search(resp.text)
        if match:
            self.csrf_token = html.unescape(match.group(1))
        return resp

    def post(self, path: str, data: dict[str, str], *, csrf: str | None = None) -> httpx.Response:
        """POST a form with its page's CSRF token (or ``csrf``; "" sends none)."""
        token_value = self._form_csrf(path) if csrf is None else csrf
        body = {**data, **({"csrf_token": token_value} if token_value else {})}
        resp = self.http.post(path, data=body)
        if resp.status_code == 200 or resp.status_code >= 400:
            self.last_page = resp.text
        return resp

    def act(self, path: str, data: dict[str, str]) -> httpx.Response:
        """POST an action, then its confirm step; return the answer to the confirmed POST."""
        first = self.post(path, data)
        assert first.status_code == 200, first.text
        assert 'name="confirm" value="yes"' in first.text, first.text
        return self.post(path, {**data, "confirm": "yes"})

    def follow(self, resp: httpx.Response) -> httpx.Response:
        """GET where a 303 points (the page that shows the flashed message)."""
        assert resp.status_code == 303, resp.text
        return self.get(resp.headers["location"])

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


def start_worker(stack: Stack) -> None:
    """Start one worker with the acceptance handlers and the onboarding example."""
    stack.start_worker(list(HANDLERS), concurrency=4, timeout=120)


@pytest.fixture
def console(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """A running API with the console configured, and one worker with the test handlers."""
    stack_env["TREADLE_CONSOLE_SECRET"] = CONSOLE_SECRET
    s = Stack(database_url=database_url, tmp=tmp_path, env=stack_env)
    try:
        s.start_api()
        start_worker(s)
        yield s
    finally:
        s.stop()


@pytest.fixture
def browser(console: Stack) -> Iterator[Browser]:
    """Alice of tenant acme with every scope, signed in."""
    b = Browser(console.url)
    b.sign_in(token("acme", "alice", ALL_SCOPES))
    try:
        yield b
    finally:
        b.close()


def new_browser(stack: Stack, tok: str) -> Browser:
    """Another signed-in browser (close it yourself)."""
    b = Browser(stack.url)
    b.sign_in(tok)
    return b
