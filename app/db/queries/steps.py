"""Queries on ``steps``, the journal keyed by ``(run_id, step_id)``.

Every statement on one run's journal names the run's tenant too (``tenant_id``, the
claimed or looked-up run's): it narrows nothing, run ids being globally unique, but it
routes the statement to one shard once ``steps`` is distributed by tenant
(docs/adr/0034-tenant-leading-keys.md, "Queries keyed by tenant").
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    RowMapping,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    null,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import RunReason, StepStatus
from app.db.dialect import now_expr, now_plus
from app.db.tables import steps
from app.db.types import UtcDateTime


async def load_journal(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str
) -> Sequence[RowMapping]:
    """Return every journaled step of a tenant's run in call order (``seq``)."""
    result = await conn.execute(
        select(steps)
        .where(steps.c.tenant_id == tenant_id, steps.c.run_id == run_id)
        .order_by(steps.c.seq)
    )
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
    started_at: datetime | None = None,
) -> None:
    """Record that attempt ``attempt`` of a step starts (insert or update).

    ``detail`` (JSON text) marks e.g. a step that registers a compensation.
    ``started_at`` (aware UTC) is when the attempt began, for an attempt journaled only
    once it finished (docs/adr/0040-one-commit-per-step.md); None means now (the
    database clock).

    Call after :func:`app.db.queries.runs.check_fence` in the same transaction.
    """
    params: dict[str, Any] = {
        "run_id": run_id,
        "tenant_id": tenant_id,
        "step_id": step_id,
        "seq": seq,
        "kind": kind,
        "name": name,
        "status": StepStatus.RUNNING.value,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "fence": fence,
        "next_attempt_at": None,
        "detail": detail,
    }
    if started_at is not None:
        params["b_started_at"] = started_at  # an INSERT refuses a parameter it does not consume
    await conn.execute(_start_attempt_stmt(conn.dialect.name, started_at is not None), params)


@functools.cache
def _start_attempt_stmt(dialect: str, started_given: bool) -> Any:
    # Built once per dialect: constructing the upsert (its ``excluded`` alias above all)
    # cost more worker CPU than executing it. Values arrive as execute() parameters.
    now = now_expr(dialect)
    started: Any = bindparam("b_started_at", type_=UtcDateTime()) if started_given else now
    if started_given and dialect == "postgresql":
        # A worker's estimate, written late (a deferred start record, PostgreSQL only):
        # never after this transaction's clock, as the one-statement checkpoints cap it.
        started = func.least(started, now)
    ins: Any = (postgresql if dialect == "postgresql" else sqlite).insert(steps)
    ins = ins.values(created_at=now, started_at=started)
    return ins.on_conflict_do_update(
        index_elements=["tenant_id", "run_id", "step_id"],
        set_={
            "status": ins.excluded.status,
            "attempt": ins.excluded.attempt,
            "started_at": started,
            # An attempt in flight has not finished: an earlier attempt's finish time
            # (a failure requeued from its dead letter, a rerun) must not outlive it.
            "finished_at": None,
            "fence": ins.excluded.fence,
            "next_attempt_at": None,
            "error": None,
            "detail": ins.excluded.detail,
        },
    )


async def finish_attempt(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
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
    if retry_in is None and status != StepStatus.RETRY_WAIT:
        await conn.execute(
            _finish_attempt_stmt(dialect),
            {
                "b_tenant_id": tenant_id,
                "b_run_id": run_id,
                "b_step_id": step_id,
                "status": status.value,
                "output": output,
                "error": error,
                "fence": fence,
            },
        )
        return
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
        update(steps)
        .where(
            steps.c.tenant_id == tenant_id,
            steps.c.tenant_id == tenant_id,
            steps.c.run_id == run_id,
            steps.c.step_id == step_id,
        )
        .values(values)
    )


