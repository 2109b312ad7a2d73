"""The SQLite connection class every aiosqlite engine opens (``sqlite3.connect(factory=)``).

Why it exists: on Python 3.11 ``sqlite3.Connection.close()`` calls ``sqlite3_close_v2``
without finalizing the statements cursors still hold. A connection closed with a
transaction open and such a cursor alive becomes a "zombie" that keeps its locks, the
write lock included, until the cursor is garbage-collected. SQLAlchemy closes a
connection exactly that way when a task is cancelled mid-statement (it invalidates and
terminates the connection, and the cancelled frames keep the cursor alive in a reference
cycle): every other writer of the database then waited out its busy timeout, or until a
garbage collection happened to run (found by CI: a worker stopping while its heartbeat
was being cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time


class RollbackOnCloseConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` that rolls back any open transaction before it closes.

    ``close()`` runs on aiosqlite's thread for the connection (both its graceful close and
    its forced stop), so the rollback is ordered after any statement still executing
    there. ``rollback()`` does nothing outside a transaction; since SQLite 3.7.11 it also
    aborts pending statements instead of failing, so the close that follows holds no lock
    even if a cursor outlives it.
    """

    def close(self) -> None:
        """Roll back, then close; a rollback error (I/O, closed) does not stop the close."""
        with contextlib.suppress(sqlite3.Error):
            self.rollback()
        super().close()


# aiosqlite names each connection's worker thread after its target (Python's default
# thread name: "Thread-N (_connection_worker_thread)").
_WORKER_THREAD_SUFFIX = "(_connection_worker_thread)"


async def settle_worker_threads(timeout_seconds: float = 2.0) -> None:
    """Wait, up to ``timeout_seconds`` in all, for aiosqlite threads still winding down.

    A connection that failed to open (a directory for a file name, a read-only path)
    is stopped by aiosqlite without anyone awaiting the stop: if the event loop closes
    before the thread gets to it, the thread's ``call_soon_threadsafe`` on the closed
    loop prints a ``RuntimeError: Event loop is closed`` traceback at exit (aiosqlite
    issue 241, open). A short-lived process (a CLI command) awaits this after disposing
    its engines, before its loop closes, so a refused SQLite path stays one line.
    Threads of connections still open are waited for up to the timeout, never stopped.
    """
    threads = [
        t
        for t in threading.enumerate()
        if t.name.endswith(_WORKER_THREAD_SUFFIX) and t is not threading.current_thread()
    ]
    if not threads:
        return

    def join() -> None:
        deadline = time.monotonic() + timeout_seconds
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    await asyncio.to_thread(join)
