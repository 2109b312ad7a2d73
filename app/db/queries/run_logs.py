"""Queries on ``run_logs``: the lines handler code logged with ``ctx.logger``.

Appends happen inside the executor's fenced write transactions only (after
:func:`app.db.queries.runs.check_fence`, which locks the run row on PostgreSQL and holds
SQLite's write lock), so one writer at a time computes a run's next ``seq``: no race,
and a worker that lost its lease appends nothing. See docs/adr/0027-run-logs.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import LogLevel
from app.db.dialect import now_expr
from app.db.tables import run_logs

DROPPED_SEQ = 2**31 - 1
"""``seq`` of a run's "N lines dropped" summary: after every kept line, whatever the cap."""

DROPPED_ORIGIN = "dropped"


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line waiting to be appended.

    Attributes:
        origin: where it was logged, stable across replays (see ``run_logs`` in tables.py).
        at: the database clock when it was logged (estimated by the worker).
        level: its severity.
        message: the (already bounded) message.
        fields: the (already bounded) fields as JSON object text, or None.
        step_id: the step whose attempt logged it, None for workflow code.
        attempt: that attempt's number (1-based), None for workflow code.
    """

    origin: str
    at: datetime
    level: LogLevel
    message: str
    fields: str | None
    step_id: str | None
    attempt: int | None


async def append(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    lines: Sequence[LogLine],
    max_lines: int,
    also_dropped: int = 0,
) -> int:
    """Append ``lines`` to a run's log, at most ``max_lines`` kept; returns lines dropped.

    Call inside a fenced write, after the fence check (see the module docstring). Lines
    whose ``origin`` the run already holds are skipped (a replay logged them again). Lines
    past the cap are counted into the run's one summary row (``origin = 'dropped'``,
    ``seq`` :data:`DROPPED_SEQ`), created on the first drop and updated after, with
    ``also_dropped`` more: lines the worker logged but never held (over the cap between
    two writes).
    """
    origins = [line.origin for line in lines]
    taken = set(
        (
            await conn.execute(
                select(run_logs.c.origin).where(
                    run_logs.c.tenant_id == tenant_id,
                    run_logs.c.run_id == run_id,
                    run_logs.c.origin.in_(origins),
                )
            )
        ).scalars()
    )
    fresh: list[LogLine] = []
    for line in lines:
        if line.origin not in taken:
            taken.add(line.origin)
            fresh.append(line)
    if not fresh and not also_dropped:
        return 0
    top = (
        await conn.execute(
            select(func.max(run_logs.c.seq)).where(
                run_logs.c.tenant_id == tenant_id,
                run_logs.c.run_id == run_id,
                run_logs.c.seq < DROPPED_SEQ,
            )
        )
    ).scalar_one()
    kept = int(top or 0)
    room = max(max_lines - kept, 0)
    keep, dropped = fresh[:room], fresh[room:]
    if keep:
        await conn.execute(
            insert(run_logs),
            [
                {
                    "tenant_id": tenant_id,
                    "run_id": run_id,
                    "seq": kept + i + 1,
                    "origin": line.origin,
                    "at": line.at,
                    "level": line.level.value,
                    "message": json.dumps(line.message),
                    "fields": line.fields,
                    "step_id": line.step_id,
                    "attempt": line.attempt,
                }
                for i, line in enumerate(keep)
            ],
        )
    count = len(dropped) + also_dropped
    if count:
        when: Any = lines[-1].at if lines else now_expr(conn.dialect.name)
        await _count_dropped(conn, run_id, tenant_id, count, when, max_lines)
    return count


def _summary(total: int, max_lines: int) -> tuple[str, str]:
    message = f"{total} lines dropped (a run keeps {max_lines}, TREADLE_RUN_LOG_MAX_LINES)"
    return json.dumps(message), json.dumps({"dropped": total})


async def _count_dropped(
    conn: AsyncConnection,
    run_id: uuid.UUID,
    tenant_id: str,
    count: int,
    at: Any,
    max_lines: int,
) -> None:
    fields = (
        await conn.execute(
            select(run_logs.c.fields).where(
                run_logs.c.tenant_id == tenant_id,
                run_logs.c.run_id == run_id,
                run_logs.c.origin == DROPPED_ORIGIN,
            )
        )
    ).scalar_one_or_none()
    if fields is None:
        message, data = _summary(count, max_lines)
        await conn.execute(
            insert(run_logs).values(
                tenant_id=tenant_id,
                run_id=run_id,
                seq=DROPPED_SEQ,
                origin=DROPPED_ORIGIN,
                at=at,
                level=LogLevel.WARNING.value,
                message=message,
                fields=data,
                step_id=None,
                attempt=None,
            )
        )
        return
    total = int((json.loads(fields) or {}).get("dropped", 0)) + count
    message, data = _summary(total, max_lines)
    await conn.execute(
        update(run_logs)
        .where(
            run_logs.c.tenant_id == tenant_id,
            run_logs.c.run_id == run_id,
            run_logs.c.origin == DROPPED_ORIGIN,
        )
        .values(message=message, fields=data, at=at)
    )


def _filtered(
    tenant_id: str, run_id: uuid.UUID, level: LogLevel | None, step_id: str | None
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = [
        run_logs.c.run_id == run_id,
        run_logs.c.tenant_id == tenant_id,
    ]
    if level is not None:
        where.append(run_logs.c.level.in_([lv.value for lv in LogLevel if lv.rank >= level.rank]))
    if step_id is not None:
        where.append(run_logs.c.step_id == step_id)
    return where


async def list_lines(
    conn: AsyncConnection,
    tenant_id: str,
    run_id: uuid.UUID,
    *,
    after_seq: int | None,
    limit: int,
    level: LogLevel | None = None,
    step_id: str | None = None,
) -> Sequence[RowMapping]:
    """A page of a run's log lines in ``seq`` order (keyset on the unique ``(run_id, seq)``).

    ``tenant_id`` is the run's own tenant (the loaded run's). ``level`` keeps lines of that
    severity or higher; ``step_id`` keeps one step's lines (all its attempts).
    """
    stmt = select(run_logs).where(*_filtered(tenant_id, run_id, level, step_id))
    if after_seq is not None:
        stmt = stmt.where(run_logs.c.seq > after_seq)
    return (await conn.execute(stmt.order_by(run_logs.c.seq).limit(limit))).mappings().all()


async def last_lines(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID, *, limit: int
) -> tuple[list[RowMapping], int]:
    """The run's last ``limit`` lines (oldest first) and how many lines it keeps in all."""
    rows = (
        (
            await conn.execute(
                select(run_logs)
                .where(run_logs.c.run_id == run_id, run_logs.c.tenant_id == tenant_id)
                .order_by(run_logs.c.seq.desc())
                .limit(limit)
            )
        )
        .mappings()
        .all()
    )
    total = (
        await conn.execute(
            select(func.count())
            .select_from(run_logs)
            .where(run_logs.c.run_id == run_id, run_logs.c.tenant_id == tenant_id)
        )
    ).scalar_one()
    return list(reversed(rows)), int(total)
