"""Single-statement step checkpoints for PostgreSQL: fence check, journal and event at once.

A step attempt writes one checkpoint when it finishes quickly (:func:`step_done`, the
whole attempt at once) or two: its start and its result. Each must (1) verify
that the run's fence is still ours while locking the run row, (2) upsert the step's
journal row and (3) append a timeline event, atomically. Sent as separate statements in
an explicit transaction that is five round trips (BEGIN, three statements, COMMIT); here
it is one statement of data-modifying CTEs (PostgreSQL "WITH queries", §7.8.4), run in
autocommit, so the statement is its own transaction. ``held`` takes the run row lock
(an ``UPDATE``, re-checked against a concurrent claim's new fence under READ COMMITTED),
and the journal and event rows are produced only ``FROM held``: a moved fence writes
nothing, exactly like :func:`app.db.queries.runs.check_fence` followed by the writes.
Every statement names the run's tenant beside its id (``tenant_id = :tenant_id``): it
narrows nothing for the right tenant, makes a wrong one match nothing, and routes the
statement to one shard on a database distributed by tenant
(docs/adr/0034-tenant-leading-keys.md).
A run's completion (:func:`complete_run`) is folded the same way when nothing else
changes with it (no concurrency slot to hand on, no parent to wake), and with its last
step's result when that was held for it (:func:`complete_with_step`,
docs/adr/0047-held-step-results.md).

SQLite keeps the multi-statement transaction (an embedded database has no round trips).
Which form runs is decided in one place, :func:`commit`, the only caller of this module's
statements outside tests; the engine's one caller of :func:`commit` is
``app/engine/journal.py`` (``RunJournal``), which owns every fenced write of a leased run.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from sqlalchemy import BigInteger, Integer, String, Text, Uuid, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import LeaseLost
from app.core.status import EventKind, RunStatus, StepStatus
from app.db.database import Database
from app.db.queries.runs import LEASED_STATUSES
from app.db.types import UtcDateTime

if TYPE_CHECKING:
    from app.db.group_commit import Grouped

T = TypeVar("T")

Write = Callable[[AsyncConnection], Awaitable[T]]


async def commit(
    db: Database,
    transaction: Write[T],
    *,
    statement: Write[T] | None = None,
    grouped: Grouped | None = None,
    what: str,
    pool: Literal["main", "lease"] = "main",
) -> T:
    """Commit one fenced write of a leased run in the form the dialect calls for.

    On PostgreSQL, when the write has a single self-fencing form (``statement``: one of
    :func:`start_attempt`, :func:`record_success`, :func:`step_done`,
    :func:`complete_run`, :func:`complete_with_step`), that statement
    runs alone on an autocommit connection: one round trip instead of five. Otherwise
    (SQLite, or a write that is more than one statement) ``transaction`` runs in a write
    transaction; it must fence itself (:func:`app.db.queries.runs.check_fence` first, or
    statements that carry ``fence = :fence``). Either form is re-run after a deadlock,
    serialization failure or SQLite lock (``TREADLE_DB_RETRY_ATTEMPTS``), so neither may
    keep state outside the database between calls.

    ``grouped``, given with ``statement``, is the same write as a row for the process's
    group committer (app/db/group_commit.py): on PostgreSQL with group commit on
    (``TREADLE_GROUP_COMMIT_WINDOW_MS`` not negative) it is sent with the other runs'
    rows of the same moment in one statement, and this returns once that statement
    committed (docs/adr/0039-group-commit.md).

    Args:
        db: the database (its ``dialect`` picks the form).
        transaction: the multi-statement form; receives the open connection.
        statement: the single-statement form, if the write has one.
        grouped: the same write as a group-commit row (returns the row's pause news,
            as its single form does: app/db/group_commit.py).
        what: names the write in retry log lines.
        pool: ``lease`` for a lease release (the lease pool, beside heartbeats:
            ``Database.lease_write``), else the main pool.

    Returns:
        What the form that ran returned.

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
        Whatever else the form raised (faults are classified by the caller).
    """
    if statement is not None and db.dialect == "postgresql":
        if grouped is not None and db.settings.group_commit_window_ms >= 0:
            return cast(T, await grouped.commit(db))
        return await db.autocommit_retrying(statement, what=what)
    if pool == "lease":
        return await db.lease_write_retrying(transaction, what=what)
    return await db.write_retrying(transaction, what=what)


_LEASED_SQL = ", ".join(f"'{s.value}'" for s in LEASED_STATUSES)

_HELD = f"""
held AS (
    UPDATE runs SET updated_at = now(), lost_claims = 0
    WHERE tenant_id = :tenant_id AND run_id = :run_id AND fence = :fence
      AND status IN ({_LEASED_SQL})
    RETURNING run_id, tenant_id, paused_at IS NOT NULL AS paused
)"""

_TIMELINE = """
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, now(), :event_kind, :step_id, NULL, :event_data FROM journal
)"""

_START = text(
    f"""WITH {_HELD},
