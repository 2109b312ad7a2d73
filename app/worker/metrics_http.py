"""The worker's ``/metrics`` endpoint (``treadle worker --metrics-port``), HEAD included.

prometheus_client's own server answers ``GET`` only (``HEAD`` is 405), and load balancers
and uptime checkers probe with ``HEAD``: the same WSGI app of prometheus_client, served
the way its ``start_http_server`` serves it (a daemon thread, a threading WSGI server, no
access log), with ``HEAD`` answered as ``GET`` without the body (docs/api.md, "Health").
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

_App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Quiet(WSGIRequestHandler):
    # Scraped every few seconds: no line per request on stderr (as prometheus_client).
    def log_message(self, format: str, *args: Any) -> None:
        return


def head_as_get(app: _App) -> _App:
    """``app`` answering ``HEAD`` as ``GET``: same status and headers, no body.

    The GET's body is read to give ``Content-Length`` its true value, then dropped.
    """

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answered: list[tuple[str, list[tuple[str, str]]]] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answered.append((status, headers))
            return lambda data: None

        result = app({**environ, "REQUEST_METHOD": "GET"}, capture)
        try:
            length = sum(len(chunk) for chunk in result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = answered[-1]
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(length))]
        start_response(status, headers)
        return []

    return wrapped


def serve_metrics(port: int, addr: str) -> WSGIServer:
    """Serve this process's Prometheus registry on ``addr:port`` from a daemon thread.

    Args:
        port: TCP port (``--metrics-port``); 0 picks a free one (``server_port``).
        addr: the interface (``TREADLE_HOST``), IPv4 or IPv6.

    Returns:
        The running server (``shutdown()`` stops it; the worker never needs to).

    Raises:
        OSError: the port cannot be bound.
    """
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    app = head_as_get(make_wsgi_app(REGISTRY))
    httpd = make_server(addr, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="treadle-metrics", daemon=True).start()
    return httpd
