"""The worker's ``/metrics`` (``--metrics-port``) answers HEAD as GET, over real HTTP.

prometheus_client's own server answers HEAD with 405; load balancers and uptime checkers
probe with HEAD (docs/api.md, "Health"). Read from a raw socket on a real port, so a body
sent after the headers would be seen.
"""

from __future__ import annotations

from app.worker.metrics_http import serve_metrics
from tests.helpers import raw_http


def test_head_is_get_without_the_body() -> None:
    server = serve_metrics(0, "127.0.0.1")
    try:
        port = server.server_port
        status, headers, body = raw_http("127.0.0.1", port, "HEAD", "/metrics")
        got_status, got_headers, got_body = raw_http("127.0.0.1", port, "GET", "/metrics")
        assert status == got_status == 200, (status, got_status)
        assert body == b"" and b"# HELP" in got_body
        assert headers["content-type"] == got_headers["content-type"]
        assert int(headers["content-length"]) > 0
        # Other methods are still refused by prometheus_client's app.
        assert raw_http("127.0.0.1", port, "POST", "/metrics")[0] == 405
    finally:
        server.shutdown()
        server.server_close()
