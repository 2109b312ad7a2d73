"""Maintenance tiers: compaction, archival and audit trimming (docs/operations.md).

Audit trimming also applies the retention rule of every other table that grows with use
(``app.db.queries.retention``: archived summaries, webhook deliveries, inbound events,
batches, schedule fires, workers, sessions, rate-limit buckets), by the audit window.

The engine itself never deletes; these tiers are the only code that does, run by an
operator (``treadle maintenance run`` or ``POST /admin/maintenance``) or a cron job. Each
tier has a retention window in settings (``TREADLE_COMPACTION_AFTER_DAYS``,
``TREADLE_ARCHIVAL_AFTER_DAYS``, ``TREADLE_AUDIT_RETENTION_DAYS``, validated against each
other) measured on the database clock, touches only *finished* runs of every tenant, and
works in batches of ``TREADLE_MAINTENANCE_BATCH_SIZE`` so no transaction holds locks on
the hot tables for long.

A dry run does exactly the same work inside one transaction that is rolled back, so it
reports precisely what a real run would touch (tiers see each other's effects, as they do
for real) and changes nothing.

On PostgreSQL, where ``steps``, ``events`` and ``runs_archive`` are partitioned by run
creation time (docs/adr/0036-time-partitions.md), a real run also creates the partitions
ahead (``TREADLE_PARTITION_DAYS`` wide, ``TREADLE_PARTITIONS_AHEAD_DAYS`` ahead), and
archival and audit first drop whole partitions whose every run qualifies, each in its own
transaction (audit also drops ``runs_archive`` partitions whose every summary is past
the window); rows left over (partitions with a live run, SQLite, a dry run) are deleted
batch by batch as before. A dry run never takes the partition locks: it counts the rows
the batches would delete, which are the same rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.faults import DbFault, classify
from app.db.partitions import PARTITIONED_TABLES
from app.db.queries import maintenance as q
from app.db.queries import partitions as qp
from app.db.queries import retention as qr

log = structlog.get_logger("treadle.maintenance")


class Tier(StrEnum):
    """A maintenance tier, in the order a full run applies them."""

    COMPACTION = "compaction"
    ARCHIVAL = "archival"
    AUDIT = "audit"


ALL_TIERS: tuple[Tier, ...] = (Tier.COMPACTION, Tier.ARCHIVAL, Tier.AUDIT)


@dataclass(slots=True)
class TierReport:
    """What one tier touched (or, in a dry run, would touch).

    Attributes:
        tier: the tier.
        window_days: its retention window (days, from settings).
        cutoff: rows older than this database-clock instant were eligible.
        batches: transactions used (a dry run counts the batches a real run would use).
        touched: rows changed (compaction) or deleted/moved (archival, audit) per table.
    """

    tier: Tier
    window_days: float
    cutoff: datetime
    batches: int = 0
    touched: dict[str, int] = field(default_factory=dict)

    def add(self, counts: dict[str, int]) -> None:
        """Add one batch's counts."""
        self.batches += 1
        for table, n in counts.items():
            self.touched[table] = self.touched.get(table, 0) + n


