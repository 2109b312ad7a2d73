"""Queries on ``runs``: submit, read, list, claim, heartbeat, fenced finish, cancel."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    RowMapping,
    Text,
    Uuid,
    all_,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import ConcurrencyKeyBusy, LeaseLost, RunArchived, RunNotFound
from app.core.status import TERMINAL_RUN_STATUSES, EventKind, RunStatus
from app.db.dialect import now_expr, now_plus
from app.db.queries.api_keys import run_api_key_revoked
from app.db.queries.tenants import run_tenant_suspended
from app.db.tables import events, runs, runs_archive
from app.db.types import UtcDateTime

# Statuses a worker may claim once ``available_at`` has passed. ``running`` is here on
# purpose: a running run's ``available_at`` is its lease expiry, so the same claim query
# recovers runs whose worker died.
# Statuses under which a worker holds the lease: every fenced write requires one of them.
LEASED_STATUSES = (RunStatus.RUNNING, RunStatus.CANCELLING, RunStatus.COMPENSATING)
_LEASED = [s.value for s in LEASED_STATUSES]

CLAIMABLE_STATUSES = (
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.CANCELLING,
    RunStatus.COMPENSATING,
    RunStatus.RETRYING,
    RunStatus.WAITING_TIMER,
    RunStatus.WAITING_SIGNAL,
    RunStatus.WAITING_APPROVAL,
    RunStatus.WAITING_CHILD,
    RunStatus.WAITING_EVENT,
)
WAITING_STATUSES = (
    RunStatus.RETRYING,
    RunStatus.WAITING_TIMER,
    RunStatus.WAITING_SIGNAL,
    RunStatus.WAITING_APPROVAL,
    RunStatus.WAITING_CHILD,
    RunStatus.WAITING_EVENT,
)


def _held(run_id: uuid.UUID, fence: int, tenant_id: str) -> Any:
    # The predicate of every write a lease holder makes: our fence, and a status under
    # which a worker holds the lease. Zero rows matched means the lease is lost. The
    # run's tenant narrows nothing (run ids are globally unique) but routes the statement
    # to one shard on a database distributed by tenant (docs/adr/0034-tenant-leading-keys.md).
    return and_(
        runs.c.tenant_id == tenant_id,
        runs.c.run_id == run_id,
        runs.c.fence == fence,
        runs.c.status.in_(_LEASED),
    )


def _dialect(conn: AsyncConnection) -> str:
    return conn.dialect.name


async def insert_run(
    conn: AsyncConnection, values: dict[str, Any], *, wait_for_slot: bool = False
) -> RowMapping | None:
    """Insert a run unless ``(tenant_id, idempotency_key)`` already exists.

    ``created_at``/``updated_at``/``available_at`` are set from the database clock
    (``available_at`` = now + ``values["delay"]`` seconds, if given). A keyed run comes
    with the ``concurrency_slot`` its caller chose under the key's lock
    (app/engine/slots.py); the unique index ``uq_runs_active_concurrency_slot`` refuses a
    slot another active run holds. ``wait_for_slot``: the run waits for a slot instead
    (no slot, ``available_at`` NULL, the requested start kept in ``not_before``).

    Returns:
        The inserted row, or None when an idempotency-key twin exists (the caller then
        reads it with :func:`get_by_idempotency_key`). Uses ``ON CONFLICT DO NOTHING`` so
        concurrent identical submissions never raise.

    Raises:
        ConcurrencyKeyBusy: the slot is held by another active run: only a writer that
            decided without the key's lock can cause this.
    """
    dialect = _dialect(conn)
    now = now_expr(dialect)
    row = {**values, "created_at": now, "updated_at": now, "available_at": now}
    delay = row.pop("delay", None)
    start = now_plus(dialect, float(delay)) if delay else now
    if wait_for_slot:
        row.update(available_at=None, concurrency_slot=None, not_before=start if delay else None)
    else:
        row["available_at"] = start
    stmt: Any
    if dialect == "postgresql":
        stmt = postgresql.insert(runs).values(row)
    else:
        stmt = sqlite.insert(runs).values(row)
    stmt = stmt.on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"]).returning(
        *runs.c
    )
    if row.get("concurrency_slot") is None:
        return (await conn.execute(stmt)).mappings().first()
    # The slot index is not the ON CONFLICT arbiter, so a taken slot raises; the savepoint
    # keeps the caller's transaction usable (PostgreSQL aborts it on any error otherwise).
    try:
        async with conn.begin_nested():
            return (await conn.execute(stmt)).mappings().first()
    except IntegrityError as exc:
        if not is_concurrency_key_violation(exc):
            raise
    key = values["concurrency_key"]
    raise ConcurrencyKeyBusy(
        f"concurrency key {key!r} of workflow {values['workflow']!r} is busy; retry the request",
        concurrency_key=key,
    )


def is_concurrency_key_violation(exc: IntegrityError) -> bool:
    """True when ``exc`` violates the active-slot index ``uq_runs_active_concurrency_slot``.

    PostgreSQL names the index in the message; SQLite names its columns instead.
    """
    message = str(exc.orig)
    return "uq_runs_active_concurrency_slot" in message or (
        "runs.concurrency_key, runs.concurrency_slot" in message
    )


async def get_by_idempotency_key(
    conn: AsyncConnection, tenant_id: str, key: str
) -> RowMapping | None:
    """Return the tenant's run submitted with this idempotency key, if any."""
    result = await conn.execute(
        select(runs).where(runs.c.tenant_id == tenant_id, runs.c.idempotency_key == key)
    )
    return result.mappings().first()


