"""Bulk actions on runs as durable batches (docs/adr/0023-durable-batches.md).

:func:`create_batch` fixes the runs a batch acts on (a list of ids, or the ``GET /runs``
filters evaluated once) and records it ``running``; :class:`BatchRunner` (one per worker)
leases a running batch, acts on its runs in chunks and finishes it. Each chunk is one
transaction holding the chunk's actions, the items' outcomes and the batch's counters and
cursor, written under the batch's fence: a worker killed mid-chunk commits nothing of it,
and the worker that takes the batch over after its lease expires starts from the last
committed cursor, so every run is counted (and acted on) exactly once.

Each run gets exactly the single-run action of app/engine/control.py, under the creator's
principal: its tenant and owner filter, and the scope the action needs
(:data:`app.auth.principal.ACTION_SCOPES`, the table the single-run routes read). The
scope is checked when the batch is created and again, from the scopes stored with it,
for every item a worker acts on, with the creator's tenant suspension and API key
revocation (docs/adr/0052-bulk-actions-under-their-creators-principal.md): a batch can
never touch a run its creator could not, nor do more than the creator's single action.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, assert_never

import structlog
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.principal import ACTION_SCOPES, Principal, RunAction, Scope
from app.core import json, metrics
from app.core.errors import (
    BatchNotFound,
    DeadLetterNotFound,
    Forbidden,
    InvalidInput,
    InvalidState,
    LeaseLost,
    NotFoundError,
    RunFinished,
    TreadleError,
)
from app.core.ids import new_uuid7
from app.core.settings import Settings
from app.core.status import RunStatus
from app.db import faults
from app.db.database import Database, fetch_now
from app.db.queries import batches as batches_q
from app.db.queries import runs as runs_q
from app.db.queries.run_filters import RunListFilters
from app.engine import authority, control

log = structlog.get_logger("treadle.batches")

MAX_RUN_IDS = 1000
"""Most ids one ``{"run_ids": [...]}`` request may list (a filter may match more)."""
SAMPLE_SIZE = 20
"""Run ids a dry run returns."""
_FAILURES_KEPT = 20


class BatchAction(StrEnum):
    """What a batch does to each run: the single-run control of the same name."""

    CANCEL = "cancel"
    RETRY = "retry"
    RESUME = "resume"
    SIGNAL = "signal"
    PAUSE = "pause"
    UNPAUSE = "unpause"

    @property
    def run_action(self) -> RunAction:
        """The single-run verb this batch repeats (whose scope it needs)."""
        return RunAction(self.value)

    @property
    def scope(self) -> Scope:
        """The scope each item needs: the single action's (:data:`ACTION_SCOPES`)."""
        return ACTION_SCOPES[self.run_action]


def _missing_scope(action: BatchAction) -> Forbidden:
    scope = action.scope.value
    return Forbidden(f"this operation needs the {scope!r} scope", required_scope=scope)


class BatchState(StrEnum):
    """A batch's lifecycle: ``running`` until every item is processed or it is cancelled."""

    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class DryRun:
    """What a batch would act on: the exact count and up to 20 run ids (oldest first)."""

    matched: int
    sample: list[uuid.UUID]