journal AS (
    INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt,
                       max_attempts, fence, next_attempt_at, detail, created_at, started_at)
    SELECT run_id, :step_id, tenant_id, :seq, :kind, :name, :status, :attempt,
           :max_attempts, :fence, NULL, :detail, now(),
           LEAST(CAST(:started_at AS timestamptz), now())
    FROM held
    ON CONFLICT (tenant_id, run_id, step_id) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt, started_at = excluded.started_at,
        finished_at = NULL, fence = excluded.fence, next_attempt_at = NULL, error = NULL,
        detail = excluded.detail
    RETURNING run_id, tenant_id
),
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, LEAST(CAST(:started_at AS timestamptz), now()), :event_kind,
           :step_id, NULL, :event_data
    FROM journal
)
SELECT count(*) FROM held"""
).bindparams(
    bindparam("run_id", type_=Uuid()),
    bindparam("tenant_id", type_=String()),
    bindparam("fence", type_=BigInteger()),
    bindparam("started_at", type_=UtcDateTime()),
    bindparam("step_id", type_=String()),
    bindparam("seq", type_=Integer()),
    bindparam("kind", type_=String()),
    bindparam("name", type_=String()),
    bindparam("status", type_=String()),
    bindparam("attempt", type_=Integer()),
    bindparam("max_attempts", type_=Integer()),
    bindparam("detail", type_=Text()),
    bindparam("event_kind", type_=String()),
    bindparam("event_data", type_=Text()),
)

_SUCCESS = text(
    f"""WITH {_HELD},
journal AS (
    UPDATE steps SET status = :status, output = :output, error = NULL, fence = :fence,
                     finished_at = now(), next_attempt_at = NULL
    FROM held
    WHERE steps.tenant_id = :tenant_id AND steps.run_id = held.run_id
      AND steps.step_id = :step_id
    RETURNING held.run_id, held.tenant_id
), {_TIMELINE}
SELECT count(*), bool_or(paused) FROM held"""
).bindparams(
    bindparam("run_id", type_=Uuid()),
    bindparam("tenant_id", type_=String()),
    bindparam("fence", type_=BigInteger()),
    bindparam("step_id", type_=String()),
    bindparam("status", type_=String()),
    bindparam("output", type_=Text()),
    bindparam("event_kind", type_=String()),
    bindparam("event_data", type_=Text()),
)


WHOLE_ATTEMPT_INSERT = """
    INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt,
                       max_attempts, output, fence, next_attempt_at, detail, created_at,
                       started_at, finished_at)""".lstrip("\n")
"""The column list of a whole attempt's ``steps`` row (start and result at once), for the
statements here and in app/db/group_commit.py; its rows follow as a ``SELECT``."""

WHOLE_ATTEMPT_CONFLICT = """
    ON CONFLICT (tenant_id, run_id, step_id) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt, output = excluded.output,
        error = NULL, started_at = excluded.started_at, finished_at = excluded.finished_at,
        fence = excluded.fence, next_attempt_at = NULL, detail = excluded.detail""".lstrip("\n")
"""What a whole attempt's ``steps`` row does to an earlier row of the step (a retried
attempt, a start record written before it): every column of the attempt replaced."""

_DONE = text(
    f"""WITH {_HELD},
