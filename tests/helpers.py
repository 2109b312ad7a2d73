"""Test helpers: deadline polling (never fixed sleeps) and waiting for a server to serve."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
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
    verify: ssl.SSLContext = TLS,
) -> None:
    """Poll ``url + "/readyz"`` until it answers 200 while ``process`` stays alive.

    ``verify`` checks an https server's certificate (a test's own CA, for example).

    A process may print its banner (tokens, URLs) before uvicorn binds its socket, so a
    refused or reset connection means "not yet", never a failure; only the deadline or the
    process exiting fails the test, with the tail of ``log`` in the message. Polled every
    20 ms: until the socket is bound a probe is a refused connect (no work for the process
    being waited for), and one client serves every probe.

    Raises:
        AssertionError: ``process`` exited, or ``timeout`` seconds passed.
    """
    with httpx.Client(base_url=url, timeout=5, verify=verify) as client:

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


def raw_http(host: str, port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on its own socket (``Connection: close``), read to the end.

    For tests that must see exactly what the server sent: everything after the head until
    the server closes is the body (an HTTP client would drop a body after a ``HEAD``).

    Returns:
        ``(status, headers, body)``: the status code, the headers with lower-cased names,
        and the raw body bytes.

    Raises:
        OSError: the connection failed or timed out (30 s).
    """
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


class Deadlock:
    """Makes the code under test the victim of a real PostgreSQL deadlock, every time.

    PostgreSQL checks a blocked session for a deadlock once, ``deadlock_timeout`` (1 s by
    default) after that wait began, and the session whose check finds the cycle is the one
    aborted (SQLSTATE 40P01). A test that lets the victim block on its second lock and only
    then closes the cycle races that single check: on a loaded machine the closing
    statement comes after it, no one else checks for a minute, and a statement timeout
    fires instead of the deadlock.

    So the victim's wait for its second lock is made to begin after the cycle's other edge
    exists. ``gate`` holds the victim's first lock and ``other`` its second (:meth:`hold`);
    the victim blocks on the gate; ``other`` asks for the first lock and queues behind the
    victim; the gate lets go; the victim takes its first lock and blocks on ``other`` with
    the cycle already closed, so its one check finds it (:meth:`close`). ``gate`` and
    ``other`` wait 60 s before their own checks, so they are never the victim.

    ``dsn`` is a libpq URL (``postgresql://…``). Use as ``async with Deadlock(dsn) as d``;
    leaving the block closes both connections (rolling back what they hold).
    """

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._gate: Any = None
        self._other: Any = None
        self._gate_tx: Any = None
        self._other_tx: Any = None

    async def __aenter__(self) -> Deadlock:
        import asyncpg  # only the PostgreSQL tests need it

        self._gate = await asyncpg.connect(self._dsn)
        self._other = await asyncpg.connect(self._dsn)
        for conn in (self._gate, self._other):
            await conn.execute("SET deadlock_timeout = '60s'")
        self._gate_tx = self._gate.transaction()
        self._other_tx = self._other.transaction()
        await self._gate_tx.start()
        await self._other_tx.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in (self._gate, self._other):
            if conn is not None:
                await conn.close()

    async def hold(self, first: str, second: str, *args: Any) -> None:
        """Take the victim's ``first`` lock (by the gate) and its ``second`` (by ``other``).

        ``first`` and ``second`` are SQL statements taking the same row locks the victim's
        first and second statements take (``SELECT … FOR UPDATE`` or the writes
        themselves), with ``$1…`` bound to ``args``. Call before the victim starts.
        """
        await self._gate.execute(first, *args)
        await self._other.execute(second, *args)

    async def close(self, closing: str, *args: Any, timeout: float = 30.0) -> None:
        """Close the cycle once the victim waits; return after PostgreSQL aborted it.

        ``closing`` is ``other``'s request for the victim's first lock. ``other``
        commits at the end, so the victim's retry (if it has one) can then go through.

        Raises:
            AssertionError: the victim, or ``other``, did not block within ``timeout`` s,
                or ``other`` did not get the lock within ``timeout`` s of the gate's
                release.
        """
        helpers = (self._gate.get_server_pid(), self._other.get_server_pid())

        async def waiting(*, helper: bool) -> bool:
            # Inside its transaction the gate would see one snapshot of the activity.
            await self._gate.execute("SELECT pg_stat_clear_snapshot()")
            pids = await self._gate.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            return any((row["pid"] in helpers) is helper for row in pids)

        await wait_for(lambda: waiting(helper=False), timeout=timeout, what="the victim blocked")
        closing_task = asyncio.create_task(self._other.execute(closing, *args))
        await wait_for(
            lambda: waiting(helper=True), timeout=timeout, what="the closing request blocked"
        )
        await self._gate_tx.rollback()
        await asyncio.wait_for(closing_task, timeout)
        await self._other_tx.commit()
