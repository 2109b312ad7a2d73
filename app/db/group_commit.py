"""Group commit: one process's single-statement checkpoints of many runs, in one statement.

The executor's plain writes on PostgreSQL (a step's start and result, a run's bare
completion) are each one self-fencing statement in autocommit
(app/db/queries/checkpoints.py): one round trip, one commit, one WAL flush per write.
Runs executing side by side in one worker issue such writes within microseconds of each
other; here they are collected for up to ``TREADLE_GROUP_COMMIT_WINDOW_MS`` (or until
``TREADLE_GROUP_COMMIT_MAX_ROWS`` wait) and sent as ONE statement per :class:`BatchKind`:
the rows travel as parallel arrays (``unnest``), the run rows are locked in ``run_id``
order (``FOR UPDATE`` above a sort, so two batches never lock in opposite orders) and
each row's fence is checked on its own. Each row carries its run's tenant, and every
table is matched on ``(tenant_id, run_id)``: the rows' tenants name the shards the
statement touches on a database distributed by tenant (docs/adr/0034-tenant-leading-keys.md).
The statement returns the ``(run_id, fence, paused)``
rows that held: those callers succeed, and learn whether an operator has paused their
run (docs/adr/0044-pause-news.md); every other caller gets ``LeaseLost`` and its rows
are not written; a stale fence never fails the batch (docs/adr/0039-group-commit.md).

A caller's ``await`` returns only after the statement that carried its row committed.

When the batch statement fails, no caller is failed for another's sake: a conflict is
retried as every statement is (``TREADLE_DB_RETRY_ATTEMPTS``); anything else makes the
batch's rows run again one by one (their single statements), so each caller gets its own
outcome. The exception is a fault whose commit is in doubt (``unavailable``: the
connection went away): each caller gets that fault, exactly as a single statement that
met it would, and the journal turns it into ``CheckpointFault`` (the run is given back).

To add a kind: one batched SQL over ``unnest`` of its columns returning ``run_id, fence,
paused`` of the rows whose fence held, its columns (name and PostgreSQL array type), its constant
parameters, and its single form (:class:`BatchKind`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import metrics
from app.core.errors import LeaseLost
from app.core.status import EventKind, RunStatus, StepStatus
from app.db.faults import DbFault, classify
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries.runs import LEASED_STATUSES
from app.db.raw import RawStatement

if TYPE_CHECKING:
    from app.db.database import Database

Single = Callable[..., Awaitable[bool | None]]
"""A kind's one-row form: ``single(conn, **params)``, raising ``LeaseLost`` if the fence moved.

It returns the run's pause news (True: paused) where the form reads it, else None."""


@dataclass(frozen=True)
class BatchKind:
    """One kind of groupable write: its multi-row statement and its one-row form.

    Attributes:
        name: the metric label and log name (``start_attempt``, ``record_success``, …).
        batch: the multi-row statement. Each column is bound as one array parameter of
            its name, and every name in ``constants`` as a scalar; it must fence every row
            on its own and return ``run_id, fence, paused`` of the rows whose fence held
            (``paused``: the run's ``paused_at IS NOT NULL`` under its row lock, or FALSE
            for a kind that ends the run).
        columns: ``(parameter name, PostgreSQL array type)`` per column, e.g.
            ``("run_id", "uuid[]")``; every submission's params carry these names.
        constants: scalar parameters of ``batch`` the same for every row (statuses,
            event kinds).
        single: the one-row form (app/db/queries/checkpoints.py), for a batch of one
            row and for the fall-back after a failed batch.
    """

    name: str
    batch: TextClause
    columns: tuple[tuple[str, str], ...]
    single: Single
    constants: Mapping[str, Any] = field(default_factory=dict)
    raw: RawStatement = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Compiled once, here: the batch runs on asyncpg directly (app/db/raw.py).
        object.__setattr__(self, "raw", RawStatement.of(self.batch))


