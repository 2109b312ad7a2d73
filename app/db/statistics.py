"""Planner statistics that keep up with a young, fast-growing database (PostgreSQL).

PostgreSQL keeps the generic plan of a prepared statement, and of every foreign-key
check (``ri_triggers.c`` prepares one per constraint and connection), until the
statistics of a table it reads change. A plan made while ``runs`` had a few dozen rows
reads it by a sequential scan, and keeps doing so when the table holds a hundred
thousand: a 1,000-row ``events`` INSERT, whose every row checks its run, went from 61 ms
to 4.6 s on one connection as ``runs`` grew (docs/benchmarks.md, "POST /runs:batch").
Autovacuum analyzes a table once 10 % of it changed, but looks only once a minute
(``autovacuum_naptime``), so a database filled from empty in that minute (a first
import, a batch submit, a benchmark) runs on the plans of its first seconds.

:class:`StatisticsKeeper` closes that gap: every ``TREADLE_ANALYZE_INTERVAL_SECONDS``
one process (an advisory lock elects it) analyzes the Treadle tables, partitions
included, that changed by more rows since their last ``ANALYZE`` than they held then
(at least :data:`ANALYZE_MIN_ROWS`). The new statistics invalidate every connection's
cached plans of that table. At steady state autovacuum's 10 % comes first, so the
keeper adds no ANALYZE there (docs/adr/0043-statistics-of-a-young-database.md).

SQLite has no cached generic plans and no statistics until ``ANALYZE`` is run by hand;
everything here is a no-op on it.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import String

from app.db.database import Database
from app.db.tables import metadata

ANALYZE_MIN_ROWS = 1_000
"""Changed rows below which a table is never analyzed by the keeper.

A table this small reads as fast by a sequential scan as through an index, so a plan
made for it cannot be much worse than a fresh one; autovacuum keeps such tables.
"""

STATISTICS_LOCK_KEY = 0x7472656164737461  # "treadsta"; any constant shared by every process
"""Advisory lock key electing the one process that analyzes at a time."""

TABLES: tuple[str, ...] = tuple(t.name for t in metadata.sorted_tables)
"""The tables the keeper looks after (``app/db/tables.py``); their partitions too."""

_STALE = text(
    """
    SELECT c.relname
    FROM pg_stat_user_tables s
    JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema()
      AND (c.relname = ANY(:tables) OR EXISTS (
            SELECT 1 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
            WHERE i.inhrelid = c.oid AND p.relname = ANY(:tables)))
      -- ANALYZE of a table another role owns only warns and does nothing.
      AND pg_has_role(c.relowner, 'USAGE')
      AND s.n_mod_since_analyze >= greatest(:min_rows, c.reltuples)
    ORDER BY s.n_mod_since_analyze DESC, c.relname
    """
).bindparams(bindparam("tables", type_=ARRAY(String)))

_LOCK = text("SELECT pg_try_advisory_xact_lock(:k)")

log = structlog.get_logger("treadle.statistics")


async def stale_tables(conn: AsyncConnection, *, min_rows: int = ANALYZE_MIN_ROWS) -> list[str]:
    """The Treadle tables (and partitions) whose statistics lag their contents.

    A table is stale when the rows inserted, updated or deleted since its last
    ``ANALYZE`` (manual or autovacuum's; ``pg_stat_user_tables.n_mod_since_analyze``) are
    at least ``max(min_rows, reltuples)``: it changed by as much as it held at that
    ANALYZE, or was never analyzed and holds ``min_rows`` changes. Tables the current
    role cannot analyze (another owner) are left out. Most changed first.

    PostgreSQL only. The counters lag commits by up to a second (``PGSTAT_MIN_INTERVAL``).
    """
    rows = await conn.execute(_STALE, {"tables": list(TABLES), "min_rows": min_rows})
    return [r[0] for r in rows]


async def refresh_statistics(db: Database, *, min_rows: int = ANALYZE_MIN_ROWS) -> list[str] | None:
    """Analyze every stale table (:func:`stale_tables`) once, in one transaction.

    Runs under a transaction-scoped advisory lock (:data:`STATISTICS_LOCK_KEY`) taken
    without waiting, so processes checking at the same moment do not analyze the same
    tables one after the other; ``ANALYZE (SKIP_LOCKED)`` skips a table autovacuum is
    analyzing right now. ANALYZE reads a sample (300 x ``default_statistics_target``
    rows), not the table, and its lock blocks no reads or writes.

    Returns:
        The tables analyzed, most changed first (``[]`` when none was stale); None when
        another process held the lock (it is analyzing), and on SQLite.

    Raises:
        Whatever the database raises (a fault during failover): the caller retries.
    """
    if db.dialect != "postgresql":
        return None
    async with db.write() as conn:
        if not (await conn.execute(_LOCK, {"k": STATISTICS_LOCK_KEY})).scalar_one():
            return None
        stale = await stale_tables(conn, min_rows=min_rows)
        for name in stale:
            # Names come from pg_class and are quoted; no value is interpolated.
            quoted = conn.dialect.identifier_preparer.quote(name)
            await conn.execute(text(f"ANALYZE (SKIP_LOCKED) {quoted}"))
    return stale


class StatisticsKeeper:
    """Calls :func:`refresh_statistics` every ``interval_seconds`` until stopped.

    Args:
        db: the database (PostgreSQL; on SQLite :meth:`run` returns at once).
        interval_seconds: ``TREADLE_ANALYZE_INTERVAL_SECONDS``; 0 turns the keeper off.

    Attributes:
        analyzed: how many ANALYZE statements this keeper ran (tests, benchmarks).
    """

    def __init__(self, db: Database, interval_seconds: float) -> None:
        self._db = db
        self._interval = interval_seconds
        self.analyzed = 0

    async def run(self, stopping: asyncio.Event) -> None:
        """Check, then wait the interval (or until ``stopping``), until ``stopping`` is set.

        Never raises: a failed check (the database is down, a statement timed out) is
        logged and tried again at the next interval.
        """
        if self._interval <= 0 or self._db.dialect != "postgresql":
            return
        while not stopping.is_set():
            try:
                done = await refresh_statistics(self._db)
            except Exception as exc:  # noqa: BLE001 - DB down or slow: try again next time
                log.warning("statistics check failed", error=str(exc)[:300])
            else:
                if done:
                    self.analyzed += len(done)
                    log.info("analyzed tables whose statistics lagged", tables=done)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._interval)
