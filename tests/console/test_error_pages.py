"""Every error under ``/ui`` is an HTML page of the console, never the API's JSON.

Whichever layer refuses a console request (a validation error, an HTTP error from the
router or a body parser, an unexpected exception, a request guard: body too large or too
slow, headers too large, malformed JSON), the answer is ``text/html`` in the console's
layout with the status, the message in ``role=alert`` and a link back, and carries the
console's security headers; the API's paths keep ``application/problem+json``. The
sign-in form judges its own fields, so a refused field is the form again with a message.

The real app runs in-process (httpx ``ASGITransport``) on a real database; the console
calls the API in-process as it does under ``treadle serve``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from fastapi.routing import APIRoute

from app.api.app import create_app
from app.api.problems import PROBLEM_JSON
from app.console import sessions
from app.console.pages import ROUTERS
from app.core.settings import Settings
from app.db.database import Database
from tests.conftest import make_settings
from tests.console.conftest import CONSOLE_SECRET, alerts, field, tok

PAYLOAD_BYTES = 1024
BODY_LIMIT = PAYLOAD_BYTES + 64 * 1024  # create_app's envelope room
HEADER_BYTES = 4096
BODY_SECONDS = 0.5


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        tmp_path,
        console_secret=CONSOLE_SECRET,
        max_payload_bytes=PAYLOAD_BYTES,
        max_header_bytes=HEADER_BYTES,
        body_read_timeout_seconds=BODY_SECONDS,
    )


@pytest.fixture
async def app(settings: Settings, db: Database) -> FastAPI:
    app = create_app(settings, db=db, check_schema_on_start=False)

    # Routes of this test under /ui, to raise what no console page raises today: the
    # class of errors, not the cases the pages happen to have. POST: the console's
    # catch-all page is GET only.
    @app.post("/ui/test-probe/{n}")
    async def probe(n: int, q: int = 0) -> None:
        if n == 1:
            raise HTTPException(409, "probe conflict")
        raise RuntimeError("probe bug")

    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    # raise_app_exceptions=False: an unexpected error is re-raised by Starlette after its
    # handler answered; the answer is what this file checks.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://console", timeout=60)


@pytest.fixture
async def anon(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as c:
        yield c


@pytest.fixture
async def user(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as c:
        answer = await _sign_in(c, tok())
        assert answer.status_code == 303, answer.text[:2000]
        yield c


async def _sign_in(c: httpx.AsyncClient, token: str, **fields: str) -> httpx.Response:
    form = await c.get("/ui/login")
    assert form.status_code == 200, form.text
    data = {"token": token, "next": "", "login_csrf": field(form.text, "login_csrf"), **fields}
    return await c.post("/ui/login", data=data)


def assert_console_page(r: httpx.Response, status: int, code: str, *, signed_in: bool) -> str:
    """``r`` is the console's HTML error page: status, layout, alert, code, link back."""
    where = (r.request.method, r.request.url.path, r.status_code, r.text[:600])
    assert r.status_code == status, where
    assert r.headers["content-type"].startswith("text/html"), where
    page = r.text
    assert page.startswith("<!doctype html>") and '<header class="top">' in page, where
    assert len(alerts(page)) == 1 and alerts(page)[0].strip(), where
    assert f"Code: <code>{code}</code>" in page, where
    assert '<a href="/ui/runs">Back to runs</a>' in page, where
    assert ("Sign out</button>" in page) is signed_in, where
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"], where
    assert r.headers["cache-control"] == "no-store", where
    return alerts(page)[0]


def _console_routes() -> list[tuple[str, set[str]]]:
    found = []
    for router in ROUTERS:
        for route in router.routes:
            assert isinstance(route, APIRoute)
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            found.append(("/ui" + path, set(route.methods or ())))
    assert len(found) >= 20, found  # the walk saw the console
    return found


async def test_an_over_long_token_is_the_sign_in_form_with_400(anon: httpx.AsyncClient) -> None:
    for bad in (
        "a" * (sessions.MAX_TOKEN_CHARS + 1),
        "a" * (sessions.MAX_TOKEN_CHARS + 5000),
        "",
        "tok\x00en",
    ):
        r = await _sign_in(anon, bad, next="/ui/approvals")
        assert r.status_code == 400, (len(bad), r.status_code, r.text[:500])
        assert r.headers["content-type"].startswith("text/html")
        assert '<input id="token" name="token" type="password"' in r.text  # the form again
        assert field(r.text, "next") == "/ui/approvals"  # where the user was going, kept
        assert alerts(r.text) == [
            "paste an API key (trd_…) or a bearer token: one line of at most "
            f"{sessions.MAX_TOKEN_CHARS} printable characters"
        ]
        assert "treadle_console=" not in r.headers.get("set-cookie", "")
    # A token the API refuses is still 401 with the API's words.
    refused = await _sign_in(anon, "not-a-token")
    assert refused.status_code == 401 and alerts(refused.text) == ["invalid bearer token"]


