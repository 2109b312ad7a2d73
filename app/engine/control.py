"""Operator and client controls on runs: cancel, signal, decide, requeue, resume."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import (
    CeilingExceeded,
    ConcurrencyKeyBusy,
    DeadLetterNotFound,
    Forbidden,
    InvalidState,
    RunFinished,
    RunNotFound,
    StepNotFound,
)
from app.core.settings import Settings
from app.core.status import EventKind, RunReason, RunStatus, StepStatus
from app.db.database import Database
from app.db.queries import approvals as approvals_q
from app.db.queries import dead_letters as dl_q
from app.db.queries import events as events_q
from app.db.queries import runs as runs_q
from app.db.queries import signals as signals_q
from app.db.queries import steps as steps_q
from app.db.tables import steps
from app.engine import slots, webhooks
from app.engine.outcomes import COMPENSATION_SEQ_BASE
from app.engine.waits import resolve_decisions
from app.engine.wakeup import notify


async def _cancel_requested(
    conn: AsyncConnection, tenant_id: str, run_id: uuid.UUID, actor: str, data: dict[str, Any]
) -> RowMapping:
    # After the cancel request is written: its event, a wake-up, the run as it now stands.
    await events_q.append(
        conn,
        run_id=run_id,
        tenant_id=tenant_id,
        kind=EventKind.RUN_CANCEL_REQUESTED,
        actor=actor,
        data=data,
    )
    await notify(conn)
    return await runs_q.get_run(conn, tenant_id, run_id)


async def cancel(
    db: Database,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    actor: str,
    reason: str | None,
    owner: str | None = None,
) -> RowMapping:
    """Cancel a run: ``cancelled`` / ``canceled_by_request``, with its fence advanced.

    A worker executing it can never commit again: it stops at its next checkpoint or
    heartbeat.

    A run with registered compensations goes to ``cancelling`` instead: a worker runs its
    compensations, then it becomes ``cancelled`` (or ``failed`` if one failed).

    ``owner`` (the caller's subject, None for admins) enforces the owner access policy:
    another subject's ``owner`` run is not found. This holds for every control below.

    Returns:
        The run row after the call. Cancelling a cancelled (or cancelling) run is
        idempotent.

    Raises:
        RunNotFound: not this tenant's run (or not visible to ``owner``).
        RunFinished: the run already finished otherwise (409).
    """
    return await db.write_retrying(
        lambda conn: cancel_in(
            conn, tenant_id=tenant_id, run_id=run_id, actor=actor, reason=reason, owner=owner
        ),
        what="cancel",
    )


async def cancel_in(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    actor: str,
    reason: str | None,
    owner: str | None = None,
) -> RowMapping:
    """:func:`cancel` inside the caller's transaction (a batch chunk commits it).

    Raises:
        RunNotFound: not this tenant's run (or not visible to ``owner``).
        RunFinished: the run already finished otherwise (nothing written).
    """
    await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)  # 404 before anything
    row = await _cancel_in(conn, tenant_id=tenant_id, run_id=run_id, actor=actor, reason=reason)
    if row["status"] not in (
        RunStatus.CANCELLED.value,
        RunStatus.CANCELLING.value,
        RunStatus.COMPENSATING.value,
    ):
        raise RunFinished(
            f"run {run_id} already finished with status {row['status']!r}",
            run_id=str(run_id),
            run_status=row["status"],
        )
    return row


async def _cancel_in(
    conn: AsyncConnection, *, tenant_id: str, run_id: uuid.UUID, actor: str, reason: str | None
) -> RowMapping:
    """Cancel one run and, recursively, the joined children it waits for."""
    run = await runs_q.lock_run(conn, tenant_id, run_id)  # 404 for other tenants
    status = RunStatus(run["status"])
    if run["paused_at"] is not None and not status.is_terminal:
        # A cancel wins over a pause (docs/adr/0021-pause-is-a-flag-beside-the-status.md):
        # a run with compensations must be claimed to be undone, so the pause ends here.
        await runs_q.clear_pause(conn, run_id=run_id)
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.RUN_UNPAUSED,
            actor=actor,
            data={"by": "cancel"},
        )
    if not status.is_terminal:
        for child_id in await _joined_children(conn, run_id, tenant_id):
            await _cancel_in(
                conn,
                tenant_id=tenant_id,
                run_id=child_id,
                actor=actor,
                reason=f"parent {run_id} cancelled",
            )
    if status == RunStatus.CANCELLING:
        return run  # already being cancelled: cancelling again changes nothing
    waits = run["concurrency_key"] is not None and run["concurrency_slot"] is None
    if status == RunStatus.COMPENSATING:
        # A failed run being undone: it is undone either way, but the cancel must hold
        # (it ends ``cancelled``, and its cancel-only undo actions run too). The fence
        # advances, so an attempt in flight is fenced off and counted as interrupted, not
        # failed; its steps keep their state (a compensation waiting out a retry backoff
        # keeps its due time).
        await runs_q.request_cancel(conn, run_id=run_id, due=not waits)
        return await _cancel_requested(
            conn, tenant_id, run_id, actor, {"reason": reason, "while": status.value}
        )
    if not status.is_terminal and await steps_q.has_compensations(
        conn, run_id, tenant_id=tenant_id
    ):
        # Undo first: a worker claims the run, runs its compensations in reverse
        # order, and only then is it ``cancelled``. A run waiting for a concurrency slot
        # (a requeued one with compensations) waits on, and undoes once admitted.
        # The run row first, then its steps: the order a worker's checkpoint locks them.
        await runs_q.request_cancel(conn, run_id=run_id, due=not waits)
        await steps_q.cancel_running(conn, run_id, tenant_id=tenant_id)
        return await _cancel_requested(conn, tenant_id, run_id, actor, {"reason": reason})
    if await runs_q.cancel_run(conn, run_id=run_id, tenant_id=tenant_id):
        await steps_q.cancel_running(conn, run_id, tenant_id=tenant_id)
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.RUN_CANCELLED,
            actor=actor,
            data={"reason": reason},
        )
        await webhooks.run_became_terminal(conn, run_id, tenant_id=tenant_id)
        # The cancelled run's concurrency slot goes to the key's oldest waiter.
        if await slots.release(conn, run):
            await notify(conn)
    return await runs_q.get_run(conn, tenant_id, run_id)


async def _joined_children(
    conn: AsyncConnection, run_id: uuid.UUID, tenant_id: str
) -> list[uuid.UUID]:
    rows = (
        await conn.execute(
            select(steps.c.detail).where(
                steps.c.tenant_id == tenant_id,
                steps.c.run_id == run_id,
                steps.c.kind == "child",
                steps.c.status == StepStatus.WAITING.value,
            )
        )
    ).scalars()
    found = []
    for detail in rows:
        info = json.loads(detail) or {}
        if not info.get("detached"):
            found.append(uuid.UUID(info["child_run_id"]))
    return found


def _require_live(run: RowMapping) -> None:
    if RunStatus(run["status"]).is_terminal:
        raise RunFinished(
            f"run {run['run_id']} already finished with status {run['status']!r}",
            run_id=str(run["run_id"]),
            run_status=run["status"],
        )


async def send_signal(
    db: Database,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    name: str,
    payload: Any,
    actor: str,
    owner: str | None = None,
) -> int:
    """Buffer a signal for a run and wake it if it waits on a signal.

    Returns:
        The signal id (signals of one run are consumed in id order, each once).

    Raises:
        RunNotFound: not this tenant's run (nothing recorded).
        RunFinished: the run is terminal (409).
        PayloadTooLarge: payload over ``TREADLE_MAX_PAYLOAD_BYTES``.
        CeilingExceeded: ``TREADLE_MAX_SIGNALS_BUFFERED_PER_RUN`` unconsumed signals are
            already buffered (422; nothing stored).
    """
    text = json.dumps_limited(payload, settings.max_payload_bytes, "signal payload")

    return await db.write_retrying(
        lambda conn: signal_in(
            conn,
            settings,
            tenant_id=tenant_id,
            run_id=run_id,
            name=name,
            payload_text=text,
            actor=actor,
            owner=owner,
        ),
        what="signal",
    )


async def signal_in(
    conn: AsyncConnection,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    name: str,
    payload_text: str,
    actor: str,
    owner: str | None,
) -> int:
    """:func:`send_signal` inside the caller's transaction, the payload already encoded."""
    run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
    _require_live(run)
    buffered = await signals_q.count_buffered(conn, run_id, tenant_id=tenant_id)
    limit = settings.max_signals_buffered_per_run
    if buffered >= limit:
        raise CeilingExceeded(
            f"run {run_id} already has {buffered} unconsumed signals "
            f"(TREADLE_MAX_SIGNALS_BUFFERED_PER_RUN={limit}); retry once it consumes some",
            ceiling="max_signals_buffered_per_run",
            limit=limit,
        )
    signal_id = await signals_q.insert_signal(
        conn, run_id=run_id, tenant_id=tenant_id, name=name, payload=payload_text, sent_by=actor
    )
    await events_q.append(
        conn,
        run_id=run_id,
        tenant_id=tenant_id,
        kind=EventKind.SIGNAL_RECEIVED,
        actor=actor,
        data={"signal": name, "signal_id": signal_id},
    )
    if run["status"] == RunStatus.WAITING_SIGNAL.value:
        await runs_q.make_due(conn, run_id=run_id, tenant_id=tenant_id)
        await notify(conn)
    return signal_id


async def decide_approval(
    db: Database,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    step_id: str,
    subject: str,
    groups: frozenset[str],
    decision: str,
    payload: Any,
    comment: str | None,
    owner: str | None = None,
) -> dict[str, Any]:
    """Record one approver's decision on a waiting approval and wake the run if decided.

    Returns:
        ``{"step_id", "decision", "decided_by", "resolved"}``; ``resolved`` tells whether
        this decision settled the approval.

    Raises:
        RunNotFound: not this tenant's run.
        StepNotFound: the run has no approval ``step_id`` (yet).
        RunFinished: the run is terminal (409).
        InvalidState: the approval is no longer waiting, already decided, or this
            subject already decided it (409).
        Forbidden: the principal is not in the approval's group, or submitted the run
            and self-approval is not allowed (403).
    """
    payload_text = json.dumps_limited(payload, settings.max_payload_bytes, "approval payload")

    async def decide_tx(conn: AsyncConnection) -> bool:
        run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
        step = (
            (
                await conn.execute(
                    select(steps).where(
                        steps.c.tenant_id == run["tenant_id"],
                        steps.c.run_id == run_id,
                        steps.c.step_id == step_id,
                    )
                )
            )
            .mappings()
            .first()
        )
        if step is None or step["kind"] != "approval":
            raise StepNotFound(
                f"run {run_id} has no approval {step_id!r}", run_id=str(run_id), step_id=step_id
            )
        _require_live(run)
        if step["status"] != StepStatus.WAITING.value:
            raise InvalidState(
                f"approval {step_id!r} is not waiting (status {step['status']!r})",
                step_status=step["status"],
            )
        detail = json.loads(step["detail"]) or {}
        group = detail.get("group")
        if group and group not in groups:
            raise Forbidden(
                f"approval {step_id!r} needs a member of group {group!r}", required_group=group
            )
        if subject == run["created_by"] and not detail.get("self_approval", False):
            raise Forbidden(
                f"{subject!r} submitted this run and may not decide its approval {step_id!r}"
            )
        needed = int(detail.get("approvals", 1))
        existing = list(
            await approvals_q.list_decisions(conn, run_id, step_id, tenant_id=tenant_id)
        )
        if resolve_decisions(existing, needed) is not None:
            raise InvalidState(f"approval {step_id!r} is already decided")
        if not await approvals_q.insert_decision(
            conn,
            run_id=run_id,
            step_id=step_id,
            tenant_id=tenant_id,
            decided_by=subject,
            decision=decision,
            payload=payload_text,
            comment=comment,
        ):
            raise InvalidState(f"{subject!r} already decided approval {step_id!r}")
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.APPROVAL_DECIDED,
            step_id=step_id,
            actor=subject,
            data={"decision": decision, "comment": comment},
        )
        rows = list(await approvals_q.list_decisions(conn, run_id, step_id, tenant_id=tenant_id))
        resolved = resolve_decisions(rows, needed) is not None
        if resolved:
            await runs_q.make_due(conn, run_id=run_id, tenant_id=tenant_id)
            await notify(conn)
        return resolved

    resolved = await db.write_retrying(decide_tx, what="approval decision")
    return {"step_id": step_id, "decision": decision, "decided_by": subject, "resolved": resolved}


