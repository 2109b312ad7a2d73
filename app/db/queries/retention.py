"""Retention of the tables that grow with use beside a run's own rows (docs/operations.md).

The run tiers (``app.db.queries.maintenance``) remove a run's journal, timeline and
archive row; this module holds the rest: webhook deliveries and their attempts, inbound
(posted) events, finished bulk-action batches and their items, schedule fires and
completed one-off schedules, long-dead workers, expired console sessions, spent rate-limit
buckets and archived run summaries. Each is a :class:`Rule`: a table, its key, and the
condition a row must meet to go, measured on the database clock. Maintenance's audit tier
applies them (``app.engine.maintenance``), batch by batch.

A rule's condition never lets a row go that a live run still needs: a delivery, a fire or
a worker row of a non-terminal run stays, an inbound event stays while a run that could
still wait for it (not terminal, or not yet compacted, so still retryable) or a run that
received it is on record. Like the run tiers, every rule spans every tenant and the
delete re-checks the condition, so a row that became needed between the pick and the
delete stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Table,
    and_,
    delete,
    exists,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.status import TERMINAL_RUN_STATUSES
from app.db.tables import (
    batch_items,
    batches,
    console_sessions,
    event_waits,
    inbound_events,
    rate_limit_buckets,
    runs,
    runs_archive,
    schedule_fires,
    schedules,
    webhook_attempts,
    webhook_deliveries,
    workers,
)

_TERMINAL = sorted(s.value for s in TERMINAL_RUN_STATUSES)

Key = tuple[Any, ...]
"""A row's key: the values of a rule's key columns, in order."""


@dataclass(frozen=True, slots=True)
class Horizon:
    """The two instants a rule measures against (database clock).

    Attributes:
        cutoff: rows older than this go (now minus ``TREADLE_AUDIT_RETENTION_DAYS``).
        now: the start of the maintenance run: expired sessions and spent buckets are
            measured against it, with no window (they carry no state once past it).
    """

    cutoff: datetime
    now: datetime


@dataclass(frozen=True, slots=True)
class Rule:
    """One table's retention rule.

    Attributes:
        name: the table, as the report names it.
        table: the table rows are deleted from.
        key: its primary-key columns, the order rows are walked in.
        eligible: the condition a row must meet to go, given the horizon.
        children: rows deleted with each picked row first, as ``(table, columns)`` where
            the columns equal ``key`` (a delivery's attempts: a handful per delivery,
            bounded by ``TREADLE_WEBHOOK_MAX_ATTEMPTS``).
    """

    name: str
    table: Table
    key: tuple[Column[Any], ...]
    eligible: Callable[[Horizon], ColumnElement[bool]]
    children: tuple[tuple[Table, tuple[Column[Any], ...]], ...] = ()


def _run_live(tenant: Column[Any], run_id: Column[Any]) -> ColumnElement[bool]:
    # The run is on record and not terminal (one primary-key lookup).
    return exists().where(
        runs.c.tenant_id == tenant, runs.c.run_id == run_id, runs.c.status.not_in(_TERMINAL)
    )


def _deliveries(h: Horizon) -> ColumnElement[bool]:
    # Final deliveries only: a pending one is still being sent.
    d = webhook_deliveries.c
    return and_(
        d.state.in_(("delivered", "failed")),
        d.updated_at < h.cutoff,
        ~_run_live(d.tenant_id, d.run_id),
    )


def _inbound_events(h: Horizon) -> ColumnElement[bool]:
    # A wait looks back to its run's creation time (docs/adr/0029-event-triggers.md): an
    # event stays while a run of its tenant created at or before it could still wait for
    # it (not terminal, or terminal but not compacted, hence retryable), and while a wait
    # that received it is on record (its run replays the delivery from this row).
    e = inbound_events.c
    could_wait = exists().where(
        runs.c.tenant_id == e.tenant_id,
        runs.c.created_at <= e.received_at,
        or_(runs.c.status.not_in(_TERMINAL), runs.c.compacted_at.is_(None)),
    )
    received = exists().where(
        event_waits.c.tenant_id == e.tenant_id, event_waits.c.event_id == e.event_id
    )
    return and_(e.received_at < h.cutoff, ~could_wait, ~received)


def _finished_batch(h: Horizon, tenant: Column[Any], batch_id: Column[Any]) -> ColumnElement[bool]:
    return and_(
        batches.c.tenant_id == tenant,
        batches.c.batch_id == batch_id,
        batches.c.state != "running",
        batches.c.updated_at < h.cutoff,
    )


def _batch_items(h: Horizon) -> ColumnElement[bool]:
    # Items go first, a bounded batch at a time: one batch may hold a million of them.
    i = batch_items.c
    return exists().where(_finished_batch(h, i.tenant_id, i.batch_id))


def _batches(h: Horizon) -> ColumnElement[bool]:
    b = batches.c
    no_items = ~exists().where(
        batch_items.c.tenant_id == b.tenant_id, batch_items.c.batch_id == b.batch_id
    )
    return and_(b.state != "running", b.updated_at < h.cutoff, no_items)


def _fires(h: Horizon) -> ColumnElement[bool]:
    # A fire of a live run is what the overlap policy reads (open_run_ids); a buffered
    # tick is still to start.
    f = schedule_fires.c
    return and_(
        f.fired_at < h.cutoff,
        f.outcome != "buffered",
        or_(f.run_id.is_(None), ~_run_live(f.tenant_id, f.run_id)),
    )


def _schedules(h: Horizon) -> ColumnElement[bool]:
    # A one-off schedule that fired (completed), once its fires are gone.
    s = schedules.c
    no_fires = ~exists().where(
        schedule_fires.c.tenant_id == s.tenant_id, schedule_fires.c.schedule_id == s.schedule_id
    )
    return and_(s.state == "completed", s.updated_at < h.cutoff, no_fires)


def _workers(h: Horizon) -> ColumnElement[bool]:
    # Silent for the whole window (stopped, or killed), and leasing no run.
    w = workers.c
    return and_(w.last_heartbeat_at < h.cutoff, ~exists().where(runs.c.lease_owner == w.worker_id))


def _sessions(h: Horizon) -> ColumnElement[bool]:
    # Past the absolute deadline no cookie can use it (app/db/queries/console_sessions.py).
    return console_sessions.c.expires_at < h.now


def _buckets(h: Horizon) -> ColumnElement[bool]:
    # GCRA (app/engine/claims.py ``gcra``): a bucket whose theoretical arrival time has
    # passed admits exactly what a missing bucket admits, so the row carries nothing.
    return rate_limit_buckets.c.tat < h.now


def _archive(h: Horizon) -> ColumnElement[bool]:
    return runs_archive.c.finished_at < h.cutoff


RULES: tuple[Rule, ...] = (
    Rule("runs_archive", runs_archive, (runs_archive.c.tenant_id, runs_archive.c.run_id), _archive),
    Rule(
        "webhook_deliveries",
        webhook_deliveries,
        (webhook_deliveries.c.tenant_id, webhook_deliveries.c.delivery_id),
        _deliveries,
        children=(
            (webhook_attempts, (webhook_attempts.c.tenant_id, webhook_attempts.c.delivery_id)),
        ),
    ),
    Rule(
        "inbound_events",
        inbound_events,
        (inbound_events.c.tenant_id, inbound_events.c.event_id),
        _inbound_events,
    ),
    Rule(
        "batch_items",
        batch_items,
        (batch_items.c.tenant_id, batch_items.c.batch_id, batch_items.c.run_id),
        _batch_items,
    ),
    Rule("batches", batches, (batches.c.tenant_id, batches.c.batch_id), _batches),
    Rule(
        "schedule_fires",
        schedule_fires,
        (schedule_fires.c.tenant_id, schedule_fires.c.schedule_id, schedule_fires.c.tick),
        _fires,
    ),
    Rule("schedules", schedules, (schedules.c.tenant_id, schedules.c.schedule_id), _schedules),
    Rule("workers", workers, (workers.c.worker_id,), _workers),
    Rule("console_sessions", console_sessions, (console_sessions.c.id_hash,), _sessions),
    Rule(
        "rate_limit_buckets",
        rate_limit_buckets,
        (rate_limit_buckets.c.workflow, rate_limit_buckets.c.bucket),
        _buckets,
    ),
)
"""Every rule, in the order the audit tier applies them (children before parents)."""


def report_names() -> list[str]:
    """The table names the rules report under, children included, in order."""
    names: list[str] = []
    for rule in RULES:
        names += [child.name for child, _ in rule.children]
        names.append(rule.name)
    return names


def _keyed(columns: Sequence[Column[Any]], keys: Sequence[Key]) -> ColumnElement[bool]:
    if len(columns) == 1:
        return columns[0].in_([k[0] for k in keys])
    return tuple_(*columns).in_([tuple(k) for k in keys])


async def trim(
    conn: AsyncConnection, rule: Rule, horizon: Horizon, *, after: Key | None, limit: int
) -> tuple[dict[str, int], Key | None, int]:
    """Delete up to ``limit`` rows ``rule`` lets go, walking its key from ``after``.

    On PostgreSQL the rows are picked ``FOR UPDATE SKIP LOCKED``: a row someone is writing
    now is left for the next run. The delete repeats the condition.

    Returns:
        Rows deleted per table (the rule's children first), the last key examined (None
        when nothing was picked) and how many rows were picked (fewer than ``limit``: the
        walk is over).
    """
    stmt = select(*rule.key).where(rule.eligible(horizon)).order_by(*rule.key).limit(limit)
    if after is not None:
        # Typed binds: a UUID or a timestamp compares as the column stores it (SQLite keeps
        # both as text).
        bound = [literal(v, c.type) for c, v in zip(rule.key, after, strict=True)]
        stmt = stmt.where(tuple_(*rule.key) > tuple_(*bound))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(of=rule.table, skip_locked=True)
    picked: list[Key] = [tuple(r) for r in (await conn.execute(stmt)).all()]
    counts: dict[str, int] = {child.name: 0 for child, _ in rule.children}
    counts[rule.name] = 0
    if not picked:
        return counts, None, 0
    chosen = and_(_keyed(rule.key, picked), rule.eligible(horizon))
    for child, columns in rule.children:
        # Before the parent, so the count is exact (its ON DELETE CASCADE would take them
        # silently): the children of exactly the picked rows that still qualify.
        parents = select(*rule.key).where(chosen)
        result = await conn.execute(delete(child).where(tuple_(*columns).in_(parents)))
        counts[child.name] = result.rowcount
    counts[rule.name] = (await conn.execute(delete(rule.table).where(chosen))).rowcount
    return counts, picked[-1], len(picked)
