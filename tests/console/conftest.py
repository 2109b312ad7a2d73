"""Console tests: a real ``treadle serve`` (uvicorn) and worker, driven over real HTTP.

A :class:`Browser` is an httpx client with a cookie jar that signs in through the form
like a person would (GET the form, POST the token) and reads the CSRF token from pages.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import create_async_engine

from app.auth.principal import ALL_SCOPES
from app.db.tables import console_sessions
from tests.acceptance.conftest import Stack, stack_env, token
from tests.helpers import TLS, wait_for_sync

__all__ = ["Browser", "console", "console_api", "end_every_session", "stack_env"]

CONSOLE_SECRET = "console-test-secret-" + "s" * 32
HANDLERS = "tests.console.handlers"


def field(page: str, name: str) -> str:
    """The value of the first hidden input ``name`` on ``page``."""
    found = re.search(rf'name="{re.escape(name)}" value="([^"]*)"', page)
    assert found, f"no {name} field on the page:\n{page[:2000]}"
    return html.unescape(found.group(1))


def alerts(page: str) -> list[str]:
    """Texts of the page's ``role="alert"`` messages (unescaped)."""
    return [html.unescape(m) for m in re.findall(r'role="alert"[^>]*>(.*?)</div>', page, re.S)]


def statuses(page: str) -> list[str]:
    """Texts of the page's ``role="status"`` messages (unescaped)."""
    return [html.unescape(m) for m in re.findall(r'role="status"[^>]*>(.*?)</div>', page, re.S)]


class Browser:
    """A cookie-keeping HTTP client of the console (redirects not followed)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60, follow_redirects=False, verify=TLS)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def get(self, path: str, **kw: Any) -> httpx.Response:
        """GET ``path``."""
        return self.http.get(path, **kw)

    def post(self, path: str, data: dict[str, str]) -> httpx.Response:
        """POST a urlencoded form."""
        return self.http.post(path, data=data)

    def sign_in(self, tok: str, next_url: str = "") -> httpx.Response:
        """Fill and send the sign-in form; return the POST's answer."""
        form = self.get("/ui/login")
        assert form.status_code == 200, form.text
        return self.post(
            "/ui/login",
            {"token": tok, "next": next_url, "login_csrf": field(form.text, "login_csrf")},
        )

    def csrf(self, path: str = "/ui/runs") -> str:
        """The session's CSRF token, read from a page's sign-out form."""
        page = self.get(path)
        assert page.status_code == 200, page.text
        return field(page.text, "csrf_token")

    def act(self, path: str, data: dict[str, str], *, confirm: bool = True) -> httpx.Response:
        """POST an action form with the CSRF token; with ``confirm`` answer its confirm page.

        Returns the answer of the last POST (a 303 when the action ran).
        """
        csrf = self.csrf()
        first = self.post(path, {**data, "csrf_token": csrf})
        if not confirm or first.status_code != 200:
            return first
        assert 'name="confirm" value="yes"' in first.text, first.text[:2000]
        return self.post(path, {**data, "csrf_token": csrf, "confirm": "yes"})

    def flash_after(self, response: httpx.Response) -> str:
        """Follow a 303 and return the messages the next page shows.

        The next page must be a page (200, or a 4xx error page such as another tenant's
        run), never a redirect (the session was lost: a sign-in redirect has no
        messages) nor a 5xx: a missing message then fails here with the page's answer,
        not later as an empty string.
        """
        assert response.status_code == 303, response.text[:2000]
        page = self.get(response.headers["location"])
        assert page.status_code < 300 or 400 <= page.status_code < 500, (
            page.status_code,
            page.headers.get("location"),
            page.text[:2000],
        )
        return " | ".join(statuses(page.text) + alerts(page.text))


class ConsoleStack:
    """A stack with a worker of the console handlers, plus helpers to make browsers."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.url = stack.url
        self.browsers: list[Browser] = []

    def browser(self, tok: str | None = None) -> Browser:
        """A new browser, signed in with ``tok`` when given."""
        b = Browser(self.url)
        self.browsers.append(b)
        if tok is not None:
            answer = b.sign_in(tok)
            assert answer.status_code == 303, answer.text[:2000]
        return b

    def api(self, tok: str | None = None) -> httpx.Client:
        """A plain API client (bearer token)."""
        return self.stack.client(tok)

    def submit(self, workflow: str, input: Any, tok: str | None = None, **extra: Any) -> str:
        """Submit a run through the API; return its id."""
        with self.api(tok) as c:
            r = c.post("/runs", json={"workflow": workflow, "input": input, **extra})
            assert r.status_code == 201, r.text
            return str(r.json()["run_id"])

    def wait_status(self, run_id: str, *wanted: str, tok: str | None = None) -> dict[str, Any]:
        """Poll the run until its status is one of ``wanted``; return it."""

        def probe() -> dict[str, Any] | None:
            with self.api(tok) as c:
                run = c.get(f"/runs/{run_id}").json()
            return run if run["status"] in wanted else None

        return wait_for_sync(probe, timeout=90, what=f"run {run_id} {wanted}")


@pytest.fixture
def console(database_url: str, tmp_path: Any, stack_env: dict[str, str]) -> Iterator[ConsoleStack]:
    """API (uvicorn) + one worker of the console handlers on this test's database."""
    env = {**stack_env, "TREADLE_CONSOLE_SECRET": CONSOLE_SECRET}
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    cs: ConsoleStack | None = None
    try:
        s.start_api()
        s.start_worker(handlers=HANDLERS, concurrency=4)
        cs = ConsoleStack(s)
        yield cs
    finally:
        for b in cs.browsers if cs else []:
            b.close()
        s.stop()


def end_every_session(database_url: str) -> None:
    """Delete every console session row of the database at ``database_url``.

    What an idle or absolute deadline, or a sign-out in another browser, leaves behind:
    browsers still hold their cookies, the server honours none of them. Runs its own
    event loop in a thread: Playwright's sync API keeps one running in the test's.
    """

    async def run() -> None:
        engine = create_async_engine(database_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(delete(console_sessions))
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run()).result()


def tok(
    tenant: str = "acme",
    subject: str = "alice",
    scopes: Any = ALL_SCOPES,
    groups: tuple[str, ...] = (),
) -> str:
    """A dev token (test secret) with groups."""
    from app.auth.dev import DevTokens
    from tests.conftest import DEV_SECRET

    if not groups:
        return token(tenant, subject, scopes)
    return DevTokens(DEV_SECRET).mint(
        tenant_id=tenant, subject=subject, scopes=scopes, groups=groups
    )


@pytest.fixture
def console_api(database_url: str, tmp_path: Any, stack_env: dict[str, str]) -> Iterator[Stack]:
    """``treadle serve`` with the console on and no worker (for pages that run nothing)."""
    s = Stack(
        database_url=database_url,
        tmp=tmp_path,
        env={**stack_env, "TREADLE_CONSOLE_SECRET": CONSOLE_SECRET},
    )
    try:
        s.start_api()
        yield s
    finally:
        s.stop()