async def create_batch(
    db: Database,
    settings: Settings,
    *,
    principal: Principal,
    action: BatchAction,
    run_ids: Sequence[uuid.UUID] | None,
    filters: RunListFilters | None,
    selection: dict[str, Any],
    params: dict[str, Any],
    reason: str | None,
    dry_run: bool,
) -> RowMapping | DryRun:
    """Create a running batch (or, for a dry run, only count what it would match).

    Args:
        db: the database.
        settings: ``TREADLE_BATCH_MAX_RUNS``.
        principal: the caller. Only its tenant's runs are ever acted on, with its owner
            filter; its subject is ``created_by`` (the actor of each run's event); its
            scopes and API key are stored, and each item is re-checked under them.
        action: what is done to each run; the caller must hold its single action's
            scope (:data:`ACTION_SCOPES`).
        run_ids: the runs to act on (at most :data:`MAX_RUN_IDS`, duplicates dropped); an
            id that is not the tenant's (or not visible to ``owner``) is later skipped as
            ``not_found``, exactly as the single-run action would answer 404.
        filters: the ``GET /runs`` filters instead of ids, evaluated once, now.
        selection: what was asked, stored as given (shown by ``GET /batches/{id}``).
        params: action parameters (``name``/``payload`` for a signal; the payload already
            checked against ``TREADLE_MAX_PAYLOAD_BYTES``).
        reason: recorded with each run's action (cancel, pause, retry).
        dry_run: only count and sample, create nothing.

    Returns:
        The batch row, or a :class:`DryRun` (nothing is written).

    Raises:
        Forbidden: the caller lacks the action's scope (403; nothing created, not even
            a dry run's count).
        InvalidInput: both or neither of ids and filter, too many ids, or a filter matching
            more than ``TREADLE_BATCH_MAX_RUNS`` runs (422; nothing created).
    """
    if not principal.has(action.scope):
        raise _missing_scope(action)
    tenant_id, owner = principal.tenant_id, principal.owner_filter
    if (run_ids is None) == (filters is None):
        raise InvalidInput(
            "give exactly one of run_ids and filter",
            errors=[{"path": "body", "message": "exactly one of run_ids, filter"}],
        )
    ids = list(dict.fromkeys(run_ids)) if run_ids is not None else None
    if ids is not None and not 1 <= len(ids) <= MAX_RUN_IDS:
        raise InvalidInput(
            f"run_ids lists {len(ids)} runs; give 1 to {MAX_RUN_IDS} (or use a filter)",
            errors=[{"path": "body.run_ids", "message": f"1 to {MAX_RUN_IDS} ids"}],
        )
    if dry_run:
        return await _dry_run(db, tenant_id, ids, filters, owner=owner)
    batch_id = new_uuid7()

    async def create_tx(conn: AsyncConnection) -> RowMapping:
        now = await fetch_now(conn, conn.dialect.name)
        await batches_q.insert_batch(
            conn,
            {
                "batch_id": batch_id,
                "tenant_id": tenant_id,
                "action": action.value,
                "selection": json.dumps(selection),
                "params": json.dumps(params),
                "reason": reason,
                "created_by": principal.subject,
                "owner": owner,
                "scopes": json.dumps(sorted(s.value for s in principal.scopes)),
                "api_key_id": principal.api_key_id,
                "state": BatchState.RUNNING.value,
                "matched": 0,
                "created_at": now,
                "updated_at": now,
            },
        )
        if ids is not None:
            await batches_q.insert_items(conn, tenant_id, batch_id, ids)
            matched = len(ids)
        else:
            assert filters is not None
            matched = await batches_q.insert_items_from_filter(
                conn, batch_id, tenant_id, filters, owner=owner
            )
            if matched > settings.batch_max_runs:
                # Rolled back with the transaction: nothing is created.
                raise InvalidInput(
                    f"the filter matches {matched} runs, over TREADLE_BATCH_MAX_RUNS="
                    f"{settings.batch_max_runs}; narrow it (e.g. by created_before)",
                    errors=[{"path": "body.filter", "message": "matches too many runs"}],
                )
        await batches_q.set_matched(conn, batch_id, matched)
        row = await batches_q.get_batch(conn, tenant_id, batch_id)
        assert row is not None
        return row

    return await db.write_retrying(create_tx, what="create batch")


async def _dry_run(
    db: Database,
    tenant_id: str,
    ids: list[uuid.UUID] | None,
    filters: RunListFilters | None,
    *,
    owner: str | None,
) -> DryRun:
    async with db.read() as conn:
        if filters is None:
            # Only the tenant's (visible) runs among the ids: the others would be skipped.
            assert ids is not None
            found = await batches_q.visible_run_ids(conn, tenant_id, ids, owner=owner)
            return DryRun(matched=len(found), sample=sorted(found)[:SAMPLE_SIZE])
        matched = await batches_q.count_matching(conn, tenant_id, filters, owner=owner)
        sample = await batches_q.sample_matching(
            conn, tenant_id, filters, owner=owner, limit=SAMPLE_SIZE
        )
    return DryRun(matched=matched, sample=sample)


async def get_batch(
    db: Database, *, tenant_id: str, batch_id: uuid.UUID, owner: str | None = None
) -> RowMapping:
    """A tenant's batch; with ``owner`` (a non-admin's subject) only one it created.

    Raises:
        BatchNotFound: no such batch in this tenant, or not the owner's (404).
    """
    async with db.read() as conn:
        row = await batches_q.get_batch(conn, tenant_id, batch_id, owner=owner)
    if row is None:
        raise BatchNotFound(f"batch {batch_id} not found")
    return row