def visible_to(owner: str | None) -> Any:
    """SQL condition: the run's access policy lets ``owner`` see it.

    ``access='owner'`` runs are visible only to the subject that submitted them; None
    (engine-internal reads, admins) ignores the policy.
    """
    if owner is None:
        return true()
    return or_(runs.c.access == "tenant", runs.c.created_by == owner)


async def get_run(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID, *, owner: str | None = None
) -> RowMapping:
    """Return one run of this tenant (and, with ``owner``, visible to that subject).

    Raises:
        RunNotFound: no such run *for this tenant*: another tenant's id, or another
            subject's owner-policy run, is indistinguishable from a missing one.
    """
    result = await conn.execute(
        select(runs).where(
            runs.c.run_id == run_id, runs.c.tenant_id == tenant_id, visible_to(owner)
        )
    )
    row = result.mappings().first()
    if row is None:
        archived = (
            (
                await conn.execute(
                    select(
                        runs_archive.c.status,
                        runs_archive.c.reason,
                        runs_archive.c.finished_at,
                        runs_archive.c.archived_at,
                    ).where(runs_archive.c.run_id == run_id, runs_archive.c.tenant_id == tenant_id)
                )
            )
            .mappings()
            .first()
        )
        if archived is not None:
            raise RunArchived(
                f"run {run_id} was archived by maintenance at "
                f"{archived['archived_at'].isoformat()}; only its summary is kept",
                run_id=str(run_id),
                run_status=archived["status"],
                reason=archived["reason"],
                finished_at=archived["finished_at"].isoformat()
                if archived["finished_at"]
                else None,
                archived_at=archived["archived_at"].isoformat(),
            )
        raise RunNotFound(f"run {run_id} not found", run_id=str(run_id))
    return row


async def get_run_any_tenant(conn: AsyncConnection, run_id: uuid.UUID) -> RowMapping | None:
    """Return a run regardless of tenant (engine-internal use only; never from routes)."""
    result = await conn.execute(select(runs).where(runs.c.run_id == run_id))
    return result.mappings().first()


def _claimable(definition_keys: Sequence[tuple[str, str]], dialect: str) -> list[Any]:
    """WHERE clauses of a due, claimable run of the given (workflow, version) pairs.

    Binds ``b_executing`` (:func:`executing_param`): the runs the claiming worker is still
    executing are never claimable by it, even when their lease has expired. A worker that
    was paused past its lease (GC pause, VM freeze, SIGSTOP) would otherwise claim its own
    runs again on resuming and run their steps a second time beside the first execution,
    each pass recorded as an attempt interrupted by a lost worker (docs/guarantees.md).
    """
    return [
        runs.c.available_at.is_not(None),
        runs.c.available_at <= now_expr(dialect),
        runs.c.status.in_([s.value for s in CLAIMABLE_STATUSES]),
        # A paused run is never claimed; its due time is kept, so whatever fell due
        # meanwhile (a timer, a retry, a signal) is claimed on unpause (ADR 0021).
        runs.c.paused_at.is_(None),
        tuple_(runs.c.workflow, runs.c.version).in_(list(definition_keys)),
        _not_executing(dialect),
    ]


