"""Coalesced worker wake-ups: one NOTIFY per short interval per process, after commit.

A transaction that issued NOTIFY takes PostgreSQL's global notification-queue lock while
it commits (``PreCommit_Notify`` in ``src/backend/commands/async.c``), so every such
commit in the cluster is serialized behind the others. Submits therefore commit without
NOTIFY and ask this per-process :class:`WakeCoalescer` to send one afterwards: the first
request after a quiet interval is sent at once (an idle submit still wakes a worker within
a round trip), and requests that arrive while one is pending or sent less than
``TREADLE_NOTIFY_COALESCE_MS`` ago are folded into a single later NOTIFY.

Polling is the safety net (docs/adr/0037-coalesced-wake-ups.md): a NOTIFY lost between
commit and send (process killed, connection error) delays the run by at most one
``TREADLE_POLL_INTERVAL_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

NOTIFY_CHANNEL = "treadle_runs"
"""The channel workers LISTEN on; the payload is empty (a hint to claim, not a message)."""

_NOTIFY = text("SELECT pg_notify(:c, '')")

_log = structlog.get_logger("treadle.wakeups")


class WakeCoalescer:
    """Sends at most one NOTIFY per ``interval_seconds`` for all requests in this process.

    Args:
        connect: opens an autocommit connection (:meth:`app.db.database.Database.autocommit`);
            each NOTIFY is its own one-statement transaction, apart from any submit's.
        interval_seconds: the coalescing window (``TREADLE_NOTIFY_COALESCE_MS`` / 1000);
            0 still sends at most one NOTIFY at a time.

    Attributes:
        sent: NOTIFYs sent so far (for tests and benchmarks).
    """

    def __init__(
        self,
        connect: Callable[[], AbstractAsyncContextManager[AsyncConnection]],
        interval_seconds: float,
    ) -> None:
        self._connect = connect
        self._interval = interval_seconds
        self._dirty = False
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def request(self) -> None:
        """Ask for a wake-up; call after the transaction that made work due has committed.

        Never blocks and never raises: the NOTIFY is sent by a background task of the
        running event loop (at once after a quiet interval, else at the window's end).
        """
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._dirty:
            wait = self._last + self._interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            # Cleared before sending: a request that lands during the send is a commit
            # this NOTIFY may have missed, so it earns one more round.
            self._dirty = False
            self._last = time.monotonic()
            try:
                async with self._connect() as conn:
                    await conn.execute(_NOTIFY, {"c": NOTIFY_CHANNEL})
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - polling covers a lost wake-up
                _log.warning("wake-up NOTIFY failed; workers will poll", error=repr(exc))

    async def flush(self) -> None:
        """Wait until every wake-up requested so far has been sent (or failed); idempotent.

        :meth:`app.db.database.Database.dispose` calls it, so shutdown loses none.
        """
        task = self._task
        if task is not None and not task.done():
            await task
