"""``/docs`` (Swagger UI) and ``/redoc`` render from packaged assets with no outside request.

SQLite only: the pages are static HTML plus ``/openapi.json``, which reads no database; the
same app on PostgreSQL serves the same bytes, and the console's journeys cover both.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.browser.conftest import Browser

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _operations(base_url: str) -> list[tuple[str, str]]:
    doc = httpx.get(base_url + "/openapi.json", timeout=60).json()
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return [(m, p) for p, ops in doc["paths"].items() for m in ops if m in methods]


def test_swagger_ui_lists_every_operation_offline(browser: Browser) -> None:
    operations = _operations(browser.base_url)
    assert len(operations) > 10
    browser.page.goto(browser.base_url + "/docs", wait_until="networkidle")
    blocks = browser.page.locator(".opblock")
    blocks.first.wait_for()
    browser.screenshot("docs")
    # One block per (method, path): Swagger UI rendered the whole document it fetched.
    assert blocks.count() == len(operations)
    first_method, first_path = operations[0]
    summary = browser.page.locator(f".opblock-{first_method} .opblock-summary-path").first
    assert summary.get_attribute("data-path") == first_path
    assert browser.page.title() == "Treadle - Swagger UI"
    assert browser.external == []


def test_redoc_renders_the_document_offline(browser: Browser) -> None:
    browser.page.goto(browser.base_url + "/redoc", wait_until="networkidle")
    heading = browser.page.get_by_role("heading", level=1, name=re.compile(r"^Treadle"))
    heading.wait_for()
    browser.screenshot("redoc", full_page=False)
    # ReDoc's menu lists each tag's operations; the runs list is one of them.
    assert browser.page.locator("[role=menuitem], li[data-item-id]").count() > 10
    assert browser.external == []


def test_docs_assets_are_served_from_the_package(browser: Browser) -> None:
    """The page's script and stylesheet come from ``/docs-assets``, not from a CDN."""
    page = httpx.get(browser.base_url + "/docs", timeout=60)
    html = page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="/docs-assets/swagger-ui-bundle.js"' in html
    assert 'href="/docs-assets/swagger-ui.css"' in html
    assert "cdn" not in html.lower()
    js = httpx.get(browser.base_url + "/docs-assets/swagger-ui-bundle.js", timeout=60)
    assert js.status_code == 200 and len(js.content) > 100_000
    missing = httpx.get(browser.base_url + "/docs-assets/nope.js", timeout=60)
    assert missing.status_code == 404