@dataclass(slots=True)
class MaintenanceReport:
    """Result of one maintenance run.

    Attributes:
        dry_run: True when everything was rolled back.
        started_at: database clock at the start (cutoffs are computed from it).
        duration_seconds: wall time taken.
        tiers: one report per tier run, in the order applied.
        partitions_created: time partitions created ahead (PostgreSQL, real runs only).
    """

    dry_run: bool
    started_at: datetime
    duration_seconds: float = 0.0
    tiers: list[TierReport] = field(default_factory=list)
    partitions_created: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the API and ``--format json`` share it)."""
        return {
            "dry_run": self.dry_run,
            "started_at": self.started_at.isoformat(),
            "duration_seconds": round(self.duration_seconds, 3),
            "partitions_created": list(self.partitions_created),
            "tiers": [
                {
                    "tier": t.tier.value,
                    "window_days": t.window_days,
                    "cutoff": t.cutoff.isoformat(),
                    "batches": t.batches,
                    "touched": dict(t.touched),
                }
                for t in self.tiers
            ],
        }


def _window(settings: Settings, tier: Tier) -> float:
    if tier is Tier.COMPACTION:
        return settings.compaction_after_days
    if tier is Tier.ARCHIVAL:
        return settings.archival_after_days
    return settings.audit_retention_days


Unit = Callable[[], contextlib.AbstractAsyncContextManager[AsyncConnection]]


async def run_maintenance(
    db: Database,
    settings: Settings,
    *,
    tiers: Sequence[Tier] = ALL_TIERS,
    dry_run: bool = False,
) -> MaintenanceReport:
    """Run the chosen tiers (always in compaction → archival → audit order).

    Args:
        db: the database.
        settings: retention windows and batch size.
        tiers: which tiers to run; duplicates are ignored.
        dry_run: do the work in one transaction and roll it back; report the counts.

    Returns:
        What each tier touched (or would touch).
    """
    chosen = [t for t in ALL_TIERS if t in set(tiers)]
    started = time.perf_counter()
    if dry_run:
        async with db.engine.connect() as conn:
            transaction = await conn.begin()
            try:

                @contextlib.asynccontextmanager
                async def same() -> AsyncIterator[AsyncConnection]:
                    yield conn

                report = await _run(conn, settings, chosen, same, dry_run=True)
            finally:
                await transaction.rollback()
    else:
        async with db.read() as conn:
            now = await fetch_now(conn, db.dialect)
        report = await _run_at(now, settings, chosen, db.write, dry_run=False)
    report.duration_seconds = time.perf_counter() - started
    log.info("maintenance finished", **report.as_dict())
    return report


async def _run(
    conn: AsyncConnection,
    settings: Settings,
    tiers: list[Tier],
    unit: Unit,
    *,
    dry_run: bool,
) -> MaintenanceReport:
    now = await fetch_now(conn, conn.dialect.name)
    return await _run_at(now, settings, tiers, unit, dry_run=dry_run)


async def _run_at(
    now: datetime, settings: Settings, tiers: list[Tier], unit: Unit, *, dry_run: bool
) -> MaintenanceReport:
    report = MaintenanceReport(dry_run=dry_run, started_at=now)
    size = settings.maintenance_batch_size
    if not dry_run:
        report.partitions_created = await create_partitions_ahead(unit, settings, now)
    for tier in tiers:
        window = _window(settings, tier)
        tr = TierReport(tier=tier, window_days=window, cutoff=now - timedelta(days=window))
        if tier is Tier.AUDIT:
            if not dry_run:
                await _drop_trimmed_event_partitions(tr, unit)
            await _audit(tr, unit, size)
            if not dry_run:
                await _drop_expired_archive_partitions(tr, unit)
            await _records(tr, unit, size, qr.Horizon(cutoff=tr.cutoff, now=now))
        else:
            if tier is Tier.ARCHIVAL and not dry_run:
                await _drop_archived_partitions(tr, unit, size)
            action = q.compact_runs if tier is Tier.COMPACTION else q.archive_runs
            await _walk_runs(tr, unit, size, action, uncompacted_only=tier is Tier.COMPACTION)
        report.tiers.append(tr)
    return report


async def _walk_runs(
    tr: TierReport,
    unit: Unit,
    size: int,
    action: Callable[[AsyncConnection, Sequence[Any]], Awaitable[dict[str, int]]],
    *,
    uncompacted_only: bool,
) -> None:
    after: q.RunsPosition | None = None
    while True:
        async with unit() as conn:
            ids, position = await q.pick_finished_runs(
                conn,
                finished_before=tr.cutoff,
                after=after,
                limit=size,
                uncompacted_only=uncompacted_only,
            )
            if not ids:
                return
            tr.add(await action(conn, ids))
        if len(ids) < size:
            return
        after = position


async def create_partitions_ahead(unit: Unit, settings: Settings, now: datetime) -> list[str]:
    """Create the time partitions runs created up to ``TREADLE_PARTITIONS_AHEAD_DAYS`` need.

    One transaction per table; nothing on SQLite or an unpartitioned table. A table whose
    lock is not granted in time (``app.db.queries.partitions.DDL_LOCK_TIMEOUT``) is left
    for the next run (logged): its runs land in the default partition meanwhile.

    Args:
        unit: opens one transaction.
        settings: ``partition_days`` (width) and ``partitions_ahead_days``.
        now: the database clock.

    Returns:
        The names of the partitions created.
    """
    until = now + timedelta(days=settings.partitions_ahead_days)
    width = timedelta(days=settings.partition_days)
    created: list[str] = []
    for table in PARTITIONED_TABLES:
        try:
            async with unit() as conn:
                if await qp.is_partitioned(conn, table):
                    created += await qp.create_ahead(conn, table, now=now, until=until, width=width)
        except DBAPIError as exc:
            if classify(exc) is not DbFault.LOCK_TIMEOUT:
                raise
            log.warning("partition creation skipped: lock not granted", table=table)
    return created


async def _partitions(unit: Unit, table: str) -> list[qp.Partition]:
    async with unit() as conn:
        if not await qp.is_partitioned(conn, table):
            return []
        return [p for p in await qp.list_partitions(conn, table) if not p.is_default]


async def _still_there(conn: AsyncConnection, part: qp.Partition) -> bool:
    # Under the partition lock: another maintenance run may have dropped it meanwhile.
    await qp.serialize(conn)
    return part in await qp.list_partitions(conn, part.table)


def _count(counts: dict[str, int], more: dict[str, int]) -> None:
    for table, n in more.items():
        counts[table] = counts.get(table, 0) + n


async def _drop_archived_partitions(tr: TierReport, unit: Unit, size: int) -> None:
    # A range of run ids ending before the cutoff whose every run archival would pick: its
    # steps and events partitions are dropped (no row-by-row delete), then its runs are
    # archived in batches, all in one transaction holding every run of the range locked.
    for part in await _partitions(unit, "steps"):
        assert part.lower is not None and part.upper is not None and part.ends is not None
        if part.ends > tr.cutoff:
            break
        try:
            async with unit() as conn:
                if not await _still_there(conn, part):
                    continue
                ids = await q.lock_runs_in_range(conn, part.lower, part.upper)
                if ids is None or not await q.range_archivable(
                    conn, part.lower, part.upper, finished_before=tr.cutoff
                ):
                    continue
                counts: dict[str, int] = {"runs": 0, "partitions": 0}
                twin = [
                    p
                    for p in await qp.list_partitions(conn, "events")
                    if (p.lower, p.upper) == (part.lower, part.upper)
                ]
                for dropped in [part, *twin]:
                    counts[dropped.table] = await qp.row_count(conn, dropped)
                    await qp.drop_partition(conn, dropped)
                    counts["partitions"] += 1
                for i in range(0, len(ids), size):
                    _count(counts, await q.archive_runs(conn, ids[i : i + size]))
            tr.add(counts)
        except DBAPIError as exc:
            if classify(exc) is not DbFault.LOCK_TIMEOUT:
                raise
            log.warning("partition drop skipped: lock not granted", partition=part.name)


async def _drop_trimmed_event_partitions(tr: TierReport, unit: Unit) -> None:
    # An events partition ending before the cutoff whose every event is older than it and
    # whose every run is terminal (and no live parent's child): dropped whole.
    for part in await _partitions(unit, "events"):
        assert part.lower is not None and part.upper is not None and part.ends is not None
        if part.ends > tr.cutoff:
            break
        try:
            async with unit() as conn:
                if not await _still_there(conn, part):
                    continue
                ids = await q.lock_runs_in_range(conn, part.lower, part.upper)
                if ids is None or not await q.range_trimmable(conn, part.lower, part.upper):
                    continue
                newest = await qp.newest_at(conn, part)
                if newest is not None and newest >= tr.cutoff:
                    continue
                rows = await qp.row_count(conn, part)
                await qp.drop_partition(conn, part)
            tr.add({"events": rows, "partitions": 1})
        except DBAPIError as exc:
            if classify(exc) is not DbFault.LOCK_TIMEOUT:
                raise
            log.warning("partition drop skipped: lock not granted", partition=part.name)


async def _audit(tr: TierReport, unit: Unit, size: int) -> None:
    tr.touched = {"events": tr.touched.get("events", 0), "dead_letters": 0, **tr.touched}
    last_event: int | None = None
    while True:
        async with unit() as conn:
            deleted, last_event = await q.trim_events(
                conn, before=tr.cutoff, after_event_id=last_event, limit=size
            )
            if last_event is not None:
                tr.add({"events": deleted})
        if last_event is None:
            break
    last_dl = None
    while True:
        async with unit() as conn:
            deleted, last_dl = await q.trim_dead_letters(
                conn, before=tr.cutoff, after_id=last_dl, limit=size
            )
            if last_dl is not None:
                tr.add({"dead_letters": deleted})
        if last_dl is None:
            break


async def _drop_expired_archive_partitions(tr: TierReport, unit: Unit) -> None:
    # A runs_archive partition ending before the cutoff whose every summary finished
    # before it, and whose range has no run left in runs (none can be archived into it
    # later: run ids of a past range are never minted again): dropped whole.
    for part in await _partitions(unit, "runs_archive"):
        assert part.lower is not None and part.upper is not None and part.ends is not None
        if part.ends > tr.cutoff:
            break
        try:
            async with unit() as conn:
                if not await _still_there(conn, part):
                    continue
                if await q.lock_runs_in_range(conn, part.lower, part.upper) != []:
                    continue
                newest = await qp.newest_at(conn, part, column="finished_at")
                if newest is not None and newest >= tr.cutoff:
                    continue
                rows = await qp.row_count(conn, part)
                await qp.drop_partition(conn, part)
            tr.add({"runs_archive": rows, "partitions": 1})
        except DBAPIError as exc:
            if classify(exc) is not DbFault.LOCK_TIMEOUT:
                raise
            log.warning("partition drop skipped: lock not granted", partition=part.name)


async def _records(tr: TierReport, unit: Unit, size: int, horizon: qr.Horizon) -> None:
    # Every other table that grows with use, one rule each (app/db/queries/retention.py),
    # walked by key in batches of ``size`` rows, one transaction per batch.
    for name in qr.report_names():
        tr.touched.setdefault(name, 0)
    for rule in qr.RULES:
        after: qr.Key | None = None
        while True:
            async with unit() as conn:
                counts, after, picked = await qr.trim(conn, rule, horizon, after=after, limit=size)
                if picked:
                    tr.add(counts)
            if picked < size:
                break


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One time partition, for ``treadle maintenance partitions``.

    Attributes:
        table: the partitioned table.
        name: the partition.
        starts: first run creation time it holds (None: the default partition).
        ends: run creation time it stops before (None: the default partition).
    """

    table: str
    name: str
    starts: datetime | None
    ends: datetime | None


async def ensure_partitions(
    db: Database, settings: Settings
) -> tuple[list[str], list[PartitionInfo]]:
    """Create the partitions missing ahead, then list every time partition.

    What a real maintenance run does first (:func:`create_partitions_ahead`), on its own.
    Both lists are empty on SQLite or before revision 0023.

    Returns:
        The partitions created, and every partition of each table (ranges in order, the
        default partition last).
    """
    async with db.read() as conn:
        now = await fetch_now(conn, db.dialect)
    created = await create_partitions_ahead(db.write, settings, now)
    listed: list[PartitionInfo] = []
    async with db.read() as conn:
        for table in PARTITIONED_TABLES:
            if await qp.is_partitioned(conn, table):
                listed += [
                    PartitionInfo(table, p.name, p.starts, p.ends)
                    for p in await qp.list_partitions(conn, table)
                ]
    return created, listed