def _not_executing(dialect: str) -> Any:
    if dialect == "postgresql":
        # One array parameter: the statement text (and asyncpg's prepared statement)
        # stays the same whatever the number of runs in flight; ``<> ALL('{}')`` is true.
        return runs.c.run_id != all_(bindparam("b_executing", type_=postgresql.ARRAY(Uuid())))
    return runs.c.run_id.not_in(bindparam("b_executing", expanding=True))


def executing_param(executing: Sequence[uuid.UUID]) -> dict[str, list[uuid.UUID]]:
    """The bound parameters of a claim statement: ``executing``, the claimer's runs in flight."""
    return {"b_executing": list(executing)}


def _claim_order() -> tuple[Any, Any]:
    # Matches ix_runs_claimable (priority DESC, available_at): an ordered index walk that
    # stops after LIMIT rows, never a sort of every due run.
    return (runs.c.priority.desc(), runs.c.available_at)


def _lease(dialect: str, worker_id: str, lease_ttl: float) -> dict[str, Any]:
    """The SET clause of a claim (fence and attempt bumped, lease taken)."""
    now = now_expr(dialect)
    lease_until = now_plus(dialect, lease_ttl)
    return {
        # A run being cancelled or compensated stays so: the claimer finishes that job.
        "status": case(
            (
                runs.c.status.in_([RunStatus.CANCELLING.value, RunStatus.COMPENSATING.value]),
                runs.c.status,
            ),
            else_=RunStatus.RUNNING.value,
        ),
        "fence": runs.c.fence + 1,
        "attempt": runs.c.attempt + 1,
        # A lease still owned at claim time expired under a worker that never gave the
        # run back (killed, crashed, cut off): one more lost claim (ADR 0040).
        "lost_claims": case(
            (runs.c.lease_owner.is_not(None), runs.c.lost_claims + 1),
            else_=runs.c.lost_claims,
        ),
        "lease_owner": worker_id,
        "lease_expires_at": lease_until,
        "available_at": lease_until,
        "started_at": func.coalesce(runs.c.started_at, now),
        "updated_at": now,
        "waiting_kind": None,
        "waiting_name": None,
        "waiting_deadline": None,
    }


async def claim_runs(
    conn: AsyncConnection,
    *,
    worker_id: str,
    definition_keys: Sequence[tuple[str, str]],
    limit: int,
    lease_ttl: float,
    with_events: bool = False,
    executing: Sequence[uuid.UUID] = (),
) -> Sequence[RowMapping]:
    """Lease up to ``limit`` due runs of the given (workflow, version) pairs.

    Why this shape: the CTE picks due rows in (``priority`` DESC, ``available_at``) order
    through the partial index ``ix_runs_claimable``; on PostgreSQL ``FOR UPDATE SKIP
    LOCKED`` lets many workers claim concurrently without blocking on each other's rows (on
    SQLite the write lock taken by ``BEGIN IMMEDIATE`` makes the statement atomic). Each
    claim bumps the fence so any previous holder's later writes fail, and sets
    ``available_at`` to the lease expiry so that a dead worker's runs come back through
    this same query. Each row carries ``due_at``, when the run became due.

    Each returned row also says whether the attempt it starts may run (DESIGN §4):
    ``tenant_suspended`` and ``api_key_revoked`` (booleans), read by the CTE in the same
    statement, so the per-attempt re-check costs no round trip of its own.

    ``with_events`` (PostgreSQL only) also inserts each claimed run's ``run_claimed``
    event in the same statement (a data-modifying CTE), so that on an autocommit
    connection a claim is a single round trip; otherwise the caller appends them with
    :func:`app.db.queries.events.append_claims`.

    ``executing`` names the runs this worker is still executing: never claimed again by
    it, whatever their lease says (see :func:`_claimable`).
    """
    if not definition_keys or limit <= 0:
        return []
    dialect = _dialect(conn)
    params = executing_param(executing)
    if dialect == "postgresql":
        stmt = _pg_claim_statement(worker_id, tuple(definition_keys), limit, lease_ttl, with_events)
        return (await conn.execute(stmt, params)).mappings().all()
    # SQLite's RETURNING names only the updated table, so read the due rows first;
    # BEGIN IMMEDIATE already holds the write lock, so nothing moves in between.
    picked = (await conn.execute(_due(dialect, definition_keys, limit), params)).mappings().all()
    return await claim_listed_runs(
        conn, worker_id=worker_id, due={row["run_id"]: row for row in picked}, lease_ttl=lease_ttl
    )


