"""The harness itself: a page's request to a host outside this machine is stopped and seen.

Without this, ``browser.external == []`` in the other tests could hold because nothing was
watched. The outside URLs use the reserved ``.invalid`` domain and are aborted by the route
before Chromium resolves them, so no traffic leaves the machine either way.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext

from tests.acceptance.conftest import Stack
from tests.browser.conftest import block_external
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

PAGE = """<!doctype html><title>probe</title>
<img src="https://cdn.example.invalid/logo.svg">
<script>
  fetch("https://api.example.invalid/track").catch(() => {});
  new WebSocket("wss://push.example.invalid/socket");
</script>"""


def test_outside_requests_are_aborted_and_recorded(
    stack: Stack, browser_context: BrowserContext
) -> None:
    recorded: list[tuple[str, str]] = []
    block_external(browser_context, recorded)
    page = browser_context.new_page()
    # A page of this machine's (the stack's health probe) that then asks three outside hosts.
    page.goto(stack.url + "/healthz")
    page.set_content(PAGE, wait_until="load")
    expected = {
        "https://cdn.example.invalid/logo.svg",
        "https://api.example.invalid/track",
        "wss://push.example.invalid/socket",
    }

    def all_recorded() -> bool:
        # Route handlers run while the sync API waits on the browser: ask it something.
        page.evaluate("1")
        return expected <= {url for url, _ in recorded}

    wait_for_sync(all_recorded, timeout=30, what=f"outside requests recorded: {recorded}")
    urls = {url for url, _ in recorded}
    # The machine's own host is not blocked.
    assert page.request.get(stack.url + "/healthz").ok
    assert not any(url.startswith(stack.url) for url in urls)