@functools.cache
def _finish_attempt_stmt(dialect: str) -> Any:
    # The common case (a final outcome), built once per dialect like the start upsert.
    return (
        update(steps)
        .where(
            steps.c.tenant_id == bindparam("b_tenant_id"),
            steps.c.run_id == bindparam("b_run_id"),
            steps.c.step_id == bindparam("b_step_id"),
        )
        .values(finished_at=now_expr(dialect), next_attempt_at=None)
    )


async def reset_interrupted(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> None:
    """Mark attempts interrupted by a graceful release as not started (not counted)."""
    await conn.execute(
        update(steps)
        .where(
            steps.c.tenant_id == tenant_id,
            steps.c.run_id == run_id,
            steps.c.status == StepStatus.RUNNING.value,
        )
        .values(status=StepStatus.PENDING.value, attempt=steps.c.attempt - 1)
    )


async def cancel_running(
    conn: AsyncConnection,
    run_id: uuid.UUID,
    reason: RunReason = RunReason.CANCELED_BY_REQUEST,
    message: str | None = None,
    *,
    tenant_id: str,
) -> None:
    """Mark the run's in-flight and waiting steps ``cancelled`` (the run ended).

    Args:
        conn: in the transaction that ends (or starts cancelling) the run.
        run_id: the run.
        reason: why they were cancelled, the steps' ``reason`` from now on:
            ``canceled_by_request`` (the default, nothing recorded) for a cancel;
            ``canceled_by_failure`` when the run failed while they were unfinished.
        message: what happened, recorded with any other reason in the step's ``error``
            (``{"type": "Cancelled", "message", "reason"}``, plus ``last_error``: the
            error of the attempt before, e.g. of a step waiting to retry).
        tenant_id: the run's tenant (keys every statement to it).
    """
    unfinished = steps.c.status.in_(
        [StepStatus.RUNNING.value, StepStatus.RETRY_WAIT.value, StepStatus.WAITING.value]
    )
    now = now_expr(conn.dialect.name)
    if reason == RunReason.CANCELED_BY_REQUEST:
        await conn.execute(
            update(steps)
            .where(steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, unfinished)
            .values(status=StepStatus.CANCELLED.value, finished_at=now)
        )
        return
    # A few rows (the run's unfinished branches): each keeps its own last error.
    rows = (
        await conn.execute(
            select(steps.c.step_id, steps.c.error).where(
                steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, unfinished
            )
        )
    ).all()
    for step_id, previous in rows:
        error: dict[str, Any] = {
            "type": "Cancelled",
            "message": message or f"cancelled: {reason.value}",
            "reason": reason.value,
        }
        if previous is not None:
            error["last_error"] = json.loads(previous)
        await conn.execute(
            update(steps)
            .where(
                steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, steps.c.step_id == step_id
            )
            .values(status=StepStatus.CANCELLED.value, finished_at=now, error=json.dumps(error))
        )


# A step's reason, in the run-reason vocabulary: how the step itself ended. Derived from
# its status (and, for failures, the ``reason`` its error records) rather than stored, so
# it can never disagree with the status whichever code path set it.
_SUCCEEDED_STATUSES = (
    StepStatus.SUCCEEDED,
    StepStatus.COMPENSATING,
    StepStatus.COMPENSATED,
    StepStatus.COMPENSATION_FAILED,
)
# Ended steps whose error may record how (``error.reason``), and the reason when not:
# failures by their class, a rejected approval ``rejected_by_approver``, a step cancelled
# with its failing run ``canceled_by_failure`` (app/db/queries/steps.py:cancel_running).
_DEFAULT_RECORDED = {
    StepStatus.FAILED: RunReason.FAILURE_NON_RETRYABLE,
    StepStatus.TIMED_OUT: RunReason.FAILURE_TIMED_OUT,
    StepStatus.CANCELLED: RunReason.CANCELED_BY_REQUEST,
}


def step_reason(status: str, error: str | None) -> str | None:
    """How a step ended (``succeeded``, ``failure_…``, ``canceled_by_…``, …), or None.

    Compensated steps keep ``succeeded`` (the step itself succeeded; its status tells the
    undo). Failed, timed-out and cancelled steps take the reason their error records
    (``failure_attempts_exhausted``, ``rejected_by_approver``, ``canceled_by_failure``…),
    else their status's default. Unfinished steps (pending, running, retry_wait,
    waiting) have no reason.
    """
    st = StepStatus(status)
    if st in _SUCCEEDED_STATUSES:
        return RunReason.SUCCEEDED.value
    default = _DEFAULT_RECORDED.get(st)
    if default is None:
        return None
    recorded = (json.loads(error) or {}).get("reason") if error else None
    return str(recorded) if recorded else default.value


def _reason_expr(dialect: str) -> Any:
    """SQL twin of :func:`step_reason` (JSON text read with the dialect's JSON function)."""
    if dialect == "postgresql":
        recorded: Any = func.json_extract_path_text(cast(steps.c.error, JSON), "reason")
    else:
        recorded = func.json_extract(steps.c.error, "$.reason")
    return case(
        (
            steps.c.status.in_([s.value for s in _SUCCEEDED_STATUSES]),
            literal(RunReason.SUCCEEDED.value),
        ),
        *(
            (steps.c.status == st.value, func.coalesce(recorded, literal(default.value)))
            for st, default in _DEFAULT_RECORDED.items()
        ),
        else_=null(),
    )


async def list_steps(
    conn: AsyncConnection,
    tenant_id: str,
    run_id: uuid.UUID,
    *,
    after_seq: int | None,
    limit: int,
    status: StepStatus | None = None,
    reason: RunReason | None = None,
) -> Sequence[RowMapping]:
    """A page of a tenant's run's steps in call order (keyset on ``seq``).

    ``status`` and ``reason`` filter (see :func:`step_reason`); the keyset stays ``seq``,
    so pages are stable while the run adds steps (new steps get higher ``seq``).
    """
    stmt = select(steps).where(
        steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, steps.c.tenant_id == tenant_id
    )
    if status is not None:
        stmt = stmt.where(steps.c.status == status.value)
    if reason is not None:
        stmt = stmt.where(_reason_expr(conn.dialect.name) == reason.value)
    if after_seq is not None:
        stmt = stmt.where(steps.c.seq > after_seq)
    return (await conn.execute(stmt.order_by(steps.c.seq).limit(limit))).mappings().all()


async def count_by_status(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID
) -> dict[str, int]:
    """Return ``{step status: count}`` for one of the tenant's runs (its own tenant)."""
    rows = (
        await conn.execute(
            select(steps.c.status, func.count())
            .where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.tenant_id == tenant_id,
            )
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
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, step_id: str, status: StepStatus
) -> None:
    """Set one step's status (the original step of a compensation: compensated/failed)."""
    await conn.execute(
        update(steps)
        .where(steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, steps.c.step_id == step_id)
        .values(status=status.value)
    )


async def has_compensations(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> bool:
    """True if a succeeded step of the run registered a compensation."""
    rows = (
        await conn.execute(
            select(steps.c.detail).where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.status == StepStatus.SUCCEEDED.value,
                steps.c.detail.is_not(None),
            )
        )
    ).scalars()
    return any("compensate" in (json.loads(d) or {}) for d in rows)


async def count_kind(conn: AsyncConnection, run_id: uuid.UUID, kind: str, *, tenant_id: str) -> int:
    """Journal entries of one kind in a run (e.g. ``child``: the children ceiling)."""
    stmt = select(func.count()).where(
        steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, steps.c.kind == kind
    )
    return int((await conn.execute(stmt)).scalar_one())


# Statuses of a step that ended without succeeding: what a requeue starts over.
_ENDED_UNSUCCESSFULLY = [
    StepStatus.FAILED.value,
    StepStatus.TIMED_OUT.value,
    StepStatus.CANCELLED.value,
]
# Statuses a step whose undo has begun takes (``_compensate`` in app/engine/executor.py).
_UNDONE = [
    StepStatus.COMPENSATING.value,
    StepStatus.COMPENSATED.value,
    StepStatus.COMPENSATION_FAILED.value,
]


def compensation_began_clause() -> Any:
    """SQL condition on ``steps``: the entry shows the run's compensation began."""
    return (steps.c.kind == "compensation") | steps.c.status.in_(_UNDONE)


async def compensation_began(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> bool:
    """True once any compensation of the run was journaled or any step was undone.

    From then on the run's body results no longer stand, so the run may only be undone
    further, never resumed (docs/adr/0009-requeue-into-compensation.md).
    """
    stmt = select(steps.c.step_id).where(
        steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, compensation_began_clause()
    )
    return (await conn.execute(stmt.limit(1))).first() is not None


# What a step's ``detail`` counts against the run's budgets: a requeued step starts over
# without it (the timeline keeps every attempt that ran, ``step_started`` per attempt).
_BUDGET_DETAIL_KEYS = ("lost_attempts",)


async def _forget_budgets(conn: AsyncConnection, where: list[Any]) -> None:
    """Drop the budget counters from the ``detail`` of the steps ``where`` selects.

    Rewritten in Python, not with the dialects' JSON functions: a requeue touches a few
    rows, and the detail stays the compact text the engine writes everywhere else.
    """
    rows = (await conn.execute(select(steps.c.step_id, steps.c.detail).where(*where))).all()
    for step_id, detail in rows:
        marks = json.loads(detail) if detail else None
        if not isinstance(marks, dict) or not any(k in marks for k in _BUDGET_DETAIL_KEYS):
            continue
        kept = {k: v for k, v in marks.items() if k not in _BUDGET_DETAIL_KEYS}
        await conn.execute(
            update(steps)
            .where(*where, steps.c.step_id == step_id)
            .values(detail=json.dumps(kept) if kept else None)
        )


async def budget_horizon(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str, below: int
) -> int:
    """The body position a requeue's fresh budget counts from: past the last step that stands.

    One more than the highest ``seq`` under ``below`` (where compensations' positions
    begin) of the run's body entries that did not end
    unsuccessfully (read before they are reopened), 0 with none. Work journaled at or
    after it is the new budget's (a reopened step is). Read by the state machine, whose
    ``max_transitions`` counts transitions from it
    (docs/adr/0050-an-attempt-counts-when-it-starts.md).
    """
    top = (
        await conn.execute(
            select(func.max(steps.c.seq)).where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.seq < below,
                steps.c.status.not_in(_ENDED_UNSUCCESSFULLY),
            )
        )
    ).scalar_one()
    return 0 if top is None else int(top) + 1


async def reopen_failed_compensations(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str
) -> int:
    """Start the run's failed (timed-out, cancelled) compensations over; returns how many.

    Only those: compensations that succeeded stay done, and body steps are not touched
    (the requeued run is undone, not resumed). Attempts reset, as for a requeued step,
    lost attempts too.
    """
    where = [
        steps.c.tenant_id == tenant_id,
        steps.c.run_id == run_id,
        steps.c.kind == "compensation",
        steps.c.status.in_(_ENDED_UNSUCCESSFULLY),
    ]
    await _forget_budgets(conn, where)
    result = await conn.execute(
        update(steps)
        .where(*where)
        .values(
            status=StepStatus.PENDING.value,
            attempt=0,
            next_attempt_at=None,
            finished_at=None,
        )
    )
    return int(result.rowcount or 0)


async def reopen_failed_body_steps(
    conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str
) -> list[uuid.UUID]:
    """Start a requeued run's failed work over, from its failed point.

    Failed, timed-out and cancelled steps and transactions go back to ``pending`` with
    their attempts reset, lost attempts (``detail.lost_attempts``) included; timed-out
    signal and approval waits wait again for their original timeout, counted from now;
    failed (or cancelled) joined children are joined again, so a child that completes
    meanwhile, or is requeued with its parent, satisfies the parent's ``ctx.child``.

    Returns:
        The run ids of the children whose join was reopened (the caller requeues those
        that are failed).
    """
    dialect = conn.dialect.name
    where = [
        steps.c.tenant_id == tenant_id,
        steps.c.run_id == run_id,
        steps.c.kind.in_(["step", "transaction"]),
        steps.c.status.in_(_ENDED_UNSUCCESSFULLY),
    ]
    await _forget_budgets(conn, where)
    await conn.execute(
        update(steps)
        .where(*where)
        .values(status=StepStatus.PENDING.value, attempt=0, next_attempt_at=None)
    )
    waits = (
        await conn.execute(
            select(steps.c.step_id, steps.c.detail).where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.kind.in_(["signal", "approval"]),
                steps.c.status == StepStatus.TIMED_OUT.value,
            )
        )
    ).all()
    for step_id, detail in waits:
        timeout = (json.loads(detail) or {}).get("timeout")
        await conn.execute(
            update(steps)
            .where(
                steps.c.tenant_id == tenant_id, steps.c.run_id == run_id, steps.c.step_id == step_id
            )
            .values(
                status=StepStatus.WAITING.value,
                deadline=None if timeout is None else now_plus(dialect, float(timeout)),
                finished_at=None,
                error=None,
            )
        )
    children = (
        await conn.execute(
            update(steps)
            .where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.kind == "child",
                steps.c.status.in_(_ENDED_UNSUCCESSFULLY),
            )
            .values(status=StepStatus.WAITING.value, finished_at=None, error=None)
            .returning(steps.c.detail)
        )
    ).scalars()
    found: list[uuid.UUID] = []
    for detail in children:
        info = json.loads(detail) or {}
        if info.get("child_run_id") and not info.get("detached"):
            found.append(uuid.UUID(info["child_run_id"]))
    return found