async def requeue_dead_letter(
    db: Database,
    *,
    tenant_id: str,
    dead_letter_id: uuid.UUID,
    actor: str,
    reason: str,
    correlation_id: str | None,
    owner: str | None = None,
) -> RowMapping:
    """Re-run a failed run from its failed point and mark its dead letter requeued.

    Where the run goes back to (docs/adr/0009-requeue-into-compensation.md):

    - a run whose cancel was requested goes back to ``cancelling``: it is undone and ends
      ``cancelled`` (or ``failed`` again), never resumed;
    - a run whose compensation began (a step undone, or an undo journaled) goes back to
      ``compensating``: only its failed compensations start over, and it ends
      ``compensated`` (or ``failed`` again), never ``completed``, since the results of
      its undone steps no longer stand;
    - any other run goes back to ``queued``: failed steps start over (attempts reset),
      succeeded steps are replayed from the journal, timed-out waits wait again, and
      failed joined children are joined again; a child that is itself ``failed`` with a
      pending dead letter is requeued with it, recursively, with the same audit.

    The request is audited on the dead letter and in the run's events (who, why,
    correlation id).

    Returns:
        The updated dead letter row.

    Raises:
        DeadLetterNotFound: not this tenant's dead letter.
        InvalidState: already requeued, or the run is no longer failed (409).
        ConcurrencyKeyBusy: the run (or a child requeued with it) has a concurrency key
            whose ``key_limit`` runs are active meanwhile and its workflow declares
            ``on_limit="reject"`` (409, nothing changed). With ``on_limit="queue"`` the
            run waits for a slot instead: in submission order, so ahead of runs
            submitted after it.
    """
    return await db.write_retrying(
        lambda conn: requeue_in(
            conn,
            tenant_id=tenant_id,
            dead_letter_id=dead_letter_id,
            actor=actor,
            reason=reason,
            correlation_id=correlation_id,
            owner=owner,
        ),
        what="requeue",
    )


