"""A page of a sibling origin cannot sign the victim's browser in as the attacker.

Cookies separate by neither port nor sibling subdomain, so a page served on another port
of the console's host, or on another subdomain of its domain, can plant cookies the
console reads. Two attacks, each played by a real page in Debian's Chromium against a
real ``treadle serve``:

(a) **login CSRF**: the page plants the nonce cookie of the attacker's own sign-in form
    and auto-posts that form with the attacker's token; refused over http and https
    (app/console/origin.py, the signed token of app/console/crypto.py);
(b) **cookie tossing**: the page plants the attacker's session id as the session cookie;
    refused over https, where the console reads only ``__Host-`` cookies, which no
    sibling origin can set (app/console/cookies.py).

Names under ``treadle.test`` resolve to 127.0.0.1 inside Chromium (tests/browser/
conftest.py): the console is ``console.treadle.test:<port>``, the attacker
``evil.treadle.test`` (a sibling subdomain) or ``console.treadle.test`` on another port.
All traffic stays on loopback. The one origin nothing in a cookie can stop, an https
server on another port of the same host (it is sent every cookie of the host), is named
in docs/console.md and not played here for (b).
"""

from __future__ import annotations

import html
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Playwright, sync_playwright

from tests.acceptance.conftest import Stack, token
from tests.browser.conftest import CHROMIUM, TEST_DOMAIN, block_external, launch
from tests.console.conftest import CONSOLE_SECRET, field
from tests.support.tls import Certificate, self_signed

CONSOLE = f"console.{TEST_DOMAIN}"
EVIL = f"evil.{TEST_DOMAIN}"
ATTACKER = ("evil", "mallory")  # tenant, subject


class AttackerSite:
    """One attacker page served on 127.0.0.1 (http, or https with ``tls``), in a thread.

    ``page`` is the HTML of every GET; ``set_cookies`` are sent as Set-Cookie headers.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.page = ""
        self.set_cookies: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = site.page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for cookie in site.set_cookies:
                    self.send_header("Set-Cookie", cookie)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, host: str) -> str:
        """The page's address under ``host`` (a name of the test domain)."""
        return f"{self.scheme}://{host}:{self.port}/"

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Target:
    """The console under attack: its stack and how the victim's browser reaches it."""

    stack: Stack
    scheme: str
    cert: Certificate

    @property
    def base(self) -> str:
        """``<scheme>://console.treadle.test:<port>``."""
        return f"{self.scheme}://{CONSOLE}:{self.stack.url.rsplit(':', 1)[1]}"

    def client(self) -> httpx.Client:
        """The attacker's own HTTP client of the console (no browser headers)."""
        return httpx.Client(base_url=self.stack.url, timeout=60, verify=self.stack.verify)


