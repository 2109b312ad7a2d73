"""Every console page's query parameters follow the API's rules, as an HTML 422 page.

docs/console.md ("Errors of the request itself"): a parameter of the wrong type, out of
range, of an unknown value, over its length or holding a control or bidi character is a
``422 invalid_request`` page listing the field; a one-value parameter given twice is a
``422 invalid_input`` page (the API's ``refuse_repeated_query``, read from each page's
query model); nothing is fetched. An empty value means unset, unknown parameters are
ignored, and a page token the API refuses is still the first page under an alert.

The real app in-process (httpx ``ASGITransport``) on a real database, signed in through
the form, as tests/console/test_error_pages.py does.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api.app import create_app
from app.api.query_params import single_valued
from app.console.pages import ROUTERS
from app.console.web import STALE_PAGE_TOKEN
from app.core.settings import Settings
from app.db.database import Database
from tests.conftest import make_settings
from tests.console.conftest import CONSOLE_SECRET, alerts, tok
from tests.console.test_error_pages import _client, _sign_in, assert_console_page

LISTS = ("/ui/runs", "/ui/runs/table", "/ui/approvals", "/ui/dead-letters", "/ui/schedules")
START = "/ui/workflows/nosuch/start"

# (page, query string, field the page must name): every list's paging, then each
# page's own filters. Values as a browser would send them (percent-encoded).
BAD: list[tuple[str, str, str]] = [
    *[
        (page, query, field)
        for page in LISTS
        for query, field in (
            ("limit=abc", "limit"),
            ("limit=0", "limit"),
            ("limit=201", "limit"),
            ("limit=-1", "limit"),
            ("limit=1.5", "limit"),
            ("page_token=a%00b", "page_token"),
            ("page_token=a%E2%80%AEb", "page_token"),  # U+202E
            ("page_token=" + "x" * 1001, "page_token"),
        )
    ],
    ("/ui/runs", "status=bogus", "status"),
    ("/ui/runs", "status=FAILED", "status"),
    ("/ui/runs", "reason=bogus", "reason"),
    ("/ui/runs/table", "status=bogus", "status"),
    ("/ui/runs", "workflow=a%00", "workflow"),
    ("/ui/runs", "workflow=" + "w" * 201, "workflow"),
    ("/ui/runs", "version=v%E2%81%A6", "version"),  # U+2066
    ("/ui/runs", "q=" + "q" * 256, "q"),
    ("/ui/runs", "q=k%E2%80%8F", "q"),  # U+200F
    ("/ui/runs", "label=" + "l" * 2001, "label"),
    ("/ui/runs", "created_after=" + "1" * 41, "created_after"),
    ("/ui/dead-letters", "status=bogus", "status"),
    ("/ui/dead-letters", "workflow=a%D8%9C", "workflow"),  # U+061C
    ("/ui/schedules", "state=bogus", "state"),
    ("/ui/schedules", "workflow=" + "w" * 201, "workflow"),
    (START, "version=" + "v" * 101, "version"),
    (START, "version=1%00", "version"),
]


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path, console_secret=CONSOLE_SECRET)


@pytest.fixture
async def app(settings: Settings, db: Database) -> FastAPI:
    return create_app(settings, db=db, check_schema_on_start=False)


@pytest.fixture
async def user(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as c:
        answer = await _sign_in(c, tok())
        assert answer.status_code == 303, answer.text[:2000]
        yield c


def _listed(page: str) -> list[str]:
    # The fields the error page lists (its <code> items), unescaped enough to compare.
    return re.findall(r"<li><code>([^<]*)</code>", page)


async def test_a_bad_parameter_is_a_422_page_naming_it(user: httpx.AsyncClient) -> None:
    for page, query, field in BAD:
        r = await user.get(f"{page}?{query}")
        assert_console_page(r, 422, "invalid_request", signed_in=True)
        assert any(field in item for item in _listed(r.text)), (page, query, r.text[-3000:])


def _get_pages_with_parameters() -> list[tuple[str, frozenset[str]]]:
    found = []
    for router in ROUTERS:
        for route in router.routes:
            assert isinstance(route, APIRoute)
            names = single_valued(route.dependant)
            if "GET" in (route.methods or ()) and names:
                found.append(("/ui" + re.sub(r"\{[^}]+\}", "x", route.path), names))
    return found


async def test_every_one_value_parameter_of_every_page_refuses_a_repeat(
    user: httpx.AsyncClient,
) -> None:
    pages = _get_pages_with_parameters()
    # The walk sees the pages this file is about (their parameters come from models).
    seen = {path for path, _ in pages}
    assert {*LISTS, "/ui/workflows/x/start"} <= seen, seen
    assert {"limit", "page_token", "status"} <= dict(pages)["/ui/runs"]
    for path, names in pages:
        for name in sorted(names):
            # The same value twice is refused too: only one is allowed.
            r = await user.get(path, params=[(name, "1"), (name, "1")])
            text = assert_console_page(r, 422, "invalid_input", signed_in=True)
            assert f"query parameter {name!r} is given more than once" in text, (path, text)
            assert f"query.{name}" in _listed(r.text), (path, name)


async def test_good_blank_and_unknown_parameters_show_the_page(user: httpx.AsyncClient) -> None:
    for page in LISTS:
        for query in ("", "limit=1", "limit=200", "limit=", "page_token=", "utm_source=x"):
            r = await user.get(f"{page}?{query}")
            assert r.status_code == 200, (page, query, r.text[:2000])
            assert not alerts(r.text), (page, query, alerts(r.text))
    for query in ("status=failed", "status=", "reason=succeeded", "reason=", "q=order-1"):
        r = await user.get(f"/ui/runs?{query}")
        assert r.status_code == 200 and not alerts(r.text), (query, alerts(r.text))
    for page, query in (("/ui/dead-letters", "status=all"), ("/ui/schedules", "state=paused")):
        r = await user.get(f"{page}?{query}")
        assert r.status_code == 200 and not alerts(r.text), (page, alerts(r.text))
    # A token the API refuses is not the request's error: the first page, with an alert.
    for page in LISTS[:1] + LISTS[2:]:
        r = await user.get(page, params={"page_token": "garbage"})
        assert r.status_code == 200 and STALE_PAGE_TOKEN in alerts(r.text), page


async def test_the_page_size_is_kept_on_the_next_page_link(
    user: httpx.AsyncClient,
) -> None:
    # No run to page through here: the filter links of the runs table carry limit.
    r = await user.get("/ui/runs?limit=7&status=failed")
    assert r.status_code == 200
    assert "/ui/runs/table?status=failed&amp;limit=7" in r.text, r.text[:3000]