def _due(dialect: str, definition_keys: Sequence[tuple[str, str]], limit: int) -> Any:
    return (
        select(runs.c.run_id, *_attempt_checks())
        .where(*_claimable(definition_keys, dialect))
        .order_by(*_claim_order())
        .limit(limit)
    )


@functools.lru_cache(maxsize=256)
def _pg_claim_statement(
    worker_id: str,
    definition_keys: tuple[tuple[str, str], ...],
    limit: int,
    lease_ttl: float,
    with_events: bool,
) -> Any:
    # Built once per (worker, registry, limit): building this CTE statement (column
    # proxies, coercions, cache key) was a tenth of a worker's CPU when rebuilt per claim.
    # A worker's arguments are fixed but for ``limit`` (1..its concurrency), so the cache
    # holds a handful of entries per process; values are bound into the statement.
    due_cte = (
        _due("postgresql", definition_keys, limit)
        .with_for_update(of=runs, skip_locked=True)
        .cte("due")
    )
    stmt = (
        update(runs)
        .where(runs.c.run_id == due_cte.c.run_id)
        .values(**_lease("postgresql", worker_id, lease_ttl))
        # When each run became due (the schedule-to-start metric), and the re-checks.
        .returning(
            *runs.c,
            due_cte.c.due_at,
            due_cte.c.tenant_suspended,
            due_cte.c.api_key_revoked,
        )
    )
    return _with_claim_events(stmt, worker_id) if with_events else stmt


def _attempt_checks() -> list[Any]:
    """Columns every claim reads with its candidates: due time and authorization checks.

    ``due_at`` (when the run became due) and the per-attempt re-checks
    ``tenant_suspended`` and ``api_key_revoked`` (app/db/queries/tenants.py, api_keys.py).
    """
    return [
        runs.c.available_at.label("due_at"),
        run_tenant_suspended().label("tenant_suspended"),
        run_api_key_revoked().label("api_key_revoked"),
    ]


def _with_claim_events(claim: Any, worker_id: str) -> Any:
    """``claim`` (an UPDATE … RETURNING) as a CTE that also inserts ``run_claimed`` events.

    The event rows match :func:`app.db.queries.events.append_claims` (``at`` = the claim's
    ``updated_at``; data ``{worker_id, attempt, fence}``).
    """
    claimed = claim.cte("claimed")
    data = cast(
        func.jsonb_build_object(
            "worker_id", literal(worker_id), "attempt", claimed.c.attempt, "fence", claimed.c.fence
        ),
        Text,
    )
    timeline = insert(events).from_select(
        ["run_id", "tenant_id", "at", "kind", "step_id", "actor", "data"],
        select(
            claimed.c.run_id,
            claimed.c.tenant_id,
            claimed.c.updated_at,
            literal(EventKind.RUN_CLAIMED.value),
            null(),
            null(),
            data,
        ),
    )
    return select(claimed).add_cte(timeline.cte("timeline"))


async def due_candidates(
    conn: AsyncConnection,
    *,
    definition_keys: Sequence[tuple[str, str]],
    limit: int,
    executing: Sequence[uuid.UUID] = (),
) -> Sequence[RowMapping]:
    """Lock and return up to ``limit`` due runs, in claim order, without claiming them.

    For queue-controlled workflows (app/engine/claims.py), which decide per run whether it
    may start. Rows: ``run_id``, ``tenant_id``, ``concurrency_key``, ``started_at``,
    ``due_at``, ``tenant_suspended``, ``api_key_revoked``. PostgreSQL: ``FOR UPDATE SKIP
    LOCKED`` (the caller's transaction holds the rows until it claims or defers them);
    SQLite: the ``BEGIN IMMEDIATE`` write lock.
    """
    if not definition_keys or limit <= 0:
        return []
    dialect = _dialect(conn)
    stmt = (
        select(
            runs.c.run_id,
            runs.c.tenant_id,
            runs.c.concurrency_key,
            runs.c.started_at,
            *_attempt_checks(),
        )
        .where(*_claimable(definition_keys, dialect))
        .order_by(*_claim_order())
        .limit(limit)
    )
    if dialect == "postgresql":
        stmt = stmt.with_for_update(of=runs, skip_locked=True)
    return (await conn.execute(stmt, executing_param(executing))).mappings().all()