async def requeue_in(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    dead_letter_id: uuid.UUID,
    actor: str,
    reason: str,
    correlation_id: str | None,
    owner: str | None,
) -> RowMapping:
    """:func:`requeue_dead_letter` inside the caller's transaction (same errors)."""
    dl = await dl_q.lock_for_requeue(conn, tenant_id=tenant_id, dead_letter_id=dead_letter_id)
    try:
        run = await runs_q.lock_run(conn, tenant_id, dl["run_id"], owner=owner) if dl else None
    except RunNotFound:
        run = None  # another owner's run: its dead letter does not exist for the caller
    if dl is None or run is None:
        raise DeadLetterNotFound(f"dead letter {dead_letter_id} not found")
    if dl["status"] != "pending":
        raise InvalidState(f"dead letter {dead_letter_id} was already {dl['status']}")
    if run["status"] != RunStatus.FAILED.value:
        raise InvalidState(f"run {run['run_id']} is {run['status']!r}, not failed")
    if run["compacted_at"] is not None:
        # Its input and journal outputs are gone: a re-run could not replay.
        raise InvalidState(
            f"run {run['run_id']} was compacted by maintenance; its payloads are gone, "
            "so it cannot be re-run (submit a new run instead)"
        )
    updated = await _requeue_run(
        conn,
        run,
        dead_letter_id=dead_letter_id,
        actor=actor,
        reason=reason,
        correlation_id=correlation_id,
    )
    await notify(conn)
    return updated