async def test_other_sign_in_fields_of_any_length_are_judged_by_the_form(
    anon: httpx.AsyncClient,
) -> None:
    # An over-long login_csrf is a wrong one: the form again, 403, nothing done.
    forged = await _sign_in(anon, tok(), login_csrf="c" * 5000)
    assert forged.status_code == 403 and '<input id="token"' in forged.text, forged.text[:500]
    assert "treadle_console=" not in forged.headers.get("set-cookie", "")
    # An over-long next is no console page: signed in, sent to the runs.
    long_next = await _sign_in(anon, tok(), next="/ui/runs?q=" + "n" * 3000)
    assert long_next.status_code == 303 and long_next.headers["location"] == "/ui/runs"


async def test_every_console_route_answers_http_errors_as_html(
    user: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    for path, methods in [*_console_routes(), ("/ui/no/such/page", {"GET"})]:
        # A method the route does not take: the router's 405.
        wrong = await user.request("PUT", path)
        assert_console_page(wrong, 405, "method_not_allowed", signed_in=True)
        if "POST" not in methods:
            continue
        # A body the form parser cannot read: the parser's 400.
        broken = await user.post(
            path,
            content=b"--zz\r\nContent-Disposition: form-data\r\n\r\nno end",
            headers={"content-type": "multipart/form-data; boundary=zz"},
        )
        assert_console_page(broken, 400, "http_error", signed_in=True)
        # A JSON body with a key twice: the strict-JSON guard's 400, outside any route.
        dup = await user.post(
            path, content=b'{"a": 1, "a": 2}', headers={"content-type": "application/json"}
        )
        message = assert_console_page(dup, 400, "malformed_json", signed_in=True)
        assert "repeats the key 'a'" in message
    # Not signed in: the same pages, without the nav.
    assert_console_page(
        await anon.request("PUT", "/ui/runs"), 405, "method_not_allowed", signed_in=False
    )
    # The same mistakes on the API's paths stay problem+json.
    api_wrong = await anon.request("PUT", "/runs")
    assert api_wrong.status_code == 405
    assert api_wrong.headers["content-type"] == PROBLEM_JSON


async def test_validation_errors_and_raised_errors_under_ui_are_html(
    user: httpx.AsyncClient,
) -> None:
    # No console page declares a parameter FastAPI can refuse today (each judges its
    # own fields); any route under /ui that does gets the page: a path and a query
    # parameter of the wrong type, an HTTPException, a bug.
    typed = await user.post("/ui/test-probe/not-a-number?q=also-not")
    assert_console_page(typed, 422, "invalid_request", signed_in=True)
    assert "<code>path.n</code>" in typed.text and "<code>query.q</code>" in typed.text
    conflict = await user.post("/ui/test-probe/1")
    assert alerts(conflict.text) == ["probe conflict"]
    assert_console_page(conflict, 409, "http_error", signed_in=True)
    bug = await user.post("/ui/test-probe/2")
    assert_console_page(bug, 500, "internal_error", signed_in=False)  # no database read
    assert "probe bug" not in bug.text


async def test_request_guard_refusals_under_ui_are_html(
    user: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    big = b"token=" + b"a" * BODY_LIMIT
    # Declared too large (Content-Length): refused before the body is read.
    for c, signed_in in ((anon, False), (user, True)):
        r = await c.post(
            "/ui/login", content=big, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        message = assert_console_page(r, 413, "payload_too_large", signed_in=signed_in)
        assert f"request body exceeds {BODY_LIMIT} bytes" in message
    # Streamed past the limit (no Content-Length): refused as it is read.

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    streamed = await user.post(
        "/ui/runs/x/signal",
        content=chunks(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert_console_page(streamed, 413, "payload_too_large", signed_in=True)
    # Headers over the limit.
    fat = await anon.get("/ui/login", headers={"x-padding": "p" * HEADER_BYTES})
    assert_console_page(fat, 431, "headers_too_large", signed_in=False)
    # The API's paths: the same refusals in problem+json.
    api = await anon.post("/runs", content=big, headers={"content-type": "application/json"})
    assert api.status_code == 413 and api.headers["content-type"] == PROBLEM_JSON
    assert api.json()["limit_bytes"] == BODY_LIMIT


async def test_a_slow_console_body_is_an_html_408(user: httpx.AsyncClient) -> None:
    never = asyncio.Event()  # the rest of the body never comes

    async def stalled() -> AsyncIterator[bytes]:
        yield b"csrf_token=x&"
        await never.wait()
        yield b"never"

    for path in ("/ui/login", "/ui/runs/x/cancel"):
        r = await user.post(
            path, content=stalled(), headers={"content-type": "application/x-www-form-urlencoded"}
        )
        message = assert_console_page(r, 408, "request_timeout", signed_in=True)
        assert f"request body not received within {BODY_SECONDS:g} s" in message
        assert r.headers["connection"] == "close"