async def claim_listed_runs(
    conn: AsyncConnection,
    *,
    worker_id: str,
    due: Mapping[uuid.UUID, Mapping[Any, Any]],
    lease_ttl: float,
    started_at: datetime | None = None,
) -> Sequence[RowMapping]:
    """Lease the runs ``due`` names, already locked by the caller.

    ``due`` maps each run id to its candidate row (:func:`due_candidates`): its
    ``due_at``, ``tenant_suspended`` and ``api_key_revoked`` are added to the claimed row.

    ``started_at`` (UTC) is recorded as a first start's time instead of the statement's
    clock: the instant a rate limit admitted it. (On PostgreSQL both are the transaction's
    ``now()``; SQLite's clock moves between statements of one transaction.)

    Returns the claimed rows as :func:`claim_runs` does.
    """
    if not due:
        return []
    dialect = _dialect(conn)
    values = _lease(dialect, worker_id, lease_ttl)
    if started_at is not None:
        values["started_at"] = func.coalesce(
            runs.c.started_at, type_coerce(started_at, UtcDateTime())
        )
    stmt = update(runs).where(runs.c.run_id.in_(list(due))).values(**values).returning(*runs.c)
    claimed = (await conn.execute(stmt)).mappings().all()
    checks = ("due_at", "tenant_suspended", "api_key_revoked")
    return [
        {**row, **{k: due[row["run_id"]][k] for k in checks}}  # type: ignore[misc]
        for row in claimed
    ]


async def count_leased(conn: AsyncConnection, *, workflow: str) -> int:
    """Runs of ``workflow`` (any version, any tenant) holding a live lease right now.

    What a global ``concurrency_limit`` counts: executing runs, not waiting ones (a run
    waiting on a timer, approval or signal has released its lease). Walks the partial
    index ``ix_runs_lease_owner``, so only leased rows are read.
    """
    dialect = _dialect(conn)
    stmt = select(func.count()).where(
        runs.c.lease_owner.is_not(None),
        runs.c.workflow == workflow,
        runs.c.lease_expires_at > now_expr(dialect),
    )
    return int((await conn.execute(stmt)).scalar_one())


async def defer_runs(
    conn: AsyncConnection, *, run_ids: Sequence[uuid.UUID], until: datetime
) -> None:
    """Make due runs claimable only from ``until`` (UTC): a rate limit delays their start."""
    if run_ids:
        await conn.execute(
            update(runs).where(runs.c.run_id.in_(list(run_ids))).values(available_at=until)
        )


async def renew_leases(
    conn: AsyncConnection, *, worker_id: str, run_ids: Sequence[uuid.UUID], lease_ttl: float
) -> dict[uuid.UUID, int]:
    """Extend the leases of the runs this worker is executing; return ``{run_id: fence}``.

    Why one statement per worker rather than per run: a heartbeat costs one round trip
    whatever the concurrency. Only ``run_ids`` (runs still being executed) are renewed, so
    a run the worker abandoned lets its lease expire. A run missing from the result was
    cancelled or taken over: the caller stops executing it.
    """
    if not run_ids:
        return {}
    dialect = _dialect(conn)
    lease_until = now_plus(dialect, lease_ttl)
    stmt = (
        update(runs)
        .where(
            runs.c.run_id.in_(list(run_ids)),
            runs.c.lease_owner == worker_id,
            runs.c.status.in_(_LEASED),
        )
        .values(lease_expires_at=lease_until, available_at=lease_until)
        .returning(runs.c.run_id, runs.c.fence)
    )
    rows = (await conn.execute(stmt)).all()
    return {row[0]: int(row[1]) for row in rows}


async def check_fence(
    conn: AsyncConnection, run_id: uuid.UUID, fence: int, *, tenant_id: str
) -> None:
    """Lock the run row if (and only if) ``fence`` is still current.

    Every checkpoint transaction starts with this: the row lock orders it against a
    concurrent claim or cancel, so a checkpoint either commits before the fence moves or
    sees the new fence and writes nothing. ``tenant_id`` is the claimed run's: it keys
    the statement to the run's tenant (docs/adr/0034-tenant-leading-keys.md), so a wrong
    tenant matches nothing.

    Raises:
        LeaseLost: the fence moved (claimed elsewhere, cancelled, or lease expired and
            taken over), or ``tenant_id`` is not the run's.
    """
    result = await conn.execute(
        _check_fence_stmt(_dialect(conn)),
        {"b_tenant_id": tenant_id, "b_run_id": run_id, "b_fence": fence},
    )
    if result.rowcount != 1:
        raise LeaseLost(run_id)