async def _requeue_run(
    conn: AsyncConnection,
    run: RowMapping,
    *,
    dead_letter_id: uuid.UUID,
    actor: str,
    reason: str,
    correlation_id: str | None,
) -> RowMapping:
    """Requeue one failed, locked run (see :func:`requeue_dead_letter`); its dead letter."""
    run_id: uuid.UUID = run["run_id"]
    # Where the fresh budget begins (state machines' max_transitions), read before reopening.
    budget_seq = await steps_q.budget_horizon(
        conn, run_id, tenant_id=run["tenant_id"], below=COMPENSATION_SEQ_BASE
    )
    children: list[uuid.UUID] = []
    cause_reason: str | None = None
    cause_error: str | None = None
    if run["cancel_requested_at"] is not None:
        into = RunStatus.CANCELLING
        await steps_q.reopen_failed_compensations(conn, run_id, tenant_id=run["tenant_id"])
    elif await steps_q.compensation_began(conn, run_id, tenant_id=run["tenant_id"]):
        into = RunStatus.COMPENSATING
        await steps_q.reopen_failed_compensations(conn, run_id, tenant_id=run["tenant_id"])
        cause_reason, cause_error = _cause_being_undone(run)
    else:
        into = RunStatus.QUEUED
        children = await steps_q.reopen_failed_body_steps(conn, run_id, tenant_id=run["tenant_id"])
    slot, waiting = await _slot_for_requeue(conn, run)
    await runs_q.requeue_run(
        conn,
        run_id=run_id,
        status=into,
        reason=cause_reason,
        error=cause_error,
        concurrency_slot=slot,
        blocked_reason=waiting,
    )
    updated = await dl_q.mark_requeued(
        conn,
        tenant_id=run["tenant_id"],
        dead_letter_id=dead_letter_id,
        actor=actor,
        reason=reason,
        correlation_id=correlation_id,
    )
    await events_q.append(
        conn,
        run_id=run_id,
        tenant_id=run["tenant_id"],
        kind=EventKind.DEAD_LETTER_REQUEUED,
        actor=actor,
        data={
            "dead_letter_id": str(dead_letter_id),
            "reason": reason,
            "correlation_id": correlation_id,
            "status": into.value,
            "budget_seq": budget_seq,
            **({} if run["concurrency_key"] is None else {"concurrency_slot": slot}),
        },
    )
    for child_id in children:
        # The parent's ctx.child joins its child again; a failed child is re-run with it
        # (children act for the parent's submitter, so the parent's owner check covers
        # them). A compacted child cannot be re-run: the parent fails again at once.
        try:
            child = await runs_q.lock_run(conn, run["tenant_id"], child_id)
        except RunNotFound:  # archived by maintenance: nothing left to re-run
            continue
        child_letter = await dl_q.pending_for_run(conn, child_id)
        if (
            child["status"] == RunStatus.FAILED.value
            and child_letter is not None
            and child["compacted_at"] is None
        ):
            await _requeue_run(
                conn,
                child,
                dead_letter_id=child_letter["dead_letter_id"],
                actor=actor,
                reason=f"parent run {run_id} requeued: {reason}"[:1000],
                correlation_id=correlation_id,
            )
    return updated