def _kind_sql(columns: tuple[tuple[str, str], ...], body: str) -> TextClause:
    """``body`` with ``{prelude}`` replaced by two CTEs every kind starts with.

    ``{webhooks}``, if present, becomes the ``webhooks`` CTE of a kind that ends runs
    (:data:`app.db.queries.checkpoints.WEBHOOKS_CTE`, over its ``finished`` CTE);
    ``{whole_insert}`` and ``{whole_conflict}`` the column list and conflict clause of a
    whole attempt's ``steps`` row (``WHOLE_ATTEMPT_INSERT``, ``WHOLE_ATTEMPT_CONFLICT``).

    ``input`` is the unnested rows (one column per ``columns`` entry). ``locked`` is the
    run rows whose ``(tenant_id, run_id, fence)`` is among the input's and whose status
    is still leased, locked in ``run_id`` order; ``FOR UPDATE`` re-checks the condition on the
    newest row version (READ COMMITTED), as the single forms' ``UPDATE`` does. ``body``
    joins its writes to ``locked`` (or to a CTE built on it) and ends with ``SELECT
    run_id, fence`` of the rows that held.
    """
    casts = ", ".join(f"CAST(:{n} AS {t})" for n, t in columns)
    names = ", ".join(n for n, _ in columns)
    leased = ", ".join(f"'{s.value}'" for s in LEASED_STATUSES)
    prelude = f"""input AS (
    SELECT * FROM unnest({casts}) AS i({names})
),
locked AS (
    SELECT r.run_id, r.tenant_id, r.fence FROM runs r
    WHERE (r.tenant_id, r.run_id, r.fence) IN (SELECT tenant_id, run_id, fence FROM input)
      AND r.status IN ({leased})
    ORDER BY r.run_id
    FOR UPDATE
)"""
    return text(
        body.replace("{prelude}", prelude)
        .replace("{webhooks}", checkpoints_q.WEBHOOKS_CTE)
        .replace("{whole_insert}", checkpoints_q.WHOLE_ATTEMPT_INSERT)
        .replace("{whole_conflict}", checkpoints_q.WHOLE_ATTEMPT_CONFLICT)
    )


_START_COLUMNS = (
    ("run_id", "uuid[]"),
    ("tenant_id", "text[]"),
    ("fence", "bigint[]"),
    ("step_id", "text[]"),
    ("seq", "int[]"),
    ("kind", "text[]"),
    ("name", "text[]"),
    ("attempt", "int[]"),
    ("max_attempts", "int[]"),
    ("detail", "text[]"),
    ("started_at", "timestamptz[]"),
    ("event_data", "text[]"),
)

START_ATTEMPT = BatchKind(
    name="start_attempt",
    columns=_START_COLUMNS,
    batch=_kind_sql(
        _START_COLUMNS,
        """WITH {prelude},
held AS (
    UPDATE runs SET updated_at = now(), lost_claims = 0 FROM locked
    WHERE runs.tenant_id = locked.tenant_id AND runs.run_id = locked.run_id
    RETURNING locked.run_id, locked.tenant_id, locked.fence,
              runs.paused_at IS NOT NULL AS paused
),
rows AS (
    SELECT i.* FROM input i
    JOIN held h ON h.tenant_id = i.tenant_id AND h.run_id = i.run_id AND h.fence = i.fence
),
journal AS (
    INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt,
                       max_attempts, fence, next_attempt_at, detail, created_at, started_at)
    SELECT run_id, step_id, tenant_id, seq, kind, name, :status, attempt,
           max_attempts, fence, NULL, detail, now(), LEAST(started_at, now())
    FROM rows
    ON CONFLICT (tenant_id, run_id, step_id) DO UPDATE SET
        status = excluded.status, attempt = excluded.attempt,
        started_at = excluded.started_at, finished_at = NULL, fence = excluded.fence,
        next_attempt_at = NULL, error = NULL, detail = excluded.detail
    RETURNING run_id
),
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, LEAST(started_at, now()), :event_kind, step_id, NULL,
           event_data
    FROM rows
)
SELECT run_id, fence, paused FROM held""",
    ),
    single=checkpoints_q.start_attempt,
    constants={"status": StepStatus.RUNNING.value, "event_kind": EventKind.STEP_STARTED.value},
)
"""A step attempt's start (:func:`app.db.queries.checkpoints.start_attempt`, row by row)."""

