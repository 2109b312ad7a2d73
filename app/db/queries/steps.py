"""Queries on ``steps``, the journal keyed by ``(run_id, step_id)``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import StepStatus
from app.db.dialect import now_expr, now_plus
from app.db.tables import steps


async def load_journal(conn: AsyncConnection, run_id: uuid.UUID) -> Sequence[RowMapping]:
    """Return every journaled step of a run in call order (``seq``)."""
    result = await conn.execute(select(steps).where(steps.c.run_id == run_id).order_by(steps.c.seq))
    return result.mappings().all()


async def start_attempt(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    step_id: str,
    seq: int,
    kind: str,
    name: str,
    attempt: int,
    max_attempts: int,
    fence: int,
    detail: str | None = None,
) -> None:
    """Record that attempt ``attempt`` of a step starts now (insert or update).

    ``detail`` (JSON text) marks e.g. a step that registers a compensation.

    Call after :func:`app.db.queries.runs.check_fence` in the same transaction.
    """
    dialect = conn.dialect.name
    now = now_expr(dialect)
    values: dict[str, Any] = {
        "run_id": run_id,
        "tenant_id": tenant_id,
        "step_id": step_id,
        "seq": seq,
        "kind": kind,
        "name": name,
        "status": StepStatus.RUNNING.value,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "created_at": now,
        "started_at": now,
        "fence": fence,
        "next_attempt_at": None,
        "detail": detail,
    }
    ins: Any = (postgresql if dialect == "postgresql" else sqlite).insert(steps).values(values)
    stmt = ins.on_conflict_do_update(
        index_elements=["run_id", "step_id"],
        set_={
            "status": StepStatus.RUNNING.value,
            "attempt": attempt,
            "started_at": now,
            "fence": fence,
            "next_attempt_at": None,
            "error": ins.excluded.error,
            "detail": ins.excluded.detail,
        },
    )
    await conn.execute(stmt)


async def finish_attempt(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    step_id: str,
    status: StepStatus,
    output: str | None,
    error: str | None,
    fence: int,
    retry_in: float | None = None,
) -> None:
    """Record an attempt's outcome; ``retry_in`` seconds sets ``next_attempt_at`` (DB time).

    Call after :func:`app.db.queries.runs.check_fence` in the same transaction.
    """
    dialect = conn.dialect.name
    now = now_expr(dialect)
    values: dict[str, Any] = {
        "status": status.value,
        "output": output,
        "error": error,
        "fence": fence,
        "finished_at": None if status == StepStatus.RETRY_WAIT else now,
        "next_attempt_at": None if retry_in is None else now_plus(dialect, retry_in),
    }
    await conn.execute(
        update(steps).where(steps.c.run_id == run_id, steps.c.step_id == step_id).values(values)
    )


async def reset_interrupted(conn: AsyncConnection, run_id: uuid.UUID) -> None:
    """Mark attempts interrupted by a graceful release as not started (not counted)."""
    await conn.execute(
        update(steps)
        .where(steps.c.run_id == run_id, steps.c.status == StepStatus.RUNNING.value)
        .values(status=StepStatus.PENDING.value, attempt=steps.c.attempt - 1)
    )


async def cancel_running(conn: AsyncConnection, run_id: uuid.UUID) -> None:
    """Mark the run's in-flight and waiting steps ``cancelled`` (the run ended)."""
    await conn.execute(
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.status.in_(
                [StepStatus.RUNNING.value, StepStatus.RETRY_WAIT.value, StepStatus.WAITING.value]
            ),
        )
        .values(status=StepStatus.CANCELLED.value, finished_at=now_expr(conn.dialect.name))
    )


async def list_steps(
    conn: AsyncConnection, run_id: uuid.UUID, *, after_seq: int | None, limit: int
) -> Sequence[RowMapping]:
    """A page of a run's steps in call order (keyset on ``seq``)."""
    stmt = select(steps).where(steps.c.run_id == run_id)
    if after_seq is not None:
        stmt = stmt.where(steps.c.seq > after_seq)
    return (await conn.execute(stmt.order_by(steps.c.seq).limit(limit))).mappings().all()


async def count_by_status(conn: AsyncConnection, run_id: uuid.UUID) -> dict[str, int]:
    """Return ``{step status: count}`` for one run."""
    rows = (
        await conn.execute(
            select(steps.c.status, func.count())
            .where(steps.c.run_id == run_id)
            .group_by(steps.c.status)
        )
    ).all()
    return {str(r[0]): int(r[1]) for r in rows}


async def insert_step(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    step_id: str,
    seq: int,
    kind: str,
    name: str,
    status: StepStatus,
    fence: int,
    output: str | None = None,
    deadline: datetime | None = None,
    detail: str | None = None,
) -> None:
    """Journal a wait (``status=waiting``) or a recorded value (``succeeded``) in one go.

    Call after :func:`app.db.queries.runs.check_fence` in the same transaction.
    """
    now = now_expr(conn.dialect.name)
    finished = now if status == StepStatus.SUCCEEDED else None
    await conn.execute(
        insert(steps).values(
            run_id=run_id,
            tenant_id=tenant_id,
            step_id=step_id,
            seq=seq,
            kind=kind,
            name=name,
            status=status.value,
            attempt=1,
            max_attempts=1,
            output=output,
            deadline=deadline,
            detail=detail,
            fence=fence,
            created_at=now,
            started_at=now,
            finished_at=finished,
        )
    )


async def set_status(
    conn: AsyncConnection, *, run_id: uuid.UUID, step_id: str, status: StepStatus
) -> None:
    """Set one step's status (the original step of a compensation: compensated/failed)."""
    await conn.execute(
        update(steps)
        .where(steps.c.run_id == run_id, steps.c.step_id == step_id)
        .values(status=status.value)
    )


async def has_compensations(conn: AsyncConnection, run_id: uuid.UUID) -> bool:
    """True if a succeeded step of the run registered a compensation."""
    rows = (
        await conn.execute(
            select(steps.c.detail).where(
                steps.c.run_id == run_id,
                steps.c.status == StepStatus.SUCCEEDED.value,
                steps.c.detail.is_not(None),
            )
        )
    ).scalars()
    return any("compensate" in (json.loads(d) or {}) for d in rows)


async def count_kind(conn: AsyncConnection, run_id: uuid.UUID, kind: str) -> int:
    """Journal entries of one kind in a run (e.g. ``child``: the children ceiling)."""
    stmt = select(func.count()).where(steps.c.run_id == run_id, steps.c.kind == kind)
    return int((await conn.execute(stmt)).scalar_one())
