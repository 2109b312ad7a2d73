"""``HEAD`` on the probes (``/healthz``, ``/readyz``, ``/metrics``) over real HTTP.

Load balancers and uptime checkers probe with ``HEAD``: each probe answers it with the
status and headers ``GET`` has, and no body (docs/api.md, "Health"). Read from a raw
socket, so a body sent after the headers would be seen (an HTTP client drops it).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.acceptance.conftest import Stack
from tests.helpers import raw_http

pytestmark = pytest.mark.timeout(300)  # an API process on a loaded machine

PROBES = ("/healthz", "/readyz", "/metrics")


def _raw(url: str, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return raw_http(parts.hostname, parts.port, method, path)


def test_every_probe_answers_head_as_get_without_a_body(stack: Stack) -> None:
    for path in PROBES:
        status, headers, body = _raw(stack.url, "HEAD", path)
        got_status, got_headers, got_body = _raw(stack.url, "GET", path)
        assert status == got_status == 200, (path, status, got_status)
        assert body == b"", (path, body[:200])
        assert got_body, path  # the GET does carry one
        assert headers["content-type"] == got_headers["content-type"], path
    # Other operations keep their methods: HEAD is added for the probes only.
    assert _raw(stack.url, "HEAD", "/runs")[0] == 405