_SUCCESS_COLUMNS = (
    ("run_id", "uuid[]"),
    ("tenant_id", "text[]"),
    ("fence", "bigint[]"),
    ("step_id", "text[]"),
    ("output", "text[]"),
    ("event_data", "text[]"),
)

RECORD_SUCCESS = BatchKind(
    name="record_success",
    columns=_SUCCESS_COLUMNS,
    batch=_kind_sql(
        _SUCCESS_COLUMNS,
        """WITH {prelude},
held AS (
    UPDATE runs SET updated_at = now(), lost_claims = 0 FROM locked
    WHERE runs.tenant_id = locked.tenant_id AND runs.run_id = locked.run_id
    RETURNING locked.run_id, locked.tenant_id, locked.fence,
              runs.paused_at IS NOT NULL AS paused
),
rows AS (
    SELECT i.* FROM input i
    JOIN held h ON h.tenant_id = i.tenant_id AND h.run_id = i.run_id AND h.fence = i.fence
),
journal AS (
    UPDATE steps SET status = :status, output = rows.output, error = NULL,
                     fence = rows.fence, finished_at = now(), next_attempt_at = NULL
    FROM rows
    WHERE steps.tenant_id = rows.tenant_id AND steps.run_id = rows.run_id
      AND steps.step_id = rows.step_id
    RETURNING rows.run_id, rows.tenant_id, rows.step_id, rows.event_data
),
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, now(), :event_kind, step_id, NULL, event_data FROM journal
)
SELECT run_id, fence, paused FROM held""",
    ),
    single=checkpoints_q.record_success,
    constants={
        "status": StepStatus.SUCCEEDED.value,
        "event_kind": EventKind.STEP_SUCCEEDED.value,
    },
)
"""A step's result (:func:`app.db.queries.checkpoints.record_success`, row by row)."""

_DONE_COLUMNS = (
    ("run_id", "uuid[]"),
    ("tenant_id", "text[]"),
    ("fence", "bigint[]"),
    ("step_id", "text[]"),
    ("seq", "int[]"),
    ("kind", "text[]"),
    ("name", "text[]"),
    ("attempt", "int[]"),
    ("max_attempts", "int[]"),
    ("detail", "text[]"),
    ("output", "text[]"),
    ("started_at", "timestamptz[]"),
    ("started_data", "text[]"),
    ("event_data", "text[]"),
)

STEP_DONE = BatchKind(
    name="step_done",
    columns=_DONE_COLUMNS,
    batch=_kind_sql(
        _DONE_COLUMNS,
        """WITH {prelude},
held AS (
    UPDATE runs SET updated_at = now(), lost_claims = 0 FROM locked
    WHERE runs.tenant_id = locked.tenant_id AND runs.run_id = locked.run_id
    RETURNING locked.run_id, locked.tenant_id, locked.fence,
              runs.paused_at IS NOT NULL AS paused
),
rows AS (
    SELECT i.*, LEAST(i.started_at, now()) AS began
    FROM input i
    JOIN held h ON h.tenant_id = i.tenant_id AND h.run_id = i.run_id AND h.fence = i.fence
),
journal AS (
{whole_insert}
    SELECT run_id, step_id, tenant_id, seq, kind, name, :status, attempt,
           max_attempts, output, fence, NULL, detail, now(), began, now()
    FROM rows
{whole_conflict}
    RETURNING run_id
),
-- Each row's two events from one INSERT, in timeline order (see checkpoints.step_done).
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT r.run_id, r.tenant_id, e.at, e.kind, r.step_id, NULL, e.data
    FROM rows r CROSS JOIN LATERAL (VALUES
        (1, r.began, CAST(:started_kind AS varchar), r.started_data),
        (2, now(), CAST(:event_kind AS varchar), r.event_data)
    ) AS e (n, at, kind, data)
    ORDER BY r.run_id, r.step_id, e.n
)
SELECT run_id, fence, paused FROM held""",
    ),
    single=checkpoints_q.step_done,
    constants={
        "status": StepStatus.SUCCEEDED.value,
        "started_kind": EventKind.STEP_STARTED.value,
        "event_kind": EventKind.STEP_SUCCEEDED.value,
    },
)
"""A whole quick attempt, start and result (:func:`app.db.queries.checkpoints.step_done`,
row by row; docs/adr/0040-one-commit-per-step.md)."""

