"""Browser tests: Debian's Chromium, driven by Playwright, against real ``treadle`` processes.

The stack is the acceptance tests' own (``tests/acceptance/conftest.py``): ``treadle serve``
under uvicorn plus ``treadle worker`` subprocesses, on SQLite and PostgreSQL. Chromium is the
distribution's (``/usr/bin/chromium``, installed by ``scripts/install-chromium``); Playwright's
own browser download is never used (it cannot reach its servers from a closed network, and
the distribution's build is what an operator's machine has).

Every request the page makes to a host other than this machine is aborted and recorded; the
``browser`` fixture fails the test if there was one, because the console and ``/docs`` must
work offline. Screenshots of each visited page land in ``test-artifacts/screenshots/<test>/``
(gitignored: written on every run, CI's included, and never committed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import (
    BrowserContext,
    Page,
    Playwright,
    Route,
    WebSocketRoute,
    sync_playwright,
)

from app.cli.main import EXAMPLE_HANDLERS
from tests.acceptance.conftest import ROOT, Stack, token
from tests.acceptance.conftest import stack as stack  # a fixture, re-exported
from tests.acceptance.conftest import stack_env as stack_env

#: Debian's Chromium (package ``chromium``); TREADLE_TEST_CHROMIUM points elsewhere.
CHROMIUM = Path(os.environ.get("TREADLE_TEST_CHROMIUM", "/usr/bin/chromium"))
#: Where screenshots go; TREADLE_TEST_ARTIFACTS moves them (CI may collect a folder).
ARTIFACTS = Path(os.environ.get("TREADLE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
#: Hosts a page may load from: this machine only.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: A test domain whose every name Chromium resolves to 127.0.0.1 (``CHROMIUM_FLAGS``), so
#: a test can serve sibling subdomains (console.treadle.test, evil.treadle.test) on
#: loopback: cookies of a parent domain behave as on a real network.
TEST_DOMAIN = "treadle.test"
#: Chromium flags for a closed network. Without the background-networking ones Chromium
#: opens connections to its vendor's services at start (refused here, many at a time) and
#: looks up hosts it cannot resolve; none of that is the page's traffic, and Playwright's
#: routes would not see it to block it.
CHROMIUM_FLAGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Containers give /dev/shm 64 MB; Chromium's renderer crashes on a large page there.
    "--disable-dev-shm-usage",
    # Names of the test domain are this machine (no DNS asked): TEST_DOMAIN.
    f"--host-resolver-rules=MAP *.{TEST_DOMAIN} 127.0.0.1",
]
#: Milliseconds Playwright waits for a page or an element: generous, the stack shares two
#: cores with other tests.
TIMEOUT_MS = 60_000


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120] or "page"


@dataclass
class Browser:
    """One test's Chromium page on the stack, with its blocked requests and screenshots.

    Attributes:
        page: the Playwright page (one fresh profile per test: no cookies carried over).
        base_url: the API's ``http://127.0.0.1:<port>``.
        shots: the test's screenshot folder.
        external: every request to a non-local host, aborted (URL, resource type).
    """

    page: Page
    base_url: str
    shots: Path
    external: list[tuple[str, str]] = field(default_factory=list)
    taken: list[Path] = field(default_factory=list)

    def goto(self, path: str, name: str | None = None) -> None:
        """Open ``path`` (relative to the stack), wait for the network to settle, screenshot it.

        Args:
            path: e.g. ``/ui/login``; must start with ``/``.
            name: the screenshot's file stem; default: the path made file-safe.
        """
        assert path.startswith("/"), path
        self.page.goto(self.base_url + path, wait_until="networkidle")
        self.screenshot(name or path)

    def screenshot(self, name: str, *, full_page: bool = True) -> Path:
        """Write a PNG named ``name`` into this test's folder and return its path.

        Args:
            name: the file stem (made file-safe, numbered in the order taken).
            full_page: the whole scrollable page (default) or only the viewport, for pages
                tens of thousands of pixels tall such as ReDoc's.
        """
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{len(self.taken):02d}-{_slug(name)}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        self.taken.append(path)
        return path

    def sign_in(self, tok: str, name: str = "signed-in") -> None:
        """Sign in through ``/ui/login`` as a person would (docs: the console contract).

        Fills the field labelled "API key or token", presses "Sign in", waits for the page it
        lands on and screenshots it. Whether that worked is the caller's to assert.
        """
        self.goto("/ui/login", "login")
        self.page.get_by_label("API key or token").fill(tok)
        with self.page.expect_navigation(wait_until="networkidle"):
            self.page.get_by_role("button", name="Sign in").click()
        self.screenshot(name)


def _is_external(url: str) -> bool:
    parts = urlsplit(url)
    host = parts.hostname or ""
    local = host in LOCAL_HOSTS or host.endswith("." + TEST_DOMAIN)
    return parts.scheme in {"http", "https", "ws", "wss"} and not local


def block_external(context: BrowserContext, recorded: list[tuple[str, str]]) -> None:
    """Abort every request and WebSocket of ``context`` to a host other than this machine.

    Each one is appended to ``recorded`` as (URL, resource type) before it is aborted, so
    nothing leaves the machine and the test can assert the list is empty. ``data:`` and
    ``blob:`` URLs never reach the network and are not routed.
    """

    def handle(route: Route) -> None:
        if _is_external(route.request.url):
            recorded.append((route.request.url, route.request.resource_type))
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def handle_socket(socket: WebSocketRoute) -> None:
        # Playwright routes WebSockets separately from requests.
        if _is_external(socket.url):
            recorded.append((socket.url, "websocket"))
            socket.close()
        else:
            socket.connect_to_server()

    context.route("**/*", handle)
    context.route_web_socket(re.compile(".*"), handle_socket)


@pytest.fixture
def playwright_driver(stack: Stack) -> Iterator[Playwright]:
    """Playwright's driver, started for this test after ``stack`` and stopped before it.

    Playwright's sync API runs an event loop in this thread while it is started, and the
    database fixtures call ``asyncio.run`` (which refuses to run inside a running loop). So
    the driver starts per test *after* ``stack`` (and so after every database fixture) and
    stops before their teardown; a test body must not call ``asyncio.run`` itself (use the
    stack's HTTP API instead).
    """
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} not found: browser tests need Debian's chromium "
            "(scripts/install-chromium installs it; `make test` and CI run it)"
        )
    with sync_playwright() as pw:
        yield pw


def launch(pw: Playwright, profile: Path, *, trust_spki: str | None = None) -> BrowserContext:
    """Start headless Chromium with a fresh, empty profile in ``profile``; the caller closes it.

    Each call is a separate browser with its own cookies: two people signed in at once.
    ``trust_spki``: the base64 SHA-256 of a test certificate's public key, which Chromium
    then accepts as valid (``tests/support/tls.py``), so https pages are secure contexts
    with their ordinary cookie rules, not certificate-error pages.
    """
    flags = list(CHROMIUM_FLAGS)
    if trust_spki:
        flags.append(f"--ignore-certificate-errors-spki-list={trust_spki}")
    # Chromium refuses to run as root inside its sandbox; the sandbox needs user namespaces
    # a container rarely grants. As an unprivileged user the sandbox stays on.
    if os.geteuid() == 0:
        flags.append("--no-sandbox")
    context = pw.chromium.launch_persistent_context(
        user_data_dir=str(profile),
        executable_path=str(CHROMIUM),
        headless=True,
        args=flags,
        viewport={"width": 1280, "height": 900},
        # A service worker's fetches would bypass the routes that block outside hosts.
        service_workers="block",
    )
    context.set_default_timeout(TIMEOUT_MS)
    return context


@pytest.fixture
def browser_context(playwright_driver: Playwright, tmp_path: Path) -> Iterator[BrowserContext]:
    """Headless Chromium with a fresh, empty profile in this test's temporary directory."""
    context = launch(playwright_driver, tmp_path / "chromium-profile")
    try:
        yield context
    finally:
        context.close()


def _watched_browser(
    request: pytest.FixtureRequest, context: BrowserContext, stack: Stack, suffix: str = ""
) -> Iterator[Browser]:
    external: list[tuple[str, str]] = []
    block_external(context, external)
    page = context.pages[0] if context.pages else context.new_page()
    # <module>.<test>[<params>]: unique across modules and parametrizations (xdist-safe).
    module = Path(request.node.nodeid.split("::", 1)[0]).stem
    shots = ARTIFACTS / "screenshots" / _slug(f"{module}.{request.node.name}{suffix}")
    b = Browser(page=page, base_url=stack.url, shots=shots, external=external)
    yield b
    if page.url.startswith("http"):
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "zz-last.png"))
    assert not external, f"the page asked hosts outside this machine: {external}"


