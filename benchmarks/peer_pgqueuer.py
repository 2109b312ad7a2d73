"""The pgqueuer side of the bare-queue floor (runs in the peer's own venv).

``benchmarks/.peer-venv`` holds ``pgqueuer`` at the version pinned in
``benchmarks/peer.py`` beside DBOS; this module is executed there as a subprocess, never
imported by Treadle. A job is a no-op: the floor is what a PostgreSQL job queue alone
(claim with ``FOR UPDATE SKIP LOCKED``, LISTEN/NOTIFY wake-ups, a completion write per
job) costs on the same server, with no durable workflow state at all.

Usage (driven by :mod:`benchmarks.peer`)::

    python benchmarks/peer_pgqueuer.py install URL          # pgqueuer's own tables
    python benchmarks/peer_pgqueuer.py enqueue URL N        # N jobs, before timing
    python benchmarks/peer_pgqueuer.py worker URL CONC POLL  # consume until SIGTERM

``install`` runs ``Queries.install()``, the statement ``pgq install`` runs. A worker is
one ``QueueManager`` on one asyncpg connection (pgqueuer's documented consumer) with at
most ``CONC`` jobs in flight (``max_concurrent_tasks``, = Treadle's per-worker
concurrency; pgqueuer requires a batch size of at most half of it) and ``POLL`` seconds
as its dequeue timeout (= Treadle's poll interval; NOTIFY wakes it sooner). Log
aggregation is off so the parent can read first pick and last completion from
``pgqueuer_log``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager  # type: ignore[import-not-found,unused-ignore]

ENTRYPOINT = "bench_noop"
# Jobs per INSERT while enqueueing (pgqueuer's list form of ``enqueue``).
CHUNK = 1000


async def install(url: str) -> None:
    """Create pgqueuer's tables, types, triggers and functions in the database."""
    conn = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(url: str, n: int) -> None:
    """Insert ``n`` jobs for the no-op entrypoint, ``CHUNK`` per statement."""
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, n, CHUNK):
            size = min(CHUNK, n - start)
            await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
    finally:
        await conn.close()


async def worker(url: str, concurrency: int, poll: float) -> None:
    """Consume jobs with a no-op handler until SIGTERM."""
    conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)  # type: ignore[untyped-decorator,unused-ignore]
    async def noop(job: Job) -> None:
        """A job that returns at once."""

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    try:
        await qm.run(
            dequeue_timeout=timedelta(seconds=poll),
            batch_size=max(1, concurrency // 2),
            max_concurrent_tasks=concurrency,
            log_aggregation_interval=timedelta(0),
        )
    finally:
        await conn.close()


def main() -> None:
    """Dispatch on the first argument (``install``, ``enqueue`` or ``worker``)."""
    mode, url, *rest = sys.argv[1:]
    if mode == "install":
        asyncio.run(install(url))
    elif mode == "enqueue":
        asyncio.run(enqueue(url, int(rest[0])))
    elif mode == "worker":
        asyncio.run(worker(url, int(rest[0]), float(rest[1])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
