"""Test helpers: deadline polling (never fixed sleeps) and waiting for a server to serve."""

from __future__ import annotations

import asyncio
import subprocess
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