def _cause_being_undone(run: RowMapping) -> tuple[str | None, str | None]:
    """The failure a run requeued into compensation undoes: its reason and error.

    The failed run's error minus what the last compensation added; an authorization
    refusal is not the cause (the re-check passes again before the run is undone).
    """
    if run["reason"] is None or run["reason"] == RunReason.FAILURE_AUTHORIZATION.value:
        return None, None
    error = json.loads(run["error"]) if run["error"] else None
    if isinstance(error, dict):
        for key in ("compensation_failures", "compensation_message", "compensated"):
            error.pop(key, None)
    return run["reason"], None if error is None else json.dumps(error)


async def _slot_for_requeue(
    conn: AsyncConnection, run: RowMapping
) -> tuple[int | None, str | None]:
    """The slot a requeued run takes back: ``(slot, None)`` or ``(None, blocked_reason)``.

    Raises:
        ConcurrencyKeyBusy: every slot is held and the version's ``on_limit`` is reject.
    """
    key = run["concurrency_key"]
    if key is None:
        return None, None
    controls = await slots.controls_for(conn, run["workflow"], run["version"])
    admission = await slots.acquire(
        conn,
        tenant_id=run["tenant_id"],
        workflow=run["workflow"],
        key=key,
        limit=controls.key_limit,
    )
    if admission.slot is not None:
        return admission.slot, None
    if controls.on_limit == "queue":
        return None, slots.waiting_reason(key, admission.limit)
    active = admission.active_run_id
    raise ConcurrencyKeyBusy(
        f"cannot requeue run {run['run_id']}: its concurrency key {key!r} is busy (key_limit "
        f"{admission.limit}): held by active run {active} (the oldest of its active runs)",
        active_run_id=None if active is None else str(active),
        concurrency_key=key,
        key_limit=admission.limit,
    )