journal AS (
{WHOLE_ATTEMPT_INSERT}
    SELECT run_id, :step_id, tenant_id, :seq, :kind, :name, :status, :attempt,
           :max_attempts, :output, :fence, NULL, :detail, now(),
           LEAST(CAST(:started_at AS timestamptz), now()), now()
    FROM held
{WHOLE_ATTEMPT_CONFLICT}
    RETURNING run_id, tenant_id
),
-- Both events from one INSERT, in timeline order: sibling data-modifying CTEs run in no
-- defined order (PostgreSQL manual, 7.8.4), the rows of one INSERT … SELECT … ORDER BY do.
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, e.at, e.kind, :step_id, NULL, e.data
    FROM journal CROSS JOIN (VALUES
        (1, LEAST(CAST(:started_at AS timestamptz), now()), CAST(:started_kind AS varchar),
         CAST(:started_data AS text)),
        (2, now(), CAST(:event_kind AS varchar), CAST(:event_data AS text))
    ) AS e (n, at, kind, data)
    ORDER BY e.n
)
SELECT count(*), bool_or(paused) FROM held"""
).bindparams(
    bindparam("run_id", type_=Uuid()),
    bindparam("tenant_id", type_=String()),
    bindparam("fence", type_=BigInteger()),
    bindparam("step_id", type_=String()),
    bindparam("seq", type_=Integer()),
    bindparam("kind", type_=String()),
    bindparam("name", type_=String()),
    bindparam("status", type_=String()),
    bindparam("attempt", type_=Integer()),
    bindparam("max_attempts", type_=Integer()),
    bindparam("output", type_=Text()),
    bindparam("detail", type_=Text()),
    bindparam("started_at", type_=UtcDateTime()),
    bindparam("started_kind", type_=String()),
    bindparam("started_data", type_=Text()),
    bindparam("event_kind", type_=String()),
    bindparam("event_data", type_=Text()),
)


async def step_done(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    step_id: str,
    seq: int,
    kind: str,
    name: str,
    attempt: int,
    max_attempts: int,
    detail: str | None,
    output: str,
    started_at: datetime,
    started_data: str,
    event_data: str,
) -> bool:
    """Fence-check, journal a whole attempt that succeeded (no start record), both events.

    The one commit of a step that finished before its start record was due
    (``TREADLE_STEP_START_RECORD_AFTER_SECONDS``, docs/adr/0040-one-commit-per-step.md):
    the ``steps`` row is written ``succeeded`` with ``output`` (JSON text) and
    ``started_at`` (the attempt's start, database clock), then ``step_started``
    (``started_data``, at ``started_at``) and ``step_succeeded`` (``event_data``) in that
    order. Run on an autocommit connection (PostgreSQL).

    Returns:
        Whether an operator has paused the run: its ``paused_at`` as of this statement's
        row lock, the executor's next pause point (docs/adr/0044-pause-news.md).

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
    """
    result = await conn.execute(
        _DONE,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "fence": fence,
            "step_id": step_id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "status": StepStatus.SUCCEEDED.value,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "output": output,
            "detail": detail,
            "started_at": started_at,
            "started_kind": EventKind.STEP_STARTED.value,
            "started_data": started_data,
            "event_kind": EventKind.STEP_SUCCEEDED.value,
            "event_data": event_data,
        },
    )
    return _held_news(result.one(), run_id)


def _held_news(row: Any, run_id: uuid.UUID) -> bool:
    """``paused`` of a ``SELECT count(*), bool_or(paused) FROM held`` row; LeaseLost if 0."""
    if row[0] != 1:
        raise LeaseLost(run_id)
    return bool(row[1])


async def start_attempt(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    step_id: str,
    seq: int,
    kind: str,
    name: str,
    attempt: int,
    max_attempts: int,
    detail: str | None,
    event_data: str,
    started_at: datetime | None = None,
) -> None:
    """Fence-check, journal attempt ``attempt`` of a step as running, append ``step_started``.

    ``event_data`` is the event's JSON text; ``started_at`` when the attempt began, if
    before now (a held start record, docs/adr/0040-one-commit-per-step.md), else None.
    Run on an autocommit connection (PostgreSQL).

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
    """
    result = await conn.execute(
        _START,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "fence": fence,
            "step_id": step_id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "status": StepStatus.RUNNING.value,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "detail": detail,
            "started_at": started_at,
            "event_kind": EventKind.STEP_STARTED.value,
            "event_data": event_data,
        },
    )
    if result.scalar_one() != 1:
        raise LeaseLost(run_id)


async def record_success(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    step_id: str,
    output: str,
    event_data: str,
) -> bool:
    """Fence-check, journal a step's result (JSON text), append ``step_succeeded``.

    Run on an autocommit connection (PostgreSQL).

    Returns:
        Whether an operator has paused the run: its ``paused_at`` as of this statement's
        row lock, the executor's next pause point (docs/adr/0044-pause-news.md).

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
    """
    result = await conn.execute(
        _SUCCESS,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "fence": fence,
            "step_id": step_id,
            "status": StepStatus.SUCCEEDED.value,
            "output": output,
            "event_kind": EventKind.STEP_SUCCEEDED.value,
            "event_data": event_data,
        },
    )
    return _held_news(result.one(), run_id)


WEBHOOKS_CTE = """
-- The runs' webhook deliveries, matched as app/db/queries/webhooks.py record_terminal does.
webhooks AS (
    INSERT INTO webhook_deliveries (delivery_id, tenant_id, endpoint_id, run_id, workflow,
                                    run_status, run_reason, finished_at, state, attempts,
                                    next_attempt_at, fence, created_at, updated_at)
    SELECT gen_random_uuid(), f.tenant_id, e.endpoint_id, f.run_id, f.workflow, f.status,
           f.reason, f.finished_at, 'pending', 0, now(), 0, now(), now()
    FROM finished f JOIN webhook_endpoints e
      ON e.tenant_id = f.tenant_id AND e.events LIKE '%,' || f.status || ',%'
     AND (e.workflow IS NULL OR e.workflow = f.workflow)
)"""
"""The ``webhooks`` CTE of a statement that ends runs: one delivery per matching endpoint
of each row of its ``finished`` CTE (``run_id, tenant_id, workflow, status, reason,
finished_at``). Shared by the completions here and in app/db/group_commit.py."""

_COMPLETE = text(
    f"""WITH finished AS (
    UPDATE runs SET status = :status, reason = :reason, output = :output, error = NULL,
                    lease_owner = NULL, lease_expires_at = NULL, available_at = NULL,
                    blocked_reason = NULL, finished_at = now(), updated_at = now()
    WHERE tenant_id = :tenant_id AND run_id = :run_id AND fence = :fence
      AND status IN ({_LEASED_SQL})
    RETURNING run_id, tenant_id, workflow, status, reason, finished_at
),
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, now(), :event_kind, NULL, NULL, NULL FROM finished
),{WEBHOOKS_CTE}
SELECT count(*) FROM finished"""
).bindparams(
    bindparam("run_id", type_=Uuid()),
    bindparam("tenant_id", type_=String()),
    bindparam("fence", type_=BigInteger()),
    bindparam("status", type_=String()),
    bindparam("reason", type_=String()),
    bindparam("output", type_=Text()),
    bindparam("event_kind", type_=String()),
)


async def complete_run(
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, fence: int, output: str
) -> None:
    """Fence-check, write ``completed`` with ``output`` (JSON text), append ``run_completed``.

    Its webhook deliveries are written by the same statement (app/engine/webhooks.py).

    The same writes as :func:`app.db.queries.runs.finish_run` plus
    :func:`app.db.queries.events.append`, as one statement on an autocommit connection
    (PostgreSQL). Only for a run that holds no concurrency slot and has no parent: those
    also hand the slot on or wake the parent, in the same transaction.

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
    """
    result = await conn.execute(
        _COMPLETE,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "fence": fence,
            "status": RunStatus.COMPLETED.value,
            "reason": "succeeded",
            "output": output,
            "event_kind": EventKind.RUN_COMPLETED.value,
        },
    )
    if result.scalar_one() != 1:
        raise LeaseLost(run_id)


_DONE_COMPLETE = text(
    f"""WITH finished AS (
    UPDATE runs SET status = :status, reason = :reason, output = :run_output, error = NULL,
                    lease_owner = NULL, lease_expires_at = NULL, available_at = NULL,
                    blocked_reason = NULL, finished_at = now(), updated_at = now(),
                    lost_claims = 0
    WHERE tenant_id = :tenant_id AND run_id = :run_id AND fence = :fence
      AND status IN ({_LEASED_SQL})
    RETURNING run_id, tenant_id, workflow, status, reason, finished_at
),
journal AS (
{WHOLE_ATTEMPT_INSERT}
    SELECT run_id, :step_id, tenant_id, :seq, :kind, :name, :step_status, :attempt,
           :max_attempts, :output, :fence, NULL, :detail, now(),
           LEAST(CAST(:started_at AS timestamptz), now()), now()
    FROM finished
{WHOLE_ATTEMPT_CONFLICT}
    RETURNING run_id, tenant_id
),
-- The three events from one INSERT, in timeline order (see _DONE).
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, e.at, e.kind, e.step_id, NULL, e.data
    FROM journal CROSS JOIN (VALUES
        (1, LEAST(CAST(:started_at AS timestamptz), now()), CAST(:started_kind AS varchar),
         CAST(:step_id AS varchar), CAST(:started_data AS text)),
        (2, now(), CAST(:event_kind AS varchar), CAST(:step_id AS varchar),
         CAST(:event_data AS text)),
        (3, now(), CAST(:run_event_kind AS varchar), CAST(NULL AS varchar),
         CAST(NULL AS text))
    ) AS e (n, at, kind, step_id, data)
    ORDER BY e.n
),{WEBHOOKS_CTE}
SELECT count(*) FROM finished"""
).bindparams(
    bindparam("run_id", type_=Uuid()),
    bindparam("tenant_id", type_=String()),
    bindparam("fence", type_=BigInteger()),
    bindparam("status", type_=String()),
    bindparam("reason", type_=String()),
    bindparam("run_output", type_=Text()),
    bindparam("step_id", type_=String()),
    bindparam("seq", type_=Integer()),
    bindparam("kind", type_=String()),
    bindparam("name", type_=String()),
    bindparam("step_status", type_=String()),
    bindparam("attempt", type_=Integer()),
    bindparam("max_attempts", type_=Integer()),
    bindparam("output", type_=Text()),
    bindparam("detail", type_=Text()),
    bindparam("started_at", type_=UtcDateTime()),
    bindparam("started_kind", type_=String()),
    bindparam("started_data", type_=Text()),
    bindparam("event_kind", type_=String()),
    bindparam("event_data", type_=Text()),
    bindparam("run_event_kind", type_=String()),
)


async def complete_with_step(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    step_id: str,
    seq: int,
    kind: str,
    name: str,
    attempt: int,
    max_attempts: int,
    detail: str | None,
    output: str,
    started_at: datetime,
    started_data: str,
    event_data: str,
    run_output: str,
) -> bool:
    """Fence-check, journal a run's last step (a whole quick attempt) and its completion.

    :func:`step_done` and :func:`complete_run` as one statement: the ``steps`` row
    ``succeeded`` with ``output``, then ``step_started``, ``step_succeeded`` and
    ``run_completed`` in that order, the run ``completed`` with ``run_output`` (JSON
    text) and its webhook deliveries. The write of a one-step run's only commit after
    its claim: the step's result was held while the workflow ran on to its end
    (docs/adr/0047-held-step-results.md). Only for a run with no concurrency slot and no
    parent (as :func:`complete_run`). Run on an autocommit connection (PostgreSQL).

    Returns:
        False (the run has ended: there is no pause to report).

    Raises:
        LeaseLost: the fence moved (or ``tenant_id`` is not the run's); nothing was
            written.
    """
    result = await conn.execute(
        _DONE_COMPLETE,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "fence": fence,
            "status": RunStatus.COMPLETED.value,
            "reason": "succeeded",
            "run_output": run_output,
            "step_id": step_id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "step_status": StepStatus.SUCCEEDED.value,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "output": output,
            "detail": detail,
            "started_at": started_at,
            "started_kind": EventKind.STEP_STARTED.value,
            "started_data": started_data,
            "event_kind": EventKind.STEP_SUCCEEDED.value,
            "event_data": event_data,
            "run_event_kind": EventKind.RUN_COMPLETED.value,
        },
    )
    if result.scalar_one() != 1:
        raise LeaseLost(run_id)
    return False
