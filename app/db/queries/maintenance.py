"""Queries of the maintenance tiers: compaction, archival and audit trimming.

Every function works on one batch inside the caller's transaction (the engine's
``app.engine.maintenance`` owns the boundaries: one transaction per batch for a real run,
one rolled-back transaction for a dry run). Each filters on *terminal* status again in the
statement that writes, so a run revived between the pick and the write (retry, requeue) is
never touched. Maintenance spans every tenant on purpose: it is an operator's job on the
whole database, and it returns counts only, never data.

A batch is named by its runs' keys, ``(tenant_id, run_id)`` pairs (:data:`RunKey`), and
every statement on a batch filters on both ``tenant_id IN (the batch's tenants)`` and
``run_id IN (the batch's ids)``. Run ids are globally unique, so the tenant filter
narrows nothing; it names the shards a batch touches on a database distributed by
tenant (docs/adr/0034-tenant-leading-keys.md). The picks themselves (finished runs, old
events and dead letters, a partition's runs) walk every tenant by design.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.status import TERMINAL_RUN_STATUSES
from app.db.dialect import now_expr
from app.db.tables import (
    approval_decisions,
    dead_letters,
    event_waits,
    events,
    run_labels,
    run_logs,
    runs,
    runs_archive,
    signals,
    steps,
)

_TERMINAL = sorted(s.value for s in TERMINAL_RUN_STATUSES)

RunKey = tuple[str, uuid.UUID]
"""A run's key: ``(tenant_id, run_id)``."""


def _of(table: Any, keys: Sequence[RunKey]) -> Any:
    # The batch's tenants and its ids (see the module docstring): exactly the batch's rows.
    return and_(
        table.c.tenant_id.in_(sorted({t for t, _ in keys})),
        table.c.run_id.in_([r for _, r in keys]),
    )


@dataclass(frozen=True, slots=True)
class RunsPosition:
    """Keyset position in the walk over finished runs, oldest first."""

    finished_at: datetime
    run_id: uuid.UUID


