"""The client's HTTP behaviour against a real local server that answers as scripted.

A real ``http.server`` on 127.0.0.1 (not a mocked transport) answers 503 with
``Retry-After``, HTML error pages and non-JSON successes, the answers a load balancer or
a proxy in front of Treadle can give; the client must retry what is retryable, a bounded
number of times, and turn everything else into one ``TreadleAPIError``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.client import AsyncTreadleClient, TreadleAPIError, TreadleClient
from app.client._http import retry_delay

Answer = tuple[int, dict[str, str], bytes]
PROBLEM_503: Answer = (
    503,
    {"Content-Type": "application/problem+json", "Retry-After": "1"},
    json.dumps(
        {
            "type": "urn:treadle:problem:database_unavailable",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "the database is unavailable; retry shortly",
            "code": "database_unavailable",
        }
    ).encode(),
)
WORKFLOWS: Answer = (200, {"Content-Type": "application/json"}, b'{"items": []}')


class Scripted:
    """A local HTTP server answering each request with the next scripted answer."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.seen: list[tuple[float, str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                outer.seen.append((time.monotonic(), self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, headers, body = outer.answers.pop(0) if outer.answers else WORKFLOWS
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's naming

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    server = Scripted()
    try:
        yield server
    finally:
        server.close()


def test_503_is_retried_after_retry_after_then_succeeds(scripted: Scripted) -> None:
    scripted.answers = [PROBLEM_503, PROBLEM_503]
    with TreadleClient(scripted.url, "t", max_retries=3) as api:
        assert api.workflows().items == []
    assert len(scripted.seen) == 3
    # Retry-After: 1 was honoured between attempts (a lower bound, never an upper one).
    gaps = [b[0] - a[0] for a, b in zip(scripted.seen, scripted.seen[1:], strict=False)]
    assert all(gap >= 0.95 for gap in gaps), gaps


def test_retries_are_bounded_and_a_post_is_resent_whole(scripted: Scripted) -> None:
    scripted.answers = [PROBLEM_503] * 10
    api = TreadleClient(scripted.url, "t", max_retries=2, max_retry_wait=0.05)
    with api, pytest.raises(TreadleAPIError) as exc:
        api.submit("w", {"x": 1})
    assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
    assert exc.value.title == "Service Unavailable"
    assert [(m, p) for _, m, p in scripted.seen] == [("POST", "/runs")] * 3


async def test_async_client_retries_too(scripted: Scripted) -> None:
    scripted.answers = [PROBLEM_503]
    async with AsyncTreadleClient(scripted.url, "t", max_retry_wait=0.05) as api:
        assert (await api.workflows()).items == []
    assert len(scripted.seen) == 2


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        ((502, {"Content-Type": "text/html"}, b"<html><h1>Bad Gateway</h1></html>"), 502),
        ((500, {}, b""), 500),
        ((404, {"Content-Type": "application/json"}, b'{"detail": "Not Found"}'), 404),
        ((200, {"Content-Type": "text/html"}, b"<html>a login page</html>"), 200),
        ((200, {"Content-Type": "application/json"}, b"{not json"), 200),
        ((200, {"Content-Type": "application/json"}, b'{"unexpected": true}'), 200),
    ],
)
def test_answers_that_are_no_problem_are_one_clear_error(
    scripted: Scripted, answer: Answer, status: int
) -> None:
    scripted.answers = [answer]
    with TreadleClient(scripted.url, "t") as api, pytest.raises(TreadleAPIError) as exc:
        api.workflows()
    assert (exc.value.status, exc.value.code) == (status, "unexpected_response")
    assert "\n" not in str(exc.value)


def test_retry_delay_reads_seconds_and_dates() -> None:
    def resp(value: str | None) -> httpx.Response:
        headers = {"Retry-After": value} if value is not None else {}
        return httpx.Response(503, headers=headers)

    assert retry_delay(resp("2"), 0, 30) == 2
    assert retry_delay(resp("120"), 0, 30) == 30  # capped
    assert retry_delay(resp("-5"), 0, 30) == 0
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=10), usegmt=True)
    assert 8 <= retry_delay(resp(when), 0, 30) <= 10
    assert retry_delay(resp(None), 0, 30) == 0.5
    assert retry_delay(resp("soon"), 2, 30) == 2.0
