"""Secure, ``__Host-`` cookies whenever the browser is on https, over real HTTP.

Two ways a console is on https: ``treadle serve`` serves TLS itself
(``TREADLE_SSL_CERTFILE``/``KEYFILE``), or a proxy elsewhere ends TLS and says so with
``X-Forwarded-Proto: https``, believed only from ``TREADLE_FORWARDED_ALLOW_IPS``
(uvicorn's proxy headers). Loopback has all of 127.0.0.0/8: the "proxy" is a client bound
to 127.0.0.2, the untrusted peer one on 127.0.0.1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.core.settings import Settings
from tests.acceptance.conftest import Stack, token
from tests.console.conftest import CONSOLE_SECRET, field
from tests.helpers import TLS
from tests.support.tls import self_signed

PROXY = "127.0.0.2"
HTTPS = {"X-Forwarded-Proto": "https"}


@pytest.fixture
def behind_proxy(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """``treadle serve`` trusting the proxy at 127.0.0.2 only."""
    s = Stack(
        database_url=database_url,
        tmp=tmp_path,
        env={
            **stack_env,
            "TREADLE_CONSOLE_SECRET": CONSOLE_SECRET,
            "TREADLE_FORWARDED_ALLOW_IPS": f"{PROXY}/32",
        },
    )
    try:
        s.start_api()
        yield s
    finally:
        s.stop()


def _client(url: str, source: str) -> httpx.Client:
    # Cookies by hand: httpx's jar would not send a Secure cookie over this http socket.
    return httpx.Client(
        base_url=url,
        timeout=60,
        verify=TLS,
        transport=httpx.HTTPTransport(local_address=source, verify=TLS),
    )


def _cookie(response: httpx.Response, name: str) -> str:
    found = [h for h in response.headers.get_list("set-cookie") if h.startswith(name + "=")]
    assert len(found) == 1, (name, response.headers.get_list("set-cookie"))
    return found[0]


def _value(header: str) -> str:
    return header.split(";", 1)[0].split("=", 1)[1]


def _sign_in(c: httpx.Client, login: str, headers: dict[str, str]) -> httpx.Response:
    """GET the form, then POST it back with its cookie, as a browser would."""
    form = c.get("/ui/login", headers=headers)
    nonce = _value(_cookie(form, login))
    return c.post(
        "/ui/login",
        data={"token": token(), "login_csrf": field(form.text, "login_csrf")},
        headers={**headers, "Cookie": f"{login}={nonce}"},
    )


def test_forwarded_https_from_a_trusted_proxy_gets_host_cookies(behind_proxy: Stack) -> None:
    with _client(behind_proxy.url, PROXY) as proxy:
        signed_in = _sign_in(proxy, "__Host-treadle_console_login", HTTPS)
        assert signed_in.status_code == 303, signed_in.text[:500]
        session = _cookie(signed_in, "__Host-treadle_console")
        assert re.search(r";\s*Secure", session, re.I), session
        assert re.search(r";\s*Path=/(;|$)", session), session
        assert "domain" not in session.lower() and "httponly" in session.lower()
        sid = _value(session)
        page = proxy.get("/ui/runs", headers={**HTTPS, "Cookie": f"__Host-treadle_console={sid}"})
        assert page.status_code == 200 and "alice" in page.text
        # On https only the __Host- name is read: the bare one (what a sibling origin
        # can plant) signs nobody in.
        tossed = proxy.get("/ui/runs", headers={**HTTPS, "Cookie": f"treadle_console={sid}"})
        assert tossed.status_code == 303 and "/ui/login" in tossed.headers["location"]


def test_forwarded_https_from_an_untrusted_peer_is_ignored(behind_proxy: Stack) -> None:
    with _client(behind_proxy.url, "127.0.0.1") as stranger:
        signed_in = _sign_in(stranger, "treadle_console_login", HTTPS)
        assert signed_in.status_code == 303, signed_in.text[:500]
        session = _cookie(signed_in, "treadle_console")
        assert not re.search(r";\s*Secure", session, re.I), session
        assert "Path=/ui" in session
        assert not any(h.startswith("__Host-") for h in signed_in.headers.get_list("set-cookie"))


def test_serve_over_tls_sets_host_cookies(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> None:
    cert = self_signed(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    s = Stack(
        database_url=database_url,
        tmp=tmp_path,
        env={
            **stack_env,
            "TREADLE_CONSOLE_SECRET": CONSOLE_SECRET,
            "TREADLE_SSL_CERTFILE": str(cert.certfile),
            "TREADLE_SSL_KEYFILE": str(cert.keyfile),
        },
        verify=cert.client_context(),
    )
    try:
        s.start_api()
        assert s.url.startswith("https://")
        with httpx.Client(base_url=s.url, timeout=60, verify=cert.client_context()) as c:
            form = c.get("/ui/login")
            login = _cookie(form, "__Host-treadle_console_login")
            assert re.search(r";\s*Secure", login, re.I) and re.search(r"Path=/(;|$)", login)
            signed_in = c.post(
                "/ui/login",
                data={"token": token(), "login_csrf": field(form.text, "login_csrf")},
            )
            assert signed_in.status_code == 303, signed_in.text[:500]
            assert re.search(r";\s*Secure", _cookie(signed_in, "__Host-treadle_console"), re.I)
            assert c.get("/ui/runs").status_code == 200
        # The ready line says where: https.
        assert f"ready on {s.url}" in s.logs[0].read_text()
    finally:
        s.stop()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"forwarded_allow_ips": "10.0.0.1,proxy.internal"}, "'proxy.internal'"),
        ({"forwarded_allow_ips": " , "}, "at least one address"),
        ({"ssl_certfile": __file__}, "go together"),
        ({"ssl_certfile": "/nonexistent.pem", "ssl_keyfile": __file__}, "no such file"),
    ],
)
def test_bad_tls_or_proxy_settings_are_refused_by_name(
    values: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings(**values)  # type: ignore[arg-type]


def test_trusted_proxies_accept_addresses_networks_and_any() -> None:
    assert Settings(forwarded_allow_ips=" 10.0.0.0/8, ::1 ,*").forwarded_allow_ips == (
        "10.0.0.0/8,::1,*"
    )