async def clear_lost_claims(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> None:
    """Reset ``lost_claims`` to 0: the run journaled step progress under this claim.

    Call after :func:`check_fence` in the same transaction (the multi-statement form of a
    step write; PostgreSQL's single statements reset it themselves). See
    docs/adr/0040-one-commit-per-step.md.
    """
    await conn.execute(
        update(runs)
        .where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id)
        .values(lost_claims=0)
    )


@functools.cache
def _check_fence_stmt(dialect: str) -> Any:
    # Once per checkpoint: built once per dialect, since constructing the statement cost
    # more worker CPU than executing it.
    held = and_(
        runs.c.tenant_id == bindparam("b_tenant_id"),
        runs.c.run_id == bindparam("b_run_id"),
        runs.c.fence == bindparam("b_fence"),
        runs.c.status.in_(_LEASED),
    )
    return update(runs).where(held).values(updated_at=now_expr(dialect))


async def finish_run(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    status: RunStatus,
    reason: str,
    output: str | None,
    error: str | None,
) -> None:
    """Write a terminal outcome under the fence and drop the lease.

    Raises:
        LeaseLost: the fence moved.
    """
    dialect = _dialect(conn)
    now = now_expr(dialect)
    stmt = (
        update(runs)
        .where(_held(run_id, fence, tenant_id))
        .values(
            status=status.value,
            reason=reason,
            output=output,
            error=error,
            lease_owner=None,
            lease_expires_at=None,
            available_at=None,
            blocked_reason=None,
            finished_at=now,
            updated_at=now,
        )
    )
    if (await conn.execute(stmt)).rowcount != 1:
        raise LeaseLost(run_id)


async def release_run(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    status: RunStatus,
    delay: float | None,
    waiting_kind: str | None = None,
    waiting_name: str | None = None,
) -> None:
    """Give the run back: claimable again after ``delay`` seconds (None = not by time).

    Raises:
        LeaseLost: the fence moved.
    """
    dialect = _dialect(conn)
    now = now_expr(dialect)
    available = None if delay is None else now_plus(dialect, max(delay, 0.0))
    stmt = (
        update(runs)
        .where(_held(run_id, fence, tenant_id))
        .values(
            # A draining worker gives back a cancelling run as cancelling, not queued.
            status=case(
                (runs.c.status == RunStatus.RUNNING.value, status.value), else_=runs.c.status
            ),
            lease_owner=None,
            lease_expires_at=None,
            available_at=available,
            waiting_kind=waiting_kind,
            waiting_name=waiting_name,
            waiting_deadline=available if waiting_kind else None,
            updated_at=now,
        )
    )
    if (await conn.execute(stmt)).rowcount != 1:
        raise LeaseLost(run_id)


async def request_cancel(conn: AsyncConnection, *, run_id: uuid.UUID, due: bool = True) -> None:
    """Move a live run to ``cancelling``: fence advanced, due now.

    A worker then claims it to run its compensations (docs/authoring.md#compensation:
    cancel triggers compensation). ``due=False`` (a run waiting for a concurrency slot):
    it stays unclaimable until a slot is granted to it. ``cancel_requested_at`` is set
    once and never cleared.
    """
    now = now_expr(_dialect(conn))
    await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            status=RunStatus.CANCELLING.value,
            # Kept for good: a requeue, retry or resume of this run undoes it again and
            # never resumes its body (docs/adr/0009-requeue-into-compensation.md).
            cancel_requested_at=func.coalesce(runs.c.cancel_requested_at, now),
            fence=runs.c.fence + 1,
            lease_owner=None,
            lease_expires_at=None,
            available_at=now if due else None,
            waiting_kind=None,
            waiting_name=None,
            waiting_deadline=None,
            updated_at=now,
        )
    )


async def make_due(conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str) -> bool:
    """Make a waiting run claimable now (a signal or decision arrived); True if it was."""
    dialect = _dialect(conn)
    now = now_expr(dialect)
    stmt = (
        update(runs)
        .where(
            runs.c.tenant_id == tenant_id,
            runs.c.run_id == run_id,
            runs.c.status.in_([s.value for s in WAITING_STATUSES]),
        )
        .values(available_at=now, updated_at=now)
    )
    return (await conn.execute(stmt)).rowcount == 1


