"""Slow clients (slowloris) over real sockets against real ``treadle serve`` and ``treadle dev``.

A client trickling one byte at a time must not hold a connection beyond the read bounds
(``TREADLE_HEADER_READ_TIMEOUT_SECONDS``, ``TREADLE_BODY_READ_TIMEOUT_SECONDS``): a slow
head or body gets ``408 request_timeout`` and the connection closes; a connection that
sends nothing is closed; other clients are served meanwhile; nothing is stored. Deadlines
are generous (bound plus 20 s); nothing asserts how fast.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Stack, free_port, token
from tests.acceptance.test_http_input import register_workflows
from tests.helpers import wait_for_sync, wait_until_serving

BOUND = 2.0  # both read bounds, seconds
SLACK = 20.0  # generous: a loaded machine may be slow to close, never this slow
TRICKLE_INTERVAL = 0.25  # one byte every 0.25 s: far slower than any bound allows
TENANT = "slow"


@dataclass
class Outcome:
    """What a trickling client saw."""

    received: bytes
    closed: bool  # the server closed (EOF or reset) before the client gave up
    sent: int  # bytes of the trickle the server took

    @property
    def status(self) -> int | None:
        """The status code of the first response, if one came."""
        if not self.received.startswith(b"HTTP/1.1 "):
            return None
        return int(self.received[9:12])

    def problem(self) -> dict[str, Any]:
        """The JSON body of the (last) response."""
        _, _, body = self.received.rpartition(b"\r\n\r\n")
        parsed: dict[str, Any] = json.loads(body)
        return parsed


def trickle(port: int, prefix: bytes, trickled: bytes, *, give_up: float) -> Outcome:
    """Send ``prefix`` at once, then ``trickled`` one byte per interval, reading replies.

    Stops when the server closes the connection or after ``give_up`` seconds.
    """
    received = b""
    sent = 0
    deadline = time.monotonic() + give_up
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(TRICKLE_INTERVAL)
        try:
            if prefix:
                sock.sendall(prefix)
            while time.monotonic() < deadline:
                if sent < len(trickled):
                    sock.sendall(trickled[sent : sent + 1])
                    sent += 1
                try:
                    chunk = sock.recv(65_536)
                except TimeoutError:
                    continue
                if not chunk:
                    return Outcome(received, True, sent)
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            return Outcome(received, True, sent)
    return Outcome(received, False, sent)


def _post_head(length: int, content_type: str = "application/json") -> bytes:
    return (
        "POST /runs HTTP/1.1\r\nHost: treadle\r\n"
        f"Authorization: Bearer {token(tenant=TENANT)}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


# A valid submission, padded so that the whole of it takes minutes to trickle in.
SUBMIT = json.dumps({"workflow": "acc-echo", "input": {"value": "x" * 2000}}).encode()


@pytest.fixture(params=["serve", "dev"])
def server(
    request: pytest.FixtureRequest, database_url: str, stack_env: dict[str, str], tmp_path: Path
) -> Iterator[Stack]:
    """``treadle serve`` (both databases) or ``treadle dev`` (SQLite) with 2 s read bounds."""
    if request.param == "dev" and not database_url.startswith("sqlite"):
        pytest.skip("treadle dev runs on the embedded SQLite database")
    env = {
        **stack_env,
        "TREADLE_HEADER_READ_TIMEOUT_SECONDS": str(BOUND),
        "TREADLE_BODY_READ_TIMEOUT_SECONDS": str(BOUND),
    }
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    if request.param == "serve":
        s.start_api()
        register_workflows(s)  # acc-echo registered: a finished body would be a run
    else:
        port = free_port()
        s.url = f"http://127.0.0.1:{port}"
        s.api = s._spawn(
            ["dev", "--port", str(port), "--handlers", "tests.acceptance.handlers"], "dev"
        )
        wait_until_serving(s.url, s.api, s.logs[-1], timeout=90)
        # treadle dev's in-process worker registers the handlers after the API serves.
        with s.client(token(tenant=TENANT)) as c:

            def registered() -> bool:
                listed = c.get("/workflows")
                return listed.status_code == 200 and any(
                    w["name"] == "acc-echo" for w in listed.json()["items"]
                )

            wait_for_sync(registered, timeout=90, interval=0.1, what="acc-echo registered")
    try:
        yield s
    finally:
        s.stop()


def _runs_of_tenant(s: Stack) -> list[Any]:
    with s.client(token(tenant=TENANT)) as c:
        resp = c.get("/runs")
        assert resp.status_code == 200, resp.text
        items: list[Any] = resp.json()["items"]
        return items


def test_slow_heads_and_bodies_are_cut_off_and_others_are_served(server: Stack) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    give_up = BOUND + SLACK
    slow_header = b"X-Slow: " + b"a" * 4000 + b"\r\n\r\n"
    cases = {
        # The head never completes: a header line trickles in.
        "slow head": (b"GET /healthz HTTP/1.1\r\nHost: treadle\r\n", slow_header),
        # Nothing at all after connecting.
        "silent connection": (b"", b""),
        # The head is in; the body of a valid submission trickles in (JSON path).
        "slow JSON body": (_post_head(len(SUBMIT)), SUBMIT),
        # Same through FastAPI's own body reader (not JSON: the route reads raw bytes).
        "slow text body": (_post_head(len(SUBMIT), "text/plain"), SUBMIT),
        # A route that answers without reading the body; the body keeps trickling.
        "unread body": (
            b"GET /healthz HTTP/1.1\r\nHost: treadle\r\nContent-Length: 4000\r\n\r\n",
            b"b" * 4000,
        ),
        # Keep-alive: one full request, then the next head trickles in.
        "slow second head": (b"GET /healthz HTTP/1.1\r\nHost: treadle\r\n\r\n", slow_header),
    }
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = {
            name: pool.submit(trickle, port, prefix, body, give_up=give_up)
            for name, (prefix, body) in cases.items()
        }
        # Meanwhile other clients are served, over fresh connections.
        with server.client(token(tenant="other")) as c:
            for _ in range(5):
                assert c.get("/readyz").status_code == 200
                assert c.get("/runs").status_code == 200
        outcomes = {name: f.result() for name, f in futures.items()}

    for name, outcome in outcomes.items():
        assert outcome.closed, f"{name}: connection still open after {give_up} s: {outcome}"
        # The server stopped long before the trickle ran out: it did not just read it all.
        assert outcome.sent < len(cases[name][1]) or not cases[name][1], f"{name}: {outcome}"

    for name in ("slow head", "slow JSON body", "slow text body"):
        outcome = outcomes[name]
        assert outcome.status == 408, f"{name}: {outcome.received[:400]!r}"
        assert b"content-type: application/problem+json" in outcome.received.lower(), name
        assert b"connection: close" in outcome.received.lower(), name
        problem = outcome.problem()
        assert problem["code"] == "request_timeout", problem
        assert problem["status"] == 408, problem
        assert problem["type"] == "urn:treadle:problem:request_timeout", problem
    assert outcomes["silent connection"].received == b""
    assert outcomes["unread body"].status == 200
    second = outcomes["slow second head"].received
    assert second.startswith(b"HTTP/1.1 200"), second[:200]
    assert second.count(b"HTTP/1.1 408") == 1, second[-400:]

    # Nothing stored, and the server still serves normally.
    assert _runs_of_tenant(server) == []
    with server.client(token(tenant="other")) as c:
        assert c.get("/readyz").status_code == 200


def test_a_body_within_the_bound_is_served(server: Stack) -> None:
    """A body sent in a few pieces inside the bound is a normal submission (201)."""
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps({"workflow": "acc-echo", "input": {"value": 1}}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_post_head(len(body)))
        sock.sendall(body[:10])
        sock.sendall(body[10:])
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65_536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 201"), reply[:300]
    assert len(_runs_of_tenant(server)) == 1


def test_read_bounds_are_validated() -> None:
    from pydantic import ValidationError

    from app.core.settings import Settings, format_settings_error

    for name in ("header_read_timeout_seconds", "body_read_timeout_seconds"):
        for bad in (0, -1, 10_000):
            values: dict[str, Any] = {name: bad}
            with pytest.raises(ValidationError) as info:
                Settings(**values)
            assert f"TREADLE_{name.upper()}" in format_settings_error(info.value)