async def retry_backoffs_now(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> None:
    """Steps waiting out a retry backoff (compensations too) try again now (resume)."""
    await conn.execute(
        update(steps)
        .where(
            steps.c.tenant_id == tenant_id,
            steps.c.run_id == run_id,
            steps.c.status == StepStatus.RETRY_WAIT.value,
        )
        .values(next_attempt_at=now_expr(conn.dialect.name))
    )


async def copy_journal_prefix(
    conn: AsyncConnection,
    *,
    source_run_id: uuid.UUID,
    target_run_id: uuid.UUID,
    tenant_id: str,
    before_seq: int,
) -> int:
    """Copy a run's journal entries with ``seq < before_seq`` to another run (a rerun).

    The copies keep step id, seq, kind, name, status, attempts, output, error, deadline,
    detail and timings, so the rerun replays them exactly as the original would; their
    fence is 0 (the rerun's first claim makes it 1). One ``INSERT … SELECT``.

    Returns:
        How many entries were copied.
    """
    src = steps.alias("src")
    cols = [
        "step_id",
        "seq",
        "kind",
        "name",
        "status",
        "attempt",
        "max_attempts",
        "output",
        "error",
        "next_attempt_at",
        "deadline",
        "detail",
        "created_at",
        "started_at",
        "finished_at",
    ]
    picked = select(
        literal(target_run_id, type_=steps.c.run_id.type).label("run_id"),
        literal(tenant_id, type_=steps.c.tenant_id.type).label("tenant_id"),
        *[src.c[c] for c in cols],
        literal(0, type_=steps.c.fence.type).label("fence"),
    ).where(src.c.tenant_id == tenant_id, src.c.run_id == source_run_id, src.c.seq < before_seq)
    result = await conn.execute(
        insert(steps).from_select(["run_id", "tenant_id", *cols, "fence"], picked)
    )
    return int(result.rowcount or 0)