@pytest.fixture(params=["http", "https"])
def target(
    request: pytest.FixtureRequest, database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> Iterator[Target]:
    """``treadle serve`` with the console, over http or (its own certificate) https."""
    cert = self_signed(tmp_path / "tls", [CONSOLE, EVIL, "localhost"], ["127.0.0.1"])
    env = {**stack_env, "TREADLE_CONSOLE_SECRET": CONSOLE_SECRET}
    if request.param == "https":
        env |= {
            "TREADLE_SSL_CERTFILE": str(cert.certfile),
            "TREADLE_SSL_KEYFILE": str(cert.keyfile),
        }
    s = Stack(
        database_url=database_url,
        tmp=tmp_path,
        env=env,
        verify=cert.client_context() if request.param == "https" else Stack.verify,
    )
    try:
        s.start_api()
        yield Target(stack=s, scheme=request.param, cert=cert)
    finally:
        s.stop()


@pytest.fixture
def driver(target: Target) -> Iterator[Playwright]:
    """Playwright, started after the stack (see tests/browser/conftest.py's driver)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: browser tests need Debian's chromium")
    with sync_playwright() as pw:
        yield pw


def _attacker_origins(target: Target) -> list[tuple[str, str]]:
    """(scheme, host) of each sibling the attacker serves from: subdomain, same host.

    An https page's form to an http console stops at Chromium's "not secure" warning,
    so against http the attacker serves http (as one would).
    """
    origins = [("http", EVIL), ("http", CONSOLE)]
    return [*origins, ("https", EVIL)] if target.scheme == "https" else origins


def _cookie_from(response: httpx.Response, name: str) -> str:
    # Under either name: what the attacker got is what it plants, whatever the console
    # calls it (the attack is judged in the victim's browser).
    for header in response.headers.get_list("set-cookie"):
        if header.startswith((name + "=", "__Host-" + name + "=")) and "Max-Age=0" not in header:
            return header.split(";", 1)[0].split("=", 1)[1]
    raise AssertionError(f"no {name} cookie: {response.headers.get_list('set-cookie')}")


def _plant(name: str, value: str, path: str) -> list[str]:
    """Every way a sibling page may try to set cookie ``name``.

    For the parent domain and host-only, with and without Secure: the browser drops
    what it must.
    """
    return [
        f"{name}={value}; Domain={TEST_DOMAIN}; Path={path}",
        f"{name}={value}; Domain={TEST_DOMAIN}; Path={path}; Secure",
        f"{name}={value}; Path={path}; Secure",
        f"{name}={value}; Path={path}",
    ]


def _page(cookies: list[str], then: str) -> str:
    """An attacker page: set ``cookies`` from script too, then run ``then``."""
    sets = "".join(f"document.cookie = {c!r};\n" for c in cookies)
    return f"<!doctype html><title>win a prize</title><script>\n{sets}</script>{then}"


def _victim_lands_unsigned(
    driver: Playwright, tmp: Path, target: Target, site: AttackerSite, host: str
) -> str:
    """Open the attacker's page in a fresh victim browser; return what /ui/runs shows."""
    context = launch(driver, tmp, trust_spki=target.cert.spki_sha256)
    try:
        external: list[tuple[str, str]] = []
        block_external(context, external)
        page = context.pages[0] if context.pages else context.new_page()
        page.goto(site.url(host))
        page.wait_for_url(re.compile(re.escape(target.base) + "/ui/.*"), wait_until="load")
        page.goto(target.base + "/ui/runs", wait_until="load")
        assert not external, external
        return f"{page.url}\n{page.content()}"
    finally:
        context.close()


def test_login_csrf_from_a_sibling_origin_signs_nobody_in(
    target: Target, driver: Playwright, tmp_path: Path
) -> None:
    for n, (scheme, host) in enumerate(
        [*_attacker_origins(target), *([("https", CONSOLE)] if target.scheme == "https" else [])]
    ):
        # The attacker's own sign-in form, fetched from the console: a real nonce
        # cookie and its field.
        with target.client() as attacker:
            form = attacker.get("/ui/login")
            nonce = _cookie_from(form, "treadle_console_login")
            login_csrf = field(form.text, "login_csrf")
        site = AttackerSite(target.cert.server_context() if scheme == "https" else None)
        try:
            planted = [
                *_plant("treadle_console_login", nonce, "/ui/login"),
                *_plant("__Host-treadle_console_login", nonce, "/"),
            ]
            site.set_cookies = planted
            fields = {"token": token(*ATTACKER), "login_csrf": login_csrf, "next": "/ui/runs"}
            inputs = "".join(
                f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
                for k, v in fields.items()
            )
            site.page = _page(
                planted,
                f'<form method="post" action="{target.base}/ui/login">{inputs}</form>'
                "<script>document.forms[0].submit()</script>",
            )
            shown = _victim_lands_unsigned(driver, tmp_path / f"victim-{n}", target, site, host)
        finally:
            site.stop()
        where = f"attacker at {scheme}://{host}:{site.port}, console {target.base}"
        assert shown.startswith(target.base + "/ui/login"), (where, shown[:3000])
        assert "mallory" not in shown, where


def test_cookie_tossing_over_https_signs_nobody_in(
    target: Target, driver: Playwright, tmp_path: Path
) -> None:
    if target.scheme != "https":
        pytest.skip("over plain http no cookie prefix helps (docs/console.md)")
    with target.client() as attacker:
        form = attacker.get("/ui/login")
        signed_in = attacker.post(
            "/ui/login",
            data={"token": token(*ATTACKER), "login_csrf": field(form.text, "login_csrf")},
        )
        assert signed_in.status_code == 303, signed_in.text[:500]
        sid = _cookie_from(signed_in, "treadle_console")
        # The attacker's session is real: as the console's own cookie it is mallory's.
        own = attacker.get(
            "/ui/runs",
            headers={"Cookie": f"__Host-treadle_console={sid}; treadle_console={sid}"},
        )
        assert own.status_code == 200 and "mallory" in own.text
    for n, (scheme, host) in enumerate(_attacker_origins(target)):
        site = AttackerSite(target.cert.server_context() if scheme == "https" else None)
        try:
            planted = [
                *_plant("treadle_console", sid, "/ui"),
                *_plant("treadle_console", sid, "/"),
                *_plant("__Host-treadle_console", sid, "/"),
            ]
            site.set_cookies = planted
            site.page = _page(planted, f"<script>location = {target.base + '/ui/runs'!r}</script>")
            shown = _victim_lands_unsigned(driver, tmp_path / f"victim-{n}", target, site, host)
        finally:
            site.stop()
        where = f"attacker at {scheme}://{host}:{site.port}, console {target.base}"
        assert shown.startswith(target.base + "/ui/login"), (where, shown[:3000])
        assert "mallory" not in shown, where
