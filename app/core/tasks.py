"""Stopping background tasks for certain.

``Task.cancel()`` is edge-triggered: it raises one ``CancelledError`` at the task's next
``await``. On Python 3.11 ``asyncio.wait_for`` can swallow that one when the awaited call
completes in the same turn of the event loop (CPython gh-86296, fixed in 3.12), and
asyncpg's ``connect(timeout=...)`` and many others await through it. A helper loop that
ends only by cancellation then runs on: a worker under load, stopped right after start
(its LISTEN loop was connecting), hung on SIGTERM in the acceptance tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RECANCEL_SECONDS = 0.5
"""How long a cancelled task may run on before it is cancelled again."""


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], *, recancel_seconds: float = RECANCEL_SECONDS
) -> None:
    """Cancel ``tasks`` and return once every one has ended.

    A task still running ``recancel_seconds`` after its cancellation (it lost the first
    ``CancelledError``, see the module docstring) is cancelled again, until it ends. Each
    task's exception, if any, is retrieved and dropped: the caller is shutting down.
    """
    all_tasks = list(tasks)
    pending = {t for t in all_tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=recancel_seconds)
    await asyncio.gather(*all_tasks, return_exceptions=True)