async def pending_dead_letter_id(
    db: Database, *, tenant_id: str, run_id: uuid.UUID, owner: str | None = None
) -> uuid.UUID:
    """The run's pending dead letter (for ``POST /runs/{id}/retry``).

    Raises:
        RunNotFound: not this tenant's run.
        InvalidState: the run has no pending dead letter (it is not failed).
    """
    async with db.read() as conn:
        return await pending_dead_letter_in(conn, tenant_id=tenant_id, run_id=run_id, owner=owner)


async def pending_dead_letter_in(
    conn: AsyncConnection, *, tenant_id: str, run_id: uuid.UUID, owner: str | None
) -> uuid.UUID:
    """:func:`pending_dead_letter_id` on the caller's connection (same errors)."""
    run = await runs_q.get_run(conn, tenant_id, run_id, owner=owner)
    found = await dl_q.pending_for_run(conn, run_id)
    if found is None:
        raise InvalidState(f"run {run_id} is {run['status']!r}: nothing to retry")
    return uuid.UUID(str(found["dead_letter_id"]))


async def resume(
    db: Database, *, tenant_id: str, run_id: uuid.UUID, actor: str, owner: str | None = None
) -> RowMapping:
    """Make a waiting or retrying run due now: skip a retry backoff, re-check its waits.

    Timers keep their deadline and unsatisfied waits simply wait again. A
    ``compensating`` or ``cancelling`` run released while a compensation waits out its
    retry backoff resumes likewise, and stays compensating / cancelling: a resume never
    turns an undo back into a run of the body.

    Raises:
        RunNotFound: not this tenant's run.
        InvalidState: the run is not waiting (409).
    """
    return await db.write_retrying(
        lambda conn: resume_in(conn, tenant_id=tenant_id, run_id=run_id, actor=actor, owner=owner),
        what="resume",
    )