async def wake_parent(conn: AsyncConnection, *, parent_run_id: uuid.UUID, tenant_id: str) -> bool:
    """A child run ended: make its parent claimable now if it waits; True if it did.

    The parent's row is locked first, whatever its status, as :func:`lock_run` orders a
    signal against a release. A parent being released at this moment then either waits
    for this transaction (its release's wake check sees the child terminal) or has
    committed its release (the update below sees it waiting). A bare conditional UPDATE
    that finds the parent still ``running`` takes no lock on PostgreSQL, and the
    release's wake check, reading before this transaction commits, misses the child:
    the parent would wait forever. (SQLite: the write lock already serializes both.)
    ``tenant_id`` is the child's, which is always its parent's (a child is submitted in
    its parent's tenant).
    """
    if _dialect(conn) == "postgresql":
        lock = (
            select(runs.c.run_id)
            .where(runs.c.tenant_id == tenant_id, runs.c.run_id == parent_run_id)
            .with_for_update()
        )
        await conn.execute(lock)
    return await make_due(conn, run_id=parent_run_id, tenant_id=tenant_id)


async def make_due_for_resume(conn: AsyncConnection, *, run_id: uuid.UUID) -> bool:
    """``POST /runs/{id}/resume``: make a run that waits for something claimable now.

    Waiting runs (``retrying``, ``waiting_*``) and ``compensating`` / ``cancelling`` runs
    that were released to wait out a compensation's retry backoff (no lease holder, a due
    time set). A cancelling run waiting for a concurrency slot (no due time) or one a
    worker holds is left alone: resuming never takes a run from under its lease.

    Returns:
        True if the run was made due.
    """
    now = now_expr(_dialect(conn))
    undoing = and_(
        runs.c.status.in_([RunStatus.COMPENSATING.value, RunStatus.CANCELLING.value]),
        runs.c.lease_owner.is_(None),
        runs.c.available_at.is_not(None),
    )
    stmt = (
        update(runs)
        .where(
            runs.c.run_id == run_id,
            or_(runs.c.status.in_([s.value for s in WAITING_STATUSES]), undoing),
        )
        .values(available_at=now, updated_at=now)
    )
    return (await conn.execute(stmt)).rowcount == 1


async def begin_compensation(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    fence: int,
    reason: str,
    error: str | None,
) -> None:
    """Mark a run we hold ``compensating``, recording the failure being undone.

    ``reason`` and ``error`` (JSON text) are the failure that triggered compensation: kept
    on the row while it is undone, so an execution that resumes the compensation (after a
    release, a lost worker or a requeue) ends the run with the same reason even when its
    replay stops before reaching the failure again.

    Raises:
        LeaseLost: the fence moved.
    """
    stmt = (
        update(runs)
        .where(_held(run_id, fence, tenant_id))
        .values(
            status=RunStatus.COMPENSATING.value,
            reason=reason,
            error=error,
            updated_at=now_expr(_dialect(conn)),
        )
    )
    if (await conn.execute(stmt)).rowcount != 1:
        raise LeaseLost(run_id)


async def requeue_run(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    status: RunStatus,
    reason: str | None,
    error: str | None,
    concurrency_slot: int | None,
    blocked_reason: str | None,
) -> None:
    """Put a failed run back to work as ``status``: queued, compensating or cancelling.

    Claimable now unless it waits for a concurrency slot (``blocked_reason``).
    ``reason`` / ``error``: what a ``compensating`` run is undoing (None otherwise). The
    run's old slot number is overwritten: another run may hold it by now. Its lost claims
    start again from 0: a requeue is a fresh budget (docs/guarantees.md); the claims that
    were lost stay in the timeline (``run_claimed`` events).
    """
    now = now_expr(_dialect(conn))
    await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            status=status.value,
            reason=reason,
            error=error,
            output=None,
            finished_at=None,
            concurrency_slot=concurrency_slot,
            not_before=None,
            blocked_reason=blocked_reason,
            available_at=None if blocked_reason else now,
            lost_claims=0,
            updated_at=now,
        )
    )


async def lock_run(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID, *, owner: str | None = None
) -> RowMapping:
    """Read a tenant's run and lock its row until the transaction ends.

    Locking orders an external event (signal, decision) against a worker releasing the
    run: whichever commits second sees the other. (SQLite: the write lock already does.)

    Raises:
        RunNotFound: not this tenant's run (or, with ``owner``, not visible to it).
    """
    stmt = select(runs).where(
        runs.c.run_id == run_id, runs.c.tenant_id == tenant_id, visible_to(owner)
    )
    if _dialect(conn) == "postgresql":
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).mappings().first()
    if row is None:
        raise RunNotFound(f"run {run_id} not found", run_id=str(run_id))
    return row