@pytest.fixture
def browser(
    request: pytest.FixtureRequest, browser_context: BrowserContext, stack: Stack
) -> Iterator[Browser]:
    """A page on ``stack`` that refuses outside hosts; the test fails if the page asked one.

    The page's last viewport is screenshotted at teardown too (``zz-last.png``), so a
    failed test leaves a picture of what the browser showed.
    """
    yield from _watched_browser(request, browser_context, stack)


@pytest.fixture
def second_browser(
    request: pytest.FixtureRequest, playwright_driver: Playwright, stack: Stack, tmp_path: Path
) -> Iterator[Browser]:
    """Another person's browser beside ``browser``: its own Chromium and profile (cookies).

    Guarded like ``browser``; its screenshots go to ``<test>.second/``.
    """
    context = launch(playwright_driver, tmp_path / "chromium-profile-second")
    try:
        yield from _watched_browser(request, context, stack, ".second")
    finally:
        context.close()


@pytest.fixture
def console(stack: Stack) -> Stack:
    """``stack``, skipped with the reason when this build has no console (``/ui/login`` 404).

    Only a 404 skips: the console branch (issue 17) may not be merged yet. Any other status
    than 200 is a failure of the console.
    """
    status = httpx.get(stack.url + "/ui/login", timeout=60).status_code
    if status == 404:
        pytest.skip("no console in this build: /ui/login is 404 (issue 17 not merged yet)")
    assert status == 200, f"/ui/login answered {status}"
    return stack


@pytest.fixture
def console_with_examples(console: Stack) -> Stack:
    """``console`` plus one ``treadle worker`` process serving ``treadle dev``'s examples."""
    console.start_worker(EXAMPLE_HANDLERS)
    return console


__all__ = ["TEST_DOMAIN", "Browser", "launch", "token"]