async def resume_in(
    conn: AsyncConnection, *, tenant_id: str, run_id: uuid.UUID, actor: str, owner: str | None
) -> RowMapping:
    """:func:`resume` inside the caller's transaction (raises the same errors)."""
    run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
    if not await runs_q.make_due_for_resume(conn, run_id=run_id):
        raise InvalidState(f"run {run_id} is {run['status']!r}, not waiting")
    # A step waiting out its retry backoff tries again now; timers keep their time.
    await steps_q.retry_backoffs_now(conn, run_id, tenant_id=tenant_id)
    await events_q.append(
        conn, run_id=run_id, tenant_id=tenant_id, kind=EventKind.RUN_RESUMED, actor=actor
    )
    await notify(conn)
    return await runs_q.get_run(conn, tenant_id, run_id)


async def pause(
    db: Database,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    actor: str,
    reason: str | None,
    owner: str | None = None,
) -> tuple[RowMapping, bool]:
    """Pause a live run: it takes no new step and is never claimed until unpaused.

    The status stays what it was (docs/adr/0021-pause-is-a-flag-beside-the-status.md);
    ``paused_at``, ``paused_by`` and ``pause_reason`` say who paused it, when and why. An
    attempt in flight finishes and checkpoints, then its worker releases the run at the
    next pause point. Timers, retries, signals and decisions falling due meanwhile stay
    due and are acted on after unpause. Pausing a paused run changes nothing (the first
    pause is kept).

    Returns:
        ``(run row, changed)``: changed is False when the run was already paused.

    Raises:
        RunNotFound: not this tenant's run (or not visible to ``owner``).
        RunFinished: the run is terminal (409).
    """
    return await db.write_retrying(
        lambda conn: pause_in(
            conn, tenant_id=tenant_id, run_id=run_id, actor=actor, reason=reason, owner=owner
        ),
        what="pause",
    )


async def pause_in(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    actor: str,
    reason: str | None,
    owner: str | None,
) -> tuple[RowMapping, bool]:
    """:func:`pause` inside the caller's transaction (same result and errors)."""
    run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
    _require_live(run)
    if run["paused_at"] is not None:
        return run, False
    await runs_q.set_pause(conn, run_id=run_id, paused_by=actor, reason=reason)
    await events_q.append(
        conn,
        run_id=run_id,
        tenant_id=tenant_id,
        kind=EventKind.RUN_PAUSED,
        actor=actor,
        data={"reason": reason, "status": run["status"]},
    )
    return await runs_q.get_run(conn, tenant_id, run_id), True


async def unpause(
    db: Database, *, tenant_id: str, run_id: uuid.UUID, actor: str, owner: str | None = None
) -> RowMapping:
    """Unpause a paused run: claimable again, and whatever fell due meanwhile fires.

    Its ``available_at`` was kept through the pause, so a timer or retry that came due,
    a signal or decision that made it due, or the expired lease of a worker that died
    while it was paused, makes it claimable at once; a wait still in the future keeps
    its time.

    Raises:
        RunNotFound: not this tenant's run (or not visible to ``owner``).
        RunFinished: the run is terminal (409).
        InvalidState: the run is not paused (409).
    """
    return await db.write_retrying(
        lambda conn: unpause_in(conn, tenant_id=tenant_id, run_id=run_id, actor=actor, owner=owner),
        what="unpause",
    )


async def unpause_in(
    conn: AsyncConnection, *, tenant_id: str, run_id: uuid.UUID, actor: str, owner: str | None
) -> RowMapping:
    """:func:`unpause` inside the caller's transaction (same errors)."""
    run = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
    _require_live(run)
    if run["paused_at"] is None:
        raise InvalidState(f"run {run_id} is not paused (status {run['status']!r})")
    await runs_q.clear_pause(conn, run_id=run_id)
    await events_q.append(
        conn,
        run_id=run_id,
        tenant_id=tenant_id,
        kind=EventKind.RUN_UNPAUSED,
        actor=actor,
        data={"paused_by": run["paused_by"], "reason": run["pause_reason"]},
    )
    await notify(conn)
    return await runs_q.get_run(conn, tenant_id, run_id)