_COMPLETE_COLUMNS = (
    ("run_id", "uuid[]"),
    ("tenant_id", "text[]"),
    ("fence", "bigint[]"),
    ("output", "text[]"),
)

COMPLETE_RUN = BatchKind(
    name="complete_run",
    columns=_COMPLETE_COLUMNS,
    batch=_kind_sql(
        _COMPLETE_COLUMNS,
        """WITH {prelude},
finished AS (
    UPDATE runs SET status = :status, reason = :reason, output = i.output, error = NULL,
                    lease_owner = NULL, lease_expires_at = NULL, available_at = NULL,
                    blocked_reason = NULL, finished_at = now(), updated_at = now()
    FROM locked l
    JOIN input i ON i.tenant_id = l.tenant_id AND i.run_id = l.run_id AND i.fence = l.fence
    WHERE runs.tenant_id = l.tenant_id AND runs.run_id = l.run_id
    RETURNING runs.run_id, runs.tenant_id, runs.workflow, runs.status, runs.reason,
              runs.finished_at, l.fence
),
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, now(), :event_kind, NULL, NULL, NULL FROM finished
),{webhooks}
SELECT run_id, fence, FALSE FROM finished""",
    ),
    single=checkpoints_q.complete_run,
    constants={
        "status": RunStatus.COMPLETED.value,
        "reason": "succeeded",
        "event_kind": EventKind.RUN_COMPLETED.value,
    },
)
"""A run's bare completion (:func:`app.db.queries.checkpoints.complete_run`, row by row)."""

_DONE_COMPLETE_COLUMNS = (*_DONE_COLUMNS, ("run_output", "text[]"))

COMPLETE_WITH_STEP = BatchKind(
    name="complete_with_step",
    columns=_DONE_COMPLETE_COLUMNS,
    batch=_kind_sql(
        _DONE_COMPLETE_COLUMNS,
        """WITH {prelude},
finished AS (
    UPDATE runs SET status = :status, reason = :reason, output = i.run_output, error = NULL,
                    lease_owner = NULL, lease_expires_at = NULL, available_at = NULL,
                    blocked_reason = NULL, finished_at = now(), updated_at = now(),
                    lost_claims = 0
    FROM locked l
    JOIN input i ON i.tenant_id = l.tenant_id AND i.run_id = l.run_id AND i.fence = l.fence
    WHERE runs.tenant_id = l.tenant_id AND runs.run_id = l.run_id
    RETURNING runs.run_id, runs.tenant_id, runs.workflow, runs.status, runs.reason,
              runs.finished_at, l.fence
),
rows AS (
    SELECT i.*, LEAST(i.started_at, now()) AS began
    FROM input i
    JOIN finished f ON f.tenant_id = i.tenant_id AND f.run_id = i.run_id AND f.fence = i.fence
),
journal AS (
{whole_insert}
    SELECT run_id, step_id, tenant_id, seq, kind, name, :step_status, attempt,
           max_attempts, output, fence, NULL, detail, now(), began, now()
    FROM rows
{whole_conflict}
    RETURNING run_id
),
-- Each row's three events from one INSERT, in timeline order (see checkpoints.step_done).
timeline AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT r.run_id, r.tenant_id, e.at, e.kind, e.step_id, NULL, e.data
    FROM rows r CROSS JOIN LATERAL (VALUES
        (1, r.began, CAST(:started_kind AS varchar), r.step_id, r.started_data),
        (2, now(), CAST(:event_kind AS varchar), r.step_id, r.event_data),
        (3, now(), CAST(:run_event_kind AS varchar), CAST(NULL AS text), CAST(NULL AS text))
    ) AS e (n, at, kind, step_id, data)
    ORDER BY r.run_id, e.n
),{webhooks}
SELECT run_id, fence, FALSE FROM finished""",
    ),
    single=checkpoints_q.complete_with_step,
    constants={
        "status": RunStatus.COMPLETED.value,
        "reason": "succeeded",
        "step_status": StepStatus.SUCCEEDED.value,
        "started_kind": EventKind.STEP_STARTED.value,
        "event_kind": EventKind.STEP_SUCCEEDED.value,
        "run_event_kind": EventKind.RUN_COMPLETED.value,
    },
)
"""A run's last step (a whole quick attempt) and its bare completion
(:func:`app.db.queries.checkpoints.complete_with_step`, row by row;
docs/adr/0047-held-step-results.md)."""