async def cancel_run(conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str) -> bool:
    """Cancel a live run: terminal ``cancelled``, fence advanced, lease dropped.

    Returns:
        True if this call cancelled it; False if it was already terminal (the caller
        reads the row to tell "already cancelled" from "finished otherwise").
    """
    dialect = _dialect(conn)
    now = now_expr(dialect)
    stmt = (
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.tenant_id == tenant_id,
            runs.c.status.not_in([s.value for s in TERMINAL_RUN_STATUSES]),
        )
        .values(
            status=RunStatus.CANCELLED.value,
            reason="canceled_by_request",
            cancel_requested_at=func.coalesce(runs.c.cancel_requested_at, now),
            fence=runs.c.fence + 1,
            lease_owner=None,
            lease_expires_at=None,
            available_at=None,
            waiting_kind=None,
            waiting_name=None,
            waiting_deadline=None,
            finished_at=now,
            updated_at=now,
        )
    )
    return (await conn.execute(stmt)).rowcount == 1


async def count_by_status(conn: AsyncConnection) -> dict[str, int]:
    """Return ``{status: count}`` over all runs (metrics)."""
    rows = (await conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status))).all()
    return {str(r[0]): int(r[1]) for r in rows}


async def set_version(conn: AsyncConnection, *, run_id: uuid.UUID, version: str) -> RowMapping:
    """Re-pin a run to another definition version (``POST /runs/{id}/migrate``).

    The fence advances, so a worker still holding an old lease can never commit again. A
    run waiting for a concurrency slot keeps waiting (and its ``blocked_reason``).
    """
    waits = and_(runs.c.concurrency_key.is_not(None), runs.c.concurrency_slot.is_(None))
    stmt = (
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            version=version,
            fence=runs.c.fence + 1,
            blocked_reason=case((waits, runs.c.blocked_reason), else_=None),
            updated_at=now_expr(_dialect(conn)),
        )
        .returning(*runs.c)
    )
    return (await conn.execute(stmt)).mappings().one()


async def count_open_by_version(
    conn: AsyncConnection, *, tenant_id: str | None, claimable_only: bool = False
) -> dict[tuple[str, str], int]:
    """Open (non-terminal) runs per ``(workflow, version)``; one tenant's, or all (None).

    ``claimable_only``: only runs a worker must pick up at some time (``available_at``
    set: due, retrying, timers, deadlines, leases), i.e. the ones a missing worker blocks.
    """
    stmt = select(runs.c.workflow, runs.c.version, func.count()).where(
        runs.c.status.not_in([s.value for s in TERMINAL_RUN_STATUSES])
    )
    if tenant_id is not None:
        stmt = stmt.where(runs.c.tenant_id == tenant_id)
    if claimable_only:
        stmt = stmt.where(runs.c.available_at.is_not(None))
    stmt = stmt.group_by(runs.c.workflow, runs.c.version)
    return {(w, v): int(n) for w, v, n in (await conn.execute(stmt)).all()}


async def set_pause(
    conn: AsyncConnection, *, run_id: uuid.UUID, paused_by: str, reason: str | None
) -> None:
    """Mark a run paused now by ``paused_by`` (docs/adr/0021-pause-is-a-flag-beside-the-status.md).

    Neither the status nor the fence moves: an attempt in flight finishes and checkpoints,
    and the run keeps the due time of whatever it waits on.
    """
    now = now_expr(_dialect(conn))
    await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(paused_at=now, paused_by=paused_by, pause_reason=reason, updated_at=now)
    )


async def clear_pause(conn: AsyncConnection, *, run_id: uuid.UUID) -> None:
    """Unmark a pause: the run is claimable again as soon as its ``available_at`` is due."""
    await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            paused_at=None,
            paused_by=None,
            pause_reason=None,
            updated_at=now_expr(_dialect(conn)),
        )
    )


async def is_paused(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> bool:
    """Whether the run is paused now (the executor's pause point, one primary-key read)."""
    found = await conn.execute(
        select(runs.c.paused_at).where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id)
    )
    return found.scalar_one_or_none() is not None


async def set_rerun_of(
    conn: AsyncConnection, *, run_id: uuid.UUID, rerun_of: uuid.UUID, from_step: str
) -> RowMapping:
    """Link a just-inserted rerun to its original; returns the updated row."""
    row = (
        (
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(rerun_of=rerun_of, rerun_from_step=from_step)
                .returning(*runs.c)
            )
        )
        .mappings()
        .one()
    )
    return row
