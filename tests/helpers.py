"""Test helpers: deadline polling (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


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