async def list_batches(
    db: Database,
    *,
    tenant_id: str,
    before: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> Sequence[RowMapping]:
    """A tenant's batches (with ``owner``, that subject's), newest first.

    May lag (:meth:`Database.lagging_read`): a list, read for looking at only.
    """
    async with db.lagging_read() as conn:
        return await batches_q.list_batches(
            conn, tenant_id, before=before, limit=limit, owner=owner
        )


async def cancel_batch(
    db: Database, *, tenant_id: str, batch_id: uuid.UUID, owner: str | None = None
) -> RowMapping:
    """Stop a running batch; runs already acted on stay so (a batch is not undone).

    Its worker stops at its next chunk (the chunk in flight, if any, still commits: it
    locked the batch row before this update could). Cancelling a cancelled batch is
    idempotent.

    Raises:
        BatchNotFound: no such batch in this tenant, or with ``owner`` not one the
            owner created (404).
        InvalidState: the batch already completed (409).
    """

    async def cancel_tx(conn: AsyncConnection) -> RowMapping:
        now = await fetch_now(conn, conn.dialect.name)
        await batches_q.cancel_batch(conn, tenant_id, batch_id, now=now, owner=owner)
        row = await batches_q.get_batch(conn, tenant_id, batch_id, owner=owner)
        if row is None:
            raise BatchNotFound(f"batch {batch_id} not found")
        if row["state"] == BatchState.COMPLETED.value:
            raise InvalidState(f"batch {batch_id} already completed")
        return row

    return await db.write_retrying(cancel_tx, what="cancel batch")


def _skip_reason(action: BatchAction, exc: TreadleError) -> str | None:
    """The skipped reason of a refused single-run action, or None when it is a failure."""
    if isinstance(exc, NotFoundError | DeadLetterNotFound):
        return "not_found"
    if isinstance(exc, RunFinished):
        return "already_terminal"
    if isinstance(exc, InvalidState):
        match action:
            case BatchAction.UNPAUSE:
                return "not_paused"
            case BatchAction.RESUME:
                return "not_waiting"
            case BatchAction.RETRY:
                return "not_failed"
            case BatchAction.CANCEL | BatchAction.SIGNAL | BatchAction.PAUSE:
                return "invalid_state"
            case _:
                assert_never(action)
    return None


async def _act(
    conn: AsyncConnection, settings: Settings, batch: RowMapping, run_id: uuid.UUID
) -> str | None:
    """Apply the batch's action to one run; returns a skip reason (None: done)."""
    action = BatchAction(batch["action"])
    tenant_id, owner, actor = batch["tenant_id"], batch["owner"], batch["created_by"]
    reason = batch["reason"]
    match action:
        case BatchAction.CANCEL:
            # A cancel of a finished or already-cancelling run is idempotent for the
            # single-run call; a batch counts it as skipped so ``done`` is what it changed.
            run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
            status = RunStatus(run["status"])
            if status.is_terminal:
                return "already_terminal"
            if status == RunStatus.CANCELLING:
                return "already_cancelling"
            await control.cancel_in(
                conn, tenant_id=tenant_id, run_id=run_id, actor=actor, reason=reason, owner=owner
            )
        case BatchAction.RESUME:
            await control.resume_in(
                conn, tenant_id=tenant_id, run_id=run_id, actor=actor, owner=owner
            )
        case BatchAction.PAUSE:
            _, changed = await control.pause_in(
                conn, tenant_id=tenant_id, run_id=run_id, actor=actor, reason=reason, owner=owner
            )
            if not changed:
                return "already_paused"
        case BatchAction.UNPAUSE:
            await control.unpause_in(
                conn, tenant_id=tenant_id, run_id=run_id, actor=actor, owner=owner
            )
        case BatchAction.SIGNAL:
            params = json.loads(batch["params"]) or {}
            await control.signal_in(
                conn,
                settings,
                tenant_id=tenant_id,
                run_id=run_id,
                name=params["name"],
                payload_text=json.dumps(params.get("payload")),
                actor=actor,
                owner=owner,
            )
        case BatchAction.RETRY:
            dl_id = await control.pending_dead_letter_in(
                conn, tenant_id=tenant_id, run_id=run_id, owner=owner
            )
            await control.requeue_in(
                conn,
                tenant_id=tenant_id,
                dead_letter_id=dl_id,
                actor=actor,
                reason=reason or f"bulk retry (batch {batch['batch_id']})",
                correlation_id=str(batch["batch_id"]),
                owner=owner,
            )
        case _:
            assert_never(action)
    return None


def _stored_principal(batch: RowMapping) -> Principal | None:
    """The creator's principal as the batch recorded it; None before revision 0029."""
    if batch["scopes"] is None:
        return None
    known = {s.value for s in Scope}
    return Principal(
        tenant_id=batch["tenant_id"],
        subject=batch["created_by"],
        # A scope this code no longer knows grants nothing.
        scopes=frozenset(Scope(s) for s in json.loads(batch["scopes"]) if s in known),
        api_key_id=batch["api_key_id"],
    )


async def item_refusal(conn: AsyncConnection, batch: RowMapping) -> tuple[str, str] | None:
    """Why the batch's creator may not act on its items now, as ``(code, detail)``.

    The checks a single action's request would pass, re-applied by the worker for the
    items it acts on (the batch is durable and runs later, so each check is made again
    under the principal stored with it): the action's scope (:data:`ACTION_SCOPES`;
    a batch recorded without scopes, before revision 0029, has none), the tenant not
    suspended (unless the creator holds ``admin``, as for requests) and the creator's API
    key not revoked. Codes: ``forbidden``, ``tenant_suspended``, ``api_key_revoked``.
    None: every item may be acted on (the owner filter still applies per run).
    """
    action = BatchAction(batch["action"])
    principal = _stored_principal(batch)
    if principal is None:
        return (
            Forbidden.code,
            "the batch records no scopes of its creator (created before revision 0029); "
            "create it again",
        )
    if not principal.has(action.scope):
        return Forbidden.code, str(_missing_scope(action))
    refusal = await authority.principal_refusal(
        conn,
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        is_admin=principal.is_admin,
    )
    return None if refusal is None else (refusal.cause, refusal.detail)


@dataclass
class ChunkResult:
    """What one committed chunk did (counted in metrics only after its commit)."""

    done: int = 0
    skipped: int = 0
    failed: int = 0
    finished: bool = False
    stopped: bool = False


async def process_chunk(
    db: Database, settings: Settings, *, batch_id: uuid.UUID, fence: int, worker_id: str
) -> ChunkResult:
    """Act on the next ``TREADLE_BATCH_CHUNK_SIZE`` items in one transaction.

    Each run's action runs in a savepoint: a refused action (the run finished, is not
    paused, …) is rolled back alone and counted as skipped with its reason; any other
    Treadle error counts as failed. The counters, cursor and lease extension are written
    under the fence in the same transaction.

    Returns:
        The chunk's counts; ``finished`` once no item is left (the batch is ``completed``),
        ``stopped`` when it was cancelled meanwhile.

    Raises:
        LeaseLost: another worker took the batch over (nothing of this chunk committed).
    """

    async def chunk_tx(conn: AsyncConnection) -> ChunkResult:
        batch = await batches_q.lock_leased(conn, batch_id, fence=fence)
        if batch is None:
            raise LeaseLost(batch_id)
        result = ChunkResult()
        if batch["state"] != BatchState.RUNNING.value:
            result.stopped = True
            return result
        now = await fetch_now(conn, conn.dialect.name)
        items = await batches_q.next_items(
            conn, batch_id, after=batch["cursor"], limit=settings.batch_chunk_size
        )
        action = BatchAction(batch["action"])
        reasons: dict[str, int] = json.loads(batch["skipped_reasons"]) or {}
        failures: list[dict[str, Any]] = json.loads(batch["failures"]) or []
        outcomes: dict[uuid.UUID, str] = {}
        # Re-checked in every chunk's transaction, so an item is never acted on after
        # its creator lost the right to (a revoked key, a suspended tenant).
        refused = await item_refusal(conn, batch) if items else None
        for run_id in items:
            if refused is not None:
                result.failed += 1
                outcomes[run_id] = "failed"
                code, detail = refused
                failures = [
                    *failures,
                    {"run_id": str(run_id), "code": code, "detail": detail[:300]},
                ][-_FAILURES_KEPT:]
                continue
            try:
                async with conn.begin_nested():
                    skip = await _act(conn, settings, batch, run_id)
            except TreadleError as exc:
                skip = _skip_reason(action, exc)
                if skip is None:
                    result.failed += 1
                    outcomes[run_id] = "failed"
                    failures = [
                        *failures,
                        {"run_id": str(run_id), "code": exc.code, "detail": str(exc)[:300]},
                    ][-_FAILURES_KEPT:]
                    continue
            except Exception as exc:
                if faults.classify(exc) is not None:
                    raise  # a conflict or outage: the whole chunk is retried or left
                # A bug or constraint violation on this one run (rolled back to its
                # savepoint): counted as failed so it cannot wedge the batch forever.
                log.error("batch item failed", batch_id=str(batch_id), run_id=str(run_id))
                result.failed += 1
                outcomes[run_id] = "failed"
                failures = [
                    *failures,
                    {
                        "run_id": str(run_id),
                        "code": "internal_error",
                        "detail": faults.describe(exc),
                    },
                ][-_FAILURES_KEPT:]
                continue
            if skip is None:
                result.done += 1
                outcomes[run_id] = "done"
            else:
                result.skipped += 1
                reasons[skip] = reasons.get(skip, 0) + 1
                outcomes[run_id] = f"skipped:{skip}"
        await batches_q.set_outcomes(conn, batch_id, outcomes)
        values: dict[str, Any] = {
            "done": batch["done"] + result.done,
            "skipped": batch["skipped"] + result.skipped,
            "failed": batch["failed"] + result.failed,
            "skipped_reasons": json.dumps(reasons),
            "failures": json.dumps(failures),
            "updated_at": now,
            # Committing a chunk is the batch's heartbeat.
            "lease_until": now + timedelta(seconds=settings.lease_ttl_seconds),
        }
        if items:
            values["cursor"] = items[-1]
        if len(items) < settings.batch_chunk_size:
            values.update(
                state=BatchState.COMPLETED.value,
                finished_at=now,
                lease_owner=None,
                lease_until=None,
            )
            result.finished = True
        if not await batches_q.advance(conn, batch_id, fence=fence, values=values):
            raise LeaseLost(batch_id)
        return result

    result = await db.write_retrying(chunk_tx, what="batch chunk")
    return result


class BatchRunner:
    """A worker's batch loop: lease a running batch, process it chunk by chunk, repeat.

    Args:
        db: the database.
        settings: lease TTL (a batch's lease, extended by each chunk), chunk size, poll
            interval.
        worker_id: the lease owner written on claimed batches.
    """

    def __init__(self, db: Database, settings: Settings, *, worker_id: str) -> None:
        self.db = db
        self.settings = settings
        self.worker_id = worker_id
        self.log = log.bind(worker_id=worker_id)

    async def claim(self) -> RowMapping | None:
        """Lease one running batch that nobody holds (or whose lease expired).

        A read first: an idle poll (no batch waiting, the usual case) writes nothing.
        """
        async with self.db.read() as conn:
            if not await batches_q.any_claimable(conn):
                return None

        async def claim_tx(conn: AsyncConnection) -> RowMapping | None:
            now = await fetch_now(conn, conn.dialect.name)
            return await batches_q.claim_batch(
                conn,
                worker_id=self.worker_id,
                now=now,
                lease_until=now + timedelta(seconds=self.settings.lease_ttl_seconds),
            )

        return await self.db.write_retrying(claim_tx, what="claim batch")

    async def run_batch(self, batch: RowMapping) -> None:
        """Process a leased batch to its end, or until it is cancelled or taken over."""
        batch_id, fence = batch["batch_id"], int(batch["fence"])
        action = batch["action"]
        while True:
            try:
                result = await process_chunk(
                    self.db,
                    self.settings,
                    batch_id=batch_id,
                    fence=fence,
                    worker_id=self.worker_id,
                )
            except LeaseLost:
                self.log.warning("batch lease lost", batch_id=str(batch_id))
                return
            for outcome, n in (
                ("done", result.done),
                ("skipped", result.skipped),
                ("failed", result.failed),
            ):
                if n:
                    metrics.BATCH_ITEMS.labels(action, outcome).inc(n)
            if result.finished or result.stopped:
                self.log.info(
                    "batch finished" if result.finished else "batch stopped",
                    batch_id=str(batch_id),
                )
                return

    async def run_once(self) -> bool:
        """Claim and finish one batch; False when none was waiting."""
        batch = await self.claim()
        if batch is None:
            return False
        await self.run_batch(batch)
        return True

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set: batches back to back, else poll."""
        while not stopping.is_set():
            try:
                if await self.run_once():
                    continue
            except Exception as exc:  # noqa: BLE001 - DB down: try again at the next poll
                self.log.warning("batch pass failed", error=str(exc)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.settings.poll_interval_seconds)


def batch_view_fields(row: RowMapping) -> dict[str, Any]:
    """A batch row as the API and CLI show it (JSON columns decoded)."""
    return {
        "batch_id": row["batch_id"],
        "action": row["action"],
        "selection": json.loads(row["selection"]),
        "params": json.loads(row["params"]),
        "reason": row["reason"],
        "state": row["state"],
        "matched": int(row["matched"]),
        "done": int(row["done"]),
        "skipped": int(row["skipped"]),
        "skipped_reasons": json.loads(row["skipped_reasons"]) or {},
        "failed": int(row["failed"]),
        "failures": json.loads(row["failures"]) or [],
        "created_by": row["created_by"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "finished_at": row["finished_at"],
    }