@dataclass(frozen=True)
class Grouped:
    """One write handed to the group committer: its kind and its row's parameters.

    ``params`` holds every name of ``kind.columns`` (``run_id``, ``tenant_id`` and ``fence``
    among them)
    and is also the keyword arguments of ``kind.single``.
    """

    kind: BatchKind
    params: Mapping[str, Any]

    async def commit(self, db: Database) -> bool:
        """Submit to ``db``'s committer and wait until the row is committed.

        Returns:
            Whether an operator has paused the run, as of the statement's row lock.

        Raises:
            LeaseLost: this row's fence moved; nothing of it was written.
            Whatever the statement that carried it raised (a classified fault).
        """
        return await committer(db).submit(self.kind, self.params)


@dataclass
class _Pending:
    kind: BatchKind
    params: Mapping[str, Any]
    future: asyncio.Future[bool]


RunAutocommit = Callable[..., Awaitable[Any]]
"""``Database.autocommit_retrying``: ``run(fn, what=…)`` with the conflict retries."""


class GroupCommitter:
    """Collects one process's groupable writes and commits them a batch at a time.

    Args:
        run: runs ``fn(conn)`` on an autocommit connection with the conflict retries
            (:meth:`app.db.database.Database.autocommit_retrying`).
        window_seconds: how long the first row of a batch waits for company while
            another batch is in flight (``TREADLE_GROUP_COMMIT_WINDOW_MS`` / 1000); with
            none in flight, or 0, a batch takes only the rows submitted before the event
            loop's next turn.
        max_rows: a batch is sent at once when this many rows wait
            (``TREADLE_GROUP_COMMIT_MAX_ROWS``).

    Attributes:
        batches: batches sent so far; rows: rows in them; largest: the most rows one
            batch of one kind carried (for tests and benchmarks).
        fallbacks: batch statements that failed and were re-run row by row.
    """

    def __init__(self, run: RunAutocommit, *, window_seconds: float, max_rows: int) -> None:
        self._run = run
        self._window = window_seconds
        self._max_rows = max_rows
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.rows = 0
        self.largest = 0
        self.fallbacks = 0

    async def submit(self, kind: BatchKind, params: Mapping[str, Any]) -> bool:
        """Queue one row and wait until the statement carrying it has committed.

        Returns:
            The row's pause news (:class:`BatchKind`).

        Raises:
            LeaseLost: this row's fence moved; nothing of it was written.
            Whatever the statement that carried it raised (a classified fault).
        """
        loop = asyncio.get_running_loop()
        pending = _Pending(kind, params, loop.create_future())
        self._pending.append(pending)
        if len(self._pending) >= self._max_rows:
            self._flush()
        elif self._timer is None:
            # The window is paid only when there is company to wait for: while a batch is
            # in flight other runs are checkpointing, and their next rows are due within
            # it. Otherwise (one run at a time, an idle worker) the row goes on the event
            # loop's next turn, with whatever was submitted in this one; PostgreSQL's
            # commit_delay waits only with commit_siblings for the same reason.
            self._timer = (
                loop.call_later(self._window, self._flush)
                if self._window > 0 and self._inflight
                else loop.call_soon(self._flush)
            )
        return await pending.future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        by_kind: dict[str, list[_Pending]] = {}
        for p in batch:
            by_kind.setdefault(p.kind.name, []).append(p)
        for rows in by_kind.values():
            task = asyncio.get_running_loop().create_task(self._commit(rows))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _commit(self, rows: Sequence[_Pending]) -> None:
        kind = rows[0].kind
        self.batches += 1
        self.rows += len(rows)
        self.largest = max(self.largest, len(rows))
        metrics.GROUP_COMMIT_ROWS.labels(kind.name).observe(len(rows))
        try:
            if len(rows) == 1:
                await self._one(rows[0])
                return
            try:
                held = await self._run(lambda conn: self._many(conn, kind, rows), what=kind.name)
            except Exception as exc:  # noqa: BLE001 - each row is re-run for its own outcome
                if classify(exc) == DbFault.UNAVAILABLE:
                    # The statement may have committed before the connection went: running
                    # its rows again could write them twice. Every caller meets the fault a
                    # single statement would have met.
                    for p in rows:
                        _settle(p, exc)
                    return
                # Row by row, one after another: a failed batch is rare, and 64 rows at
                # once would empty the pool the other runs' writes need.
                self.fallbacks += 1
                for p in rows:
                    await self._one(p)
                return
            for p in rows:
                key = (str(p.params["run_id"]), int(p.params["fence"]))
                paused = held.get(key)
                if paused is None:
                    _settle(p, LeaseLost(p.params["run_id"]))
                else:
                    _settle(p, None, paused=paused)
        except BaseException as exc:
            # Never leave a caller waiting (a cancelled flush, a bug): it gets the error.
            for p in rows:
                _settle(p, exc)
            raise

    async def _one(self, p: _Pending) -> None:
        async def single(conn: AsyncConnection) -> bool | None:
            return await p.kind.single(conn, **p.params)

        try:
            paused = await self._run(single, what=p.kind.name)
        except BaseException as exc:  # LeaseLost is a BaseException
            _settle(p, exc)
            if not isinstance(exc, (Exception, LeaseLost)):
                raise
            return
        _settle(p, None, paused=bool(paused))

    @staticmethod
    async def _many(
        conn: AsyncConnection, kind: BatchKind, rows: Sequence[_Pending]
    ) -> dict[tuple[str, int], bool]:
        params: dict[str, Any] = dict(kind.constants)
        for name, _ in kind.columns:
            params[name] = [p.params[name] for p in rows]
        held = await kind.raw.fetch(conn, params)
        # Keys as text: the driver's UUID type and uuid.UUID need not compare equal.
        return {(str(r[0]), int(r[1])): bool(r[2]) for r in held}

    async def drain(self) -> None:
        """Send what waits and wait for every batch in flight (shutdown, tests)."""
        self._flush()
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)


def _settle(p: _Pending, exc: BaseException | None, *, paused: bool = False) -> None:
    if p.future.done():  # the caller was cancelled, or this row was settled already
        return
    if exc is None:
        p.future.set_result(paused)
    else:
        p.future.set_exception(exc)


def enabled(db: Database) -> bool:
    """True when ``db`` groups its checkpoints: PostgreSQL, window not negative."""
    return db.dialect == "postgresql" and db.settings.group_commit_window_ms >= 0


def committer(db: Database) -> GroupCommitter:
    """``db``'s one committer (made on first use; one per Database, so one per process)."""
    found: GroupCommitter | None = getattr(db, "_group_committer", None)
    if found is None:
        found = GroupCommitter(
            db.autocommit_retrying,
            window_seconds=db.settings.group_commit_window_ms / 1000.0,
            max_rows=db.settings.group_commit_max_rows,
        )
        db._group_committer = found  # type: ignore[attr-defined]
    return found