def _is_postgresql(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


def _parent_finished() -> Any:
    # A finished child whose parent is still live keeps its output: the parent may not
    # have read it yet (joined children are read when the parent replays).
    parent = runs.alias("parent")
    return or_(
        runs.c.parent_run_id.is_(None),
        ~exists().where(parent.c.run_id == runs.c.parent_run_id, parent.c.status.not_in(_TERMINAL)),
    )


async def pick_finished_runs(
    conn: AsyncConnection,
    *,
    finished_before: datetime,
    after: RunsPosition | None,
    limit: int,
    uncompacted_only: bool,
) -> tuple[list[RunKey], RunsPosition | None]:
    """Pick the next batch of terminal runs finished before ``finished_before``.

    Walks ``ix_runs_finished_at_run_id`` in ``(finished_at, run_id)`` order from ``after``.
    On PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED``: a run an operator is
    retrying right now is skipped (the next maintenance run gets it), and nothing revives
    a picked run before this transaction ends.

    Returns:
        The picked runs' keys and the position after the last one (None when none).
    """
    stmt = select(runs.c.run_id, runs.c.finished_at, runs.c.tenant_id).where(
        runs.c.finished_at.is_not(None),
        runs.c.finished_at < finished_before,
        runs.c.status.in_(_TERMINAL),
        _parent_finished(),
    )
    if uncompacted_only:
        stmt = stmt.where(runs.c.compacted_at.is_(None))
    if after is not None:
        stmt = stmt.where(
            or_(
                runs.c.finished_at > after.finished_at,
                and_(runs.c.finished_at == after.finished_at, runs.c.run_id > after.run_id),
            )
        )
    stmt = stmt.order_by(runs.c.finished_at, runs.c.run_id).limit(limit)
    if _is_postgresql(conn):
        stmt = stmt.with_for_update(of=runs, skip_locked=True)
    rows = (await conn.execute(stmt)).all()
    if not rows:
        return [], None
    return [(r[2], r[0]) for r in rows], RunsPosition(rows[-1][1], rows[-1][0])


async def compact_runs(conn: AsyncConnection, run_keys: Sequence[RunKey]) -> dict[str, int]:
    """Clear the payloads of these (terminal) runs; rows and states stay.

    Cleared: run input (to JSON ``null``) and output, step outputs, event data, signal and
    approval-decision payloads; the run's ``ctx.logger`` lines are deleted (handler code
    fills their messages and fields from payloads). Kept: statuses, reasons, errors (an
    operator needs the why), timings and ids. ``runs.compacted_at`` records when.

    Returns:
        Rows changed per table.
    """
    keys = list(run_keys)
    compacted = await conn.execute(
        update(runs)
        .where(
            _of(runs, keys),
            runs.c.status.in_(_TERMINAL),
            runs.c.compacted_at.is_(None),
        )
        .values(input="null", output=None, compacted_at=now_expr(conn.dialect.name))
        .returning(runs.c.tenant_id, runs.c.run_id)
    )
    done: list[RunKey] = [(r[0], r[1]) for r in compacted.all()]
    if not done:
        return {
            "runs": 0,
            "steps": 0,
            "events": 0,
            "signals": 0,
            "approval_decisions": 0,
            "run_logs": 0,
        }
    counts = {"runs": len(done)}
    for name, table, column in (
        ("steps", steps, steps.c.output),
        ("events", events, events.c.data),
        ("signals", signals, signals.c.payload),
        ("approval_decisions", approval_decisions, approval_decisions.c.payload),
    ):
        result = await conn.execute(
            update(table).where(_of(table, done), column.is_not(None)).values({column.name: None})
        )
        counts[name] = result.rowcount
    logs = await conn.execute(delete(run_logs).where(_of(run_logs, done)))
    counts["run_logs"] = logs.rowcount
    return counts


async def archive_runs(conn: AsyncConnection, run_keys: Sequence[RunKey]) -> dict[str, int]:
    """Move these (terminal) runs to ``runs_archive``; drop everything hanging off them.

    Dropped: steps, events, signals, approval decisions, dead letters, ``ctx.logger``
    lines (``run_logs``), labels (``run_labels``) and event waits (``event_waits``) of
    the runs.
    Deletes are explicit rather than left to ``ON DELETE CASCADE`` so the counts are exact.

    Returns:
        Rows moved or deleted per table (``runs`` = runs archived).
    """
    keys = list(run_keys)
    columns = [c.name for c in runs_archive.c if c.name != "archived_at"]
    source = select(
        *(runs.c[name] for name in columns), now_expr(conn.dialect.name).label("archived_at")
    ).where(_of(runs, keys), runs.c.status.in_(_TERMINAL))
    await conn.execute(insert(runs_archive).from_select([*columns, "archived_at"], source))
    # Driven from runs (its key is run_id) into the archive's (tenant_id, run_id) key: the
    # archive is looked up with its tenant, as its tenant-leading key needs (revision 0026).
    moved = (
        await conn.execute(
            select(runs.c.tenant_id, runs.c.run_id)
            .join(
                runs_archive,
                and_(
                    runs_archive.c.tenant_id == runs.c.tenant_id,
                    runs_archive.c.run_id == runs.c.run_id,
                ),
            )
            .where(_of(runs, keys))
        )
    ).all()
    done: list[RunKey] = [(r[0], r[1]) for r in moved]
    counts: dict[str, int] = {"runs": 0}  # filled last; first in the report
    for name, table in (
        ("steps", steps),
        ("events", events),
        ("signals", signals),
        ("approval_decisions", approval_decisions),
        ("dead_letters", dead_letters),
        ("run_logs", run_logs),
        ("run_labels", run_labels),
        ("event_waits", event_waits),
    ):
        result = await conn.execute(delete(table).where(_of(table, done)))
        counts[name] = result.rowcount
    counts["runs"] = (await conn.execute(delete(runs).where(_of(runs, done)))).rowcount
    return counts


async def trim_events(
    conn: AsyncConnection, *, before: datetime, after_event_id: int | None, limit: int
) -> tuple[int, int | None]:
    """Delete up to ``limit`` events older than ``before`` that belong to terminal runs.

    Walks events in ``event_id`` order from ``after_event_id`` (ids grow with time, so the
    old ones come first). Live runs, and finished children of live parents, keep their
    whole timeline.

    Returns:
        Rows deleted and the last event id examined (None when the walk is over).
    """
    stmt = (
        select(events.c.tenant_id, events.c.event_id)
        .join(runs, and_(runs.c.tenant_id == events.c.tenant_id, runs.c.run_id == events.c.run_id))
        .where(events.c.at < before, runs.c.status.in_(_TERMINAL), _parent_finished())
        .order_by(events.c.event_id)
        .limit(limit)
    )
    if after_event_id is not None:
        stmt = stmt.where(events.c.event_id > after_event_id)
    if _is_postgresql(conn):
        stmt = stmt.with_for_update(of=events, skip_locked=True)
    picked = (await conn.execute(stmt)).all()
    if not picked:
        return 0, None
    ids = [int(r[1]) for r in picked]
    # Keyed like a batch of runs (the module docstring): the picked rows' tenants and ids.
    keyed = and_(events.c.tenant_id.in_(sorted({r[0] for r in picked})), events.c.event_id.in_(ids))
    deleted = (await conn.execute(delete(events).where(keyed))).rowcount
    return deleted, ids[-1]


async def trim_dead_letters(
    conn: AsyncConnection, *, before: datetime, after_id: uuid.UUID | None, limit: int
) -> tuple[int, uuid.UUID | None]:
    """Delete up to ``limit`` dead letters older than ``before`` whose run is terminal.

    A dead letter of a run that was requeued and is live again is kept until the run ends.

    Returns:
        Rows deleted and the last dead-letter id examined (None when the walk is over).
    """
    stmt = (
        select(dead_letters.c.tenant_id, dead_letters.c.dead_letter_id)
        .join(
            runs,
            and_(
                runs.c.tenant_id == dead_letters.c.tenant_id,
                runs.c.run_id == dead_letters.c.run_id,
            ),
        )
        .where(dead_letters.c.created_at < before, runs.c.status.in_(_TERMINAL), _parent_finished())
        .order_by(dead_letters.c.dead_letter_id)
        .limit(limit)
    )
    if after_id is not None:
        stmt = stmt.where(dead_letters.c.dead_letter_id > after_id)
    if _is_postgresql(conn):
        stmt = stmt.with_for_update(of=dead_letters, skip_locked=True)
    picked = (await conn.execute(stmt)).all()
    if not picked:
        return 0, None
    ids = [r[1] for r in picked]
    keyed = and_(
        dead_letters.c.tenant_id.in_(sorted({r[0] for r in picked})),
        dead_letters.c.dead_letter_id.in_(ids),
    )
    result = await conn.execute(delete(dead_letters).where(keyed))
    return result.rowcount, ids[-1]


def _in_range(lower: uuid.UUID, upper: uuid.UUID) -> Any:
    return and_(runs.c.run_id >= lower, runs.c.run_id < upper)


async def lock_runs_in_range(
    conn: AsyncConnection, lower: uuid.UUID, upper: uuid.UUID
) -> list[RunKey] | None:
    """Lock every run whose id is in ``[lower, upper)`` (one time partition's runs).

    ``FOR UPDATE SKIP LOCKED``, compared with a count: a run another transaction holds
    (a retry, a requeue) makes the whole range wait for the next maintenance run, so
    nothing can revive a run of a partition while it is being dropped.

    Returns:
        Their keys (in run id order), or None when some run of the range is locked
        elsewhere.
    """
    total = (
        await conn.execute(select(func.count()).select_from(runs).where(_in_range(lower, upper)))
    ).scalar_one()
    locked = await conn.execute(
        select(runs.c.tenant_id, runs.c.run_id)
        .where(_in_range(lower, upper))
        .order_by(runs.c.run_id)
        .with_for_update(skip_locked=True)
    )
    keys: list[RunKey] = [(r[0], r[1]) for r in locked.all()]
    return keys if len(keys) == total else None


async def range_archivable(
    conn: AsyncConnection, lower: uuid.UUID, upper: uuid.UUID, *, finished_before: datetime
) -> bool:
    """Whether every run of ``[lower, upper)`` is one archival would pick (none: True).

    The rule of :func:`pick_finished_runs`: terminal, finished before ``finished_before``,
    and not the child of a live parent.
    """
    eligible = and_(
        runs.c.finished_at.is_not(None),
        runs.c.finished_at < finished_before,
        runs.c.status.in_(_TERMINAL),
        _parent_finished(),
    )
    blocker = select(runs.c.run_id).where(_in_range(lower, upper), ~eligible).limit(1)
    return (await conn.execute(blocker)).first() is None


async def range_trimmable(conn: AsyncConnection, lower: uuid.UUID, upper: uuid.UUID) -> bool:
    """Whether every run of ``[lower, upper)`` is one whose old events audit may delete.

    The rule of :func:`trim_events`: terminal, and not the child of a live parent (the
    events' own age is the caller's check).
    """
    eligible = and_(runs.c.status.in_(_TERMINAL), _parent_finished())
    blocker = select(runs.c.run_id).where(_in_range(lower, upper), ~eligible).limit(1)
    return (await conn.execute(blocker)).first() is None
