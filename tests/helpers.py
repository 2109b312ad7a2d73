"""Test helpers: deadline polling (never fixed sleeps) and waiting for a server to serve."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

# httpx builds a new SSL context for every client it creates unless it is given one, and
# that costs about 30 ms of CPU (it loads certifi's CA bundle): a probe that opened a client
# per poll spent more CPU on it than on the request, in the test process and beside the
# API and workers it waits for on a 2-core machine. The tests talk plain HTTP, so the
# context is never used for a handshake; it is httpx's own default, built once.
TLS = httpx.create_ssl_context()


async def wait_for(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns a truthy value or ``timeout`` seconds pass.

    Raises:
        AssertionError: the deadline passed; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def wait_for_sync(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Synchronous :func:`wait_for`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_until_serving(
    url: str,
    process: subprocess.Popen[Any],
    log: Path,
    *,
    timeout: float = 90.0,
) -> None:
    """Poll ``url + "/readyz"`` until it answers 200 while ``process`` stays alive.

    A process may print its banner (tokens, URLs) before uvicorn binds its socket, so a
    refused or reset connection means "not yet", never a failure; only the deadline or the
    process exiting fails the test, with the tail of ``log`` in the message. Polled every
    20 ms: until the socket is bound a probe is a refused connect (no work for the process
    being waited for), and one client serves every probe.

    Raises:
        AssertionError: ``process`` exited, or ``timeout`` seconds passed.
    """
    with httpx.Client(base_url=url, timeout=5, verify=TLS) as client:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"process exited ({process.returncode}): {log.read_text()[-3000:]}"
                )
            try:
                return client.get("/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for_sync(ready, timeout=timeout, what=f"{url} ready")


class TcpForwarder:
    """A TCP port that is closed until :meth:`open`, then forwards to ``target``.

    A database URL through it points at a server that is down (connections refused, as
    while PostgreSQL restarts) until the test opens the port; from then on every
    connection is relayed byte for byte to the real server. Threads, not the test's event
    loop, so it serves subprocesses and in-process code alike. :meth:`close` ends the
    listener and every relayed connection (use it in a ``finally``).

    Args:
        target: ``(host, port)`` of the real server.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as s:  # a free port, bound only once opened
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def open(self) -> None:
        """Start accepting and relaying connections."""
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # Half a connection ended: end the other half, as a real peer's close would.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        self._closed.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets = []
