"""Durable waits: timers, signals, approvals, and journaled values.

A wait is journaled as a step of kind ``timer`` / ``signal`` / ``approval`` with status
``waiting`` and a ``deadline`` (database time, fixed when the wait is first recorded, so
timeouts keep counting across restarts). When it cannot be satisfied yet, the branch asks
the execution to release the run; a signal or decision wakes it again. Every write is a
:class:`app.engine.journal.RunJournal` method (``ex.journal``); this module decides what
to write and when, never how.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json, tracing
from app.core.status import AccessPolicy, RunReason, RunStatus, StepStatus
from app.engine.outcomes import PendingWait
from app.engine.submit import SubmitRequest, insert_prepared
from app.sdk.context import ApprovalDecision
from app.sdk.errors import ApprovalRejected, StepFailed, WaitTimedOut

if TYPE_CHECKING:
    from app.engine.executor import RunExecution
    from app.sdk.context import WorkflowContext

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def check_wait_name(name: str) -> None:
    """Signal and approval names travel in URLs: 1..200 of ``[A-Za-z0-9_.-]``.

    Raises:
        ValueError: anything else.
    """
    if not name or len(name) > 200 or not set(name) <= _NAME_CHARS:
        raise ValueError(f"wait name {name!r} must be 1..200 characters of letters, digits, _ . -")


@dataclass(frozen=True, slots=True)
class ApprovalConfig:
    """Settings of one approval, journaled in the step's ``detail``."""

    group: str | None
    payload: Any
    timeout: float | None
    approvals: int
    self_approval: bool

    def as_detail(self) -> dict[str, Any]:
        """JSON form stored in ``steps.detail`` (read by the approvals endpoint)."""
        return {
            "group": self.group,
            "payload": self.payload,
            "approvals": self.approvals,
            "self_approval": self.self_approval,
            "timeout": self.timeout,
        }


def resolve_decisions(decisions: list[RowMapping], needed: int) -> ApprovalDecision | None:
    """Decide an approval from its decision rows (None while still open).

    Any rejection rejects; ``needed`` distinct approvals approve.
    """
    for row in decisions:
        if row["decision"] == "reject":
            return ApprovalDecision(
                approved=False,
                decided_by=[r["decided_by"] for r in decisions],
                payload=json.loads(row["payload"]),
                comment=row["comment"],
            )
    approvers = [r for r in decisions if r["decision"] == "approve"]
    if len(approvers) >= needed:
        last = approvers[needed - 1]
        return ApprovalDecision(
            approved=True,
            decided_by=[r["decided_by"] for r in approvers[:needed]],
            payload=json.loads(last["payload"]),
            comment=last["comment"],
        )
    return None


def _remaining(ex: RunExecution, deadline: datetime | None) -> float | None:
    return None if deadline is None else (deadline - ex.db_now()).total_seconds()


async def timer(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    seconds: float | None = None,
    until: datetime | None = None,
) -> None:
    """``ctx.sleep`` / ``ctx.sleep_until``: due at a fixed database time."""
    if entry is not None and entry["status"] == StepStatus.SUCCEEDED:
        return
    ex.cancel_point()
    await ex.pause_point()
    if entry is None:
        deadline = until if until is not None else ex.db_now() + timedelta(seconds=seconds or 0)

        await ex.journal.waits.start_wait(
            step_id=step_id, seq=seq, kind="timer", name="sleep", deadline=deadline
        )
    else:
        deadline = entry["deadline"]
    remaining = _remaining(ex, deadline) or 0.0
    if remaining > ex.settings.inline_retry_max_seconds:
        await ex.suspend(PendingWait(remaining, RunStatus.WAITING_TIMER, "timer", step_id))
    if remaining > 0:
        async with ex.idle():  # a short timer does not hold another branch's release
            await asyncio.sleep(remaining)

    await ex.journal.waits.fire_timer(step_id=step_id, deadline=deadline)


async def open_wait(
    ex: RunExecution,
    *,
    step_id: str,
    kind: str,
    entry: RowMapping | None,
    timeout: float | None,
) -> datetime | None:
    """What every durable wait does before it looks for its value (signal, event).

    Called when the journal holds no delivered value for the wait: a journaled timeout is
    raised again on replay; a cancel or a pause is honoured here, before the wait is
    recorded. Returns the wait's deadline (aware UTC, database time): the journaled one on
    a replay, else now + ``timeout`` seconds, ``None`` without a timeout.

    Raises:
        WaitTimedOut: the journal says this wait timed out.
    """
    if entry is not None and entry["status"] == StepStatus.TIMED_OUT:
        raise WaitTimedOut(step_id, kind, entry["deadline"].isoformat())
    ex.cancel_point()
    await ex.pause_point()
    if entry is not None:
        deadline: datetime | None = entry["deadline"]
        return deadline
    return ex.db_now() + timedelta(seconds=timeout) if timeout is not None else None


async def signal(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    name: str,
    timeout: float | None,
) -> Any:
    """``ctx.signal``: consume the oldest buffered signal of ``name``, or wait for one."""
    if entry is not None and entry["status"] == StepStatus.SUCCEEDED:
        return json.loads(entry["output"])
    deadline = await open_wait(ex, step_id=step_id, kind="signal", entry=entry, timeout=timeout)
    taken = await ex.journal.waits.take_signal(
        step_id=step_id,
        seq=seq,
        name=name,
        deadline=deadline,
        record=None if entry is not None else {"signal": name, "timeout": timeout},
    )
    if taken.found:
        return json.loads(taken.value)
    if taken.timed_out:
        assert deadline is not None
        raise WaitTimedOut(step_id, "signal", deadline.isoformat())
    remaining = _remaining(ex, deadline)
    await ex.suspend(
        PendingWait(
            max(remaining, 0.0) if remaining is not None else None,
            RunStatus.WAITING_SIGNAL,
            "signal",
            name,
            ex.journal.waits.signal_arrived(name),
        )
    )


async def approval(
    ctx: WorkflowContext,
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    config: ApprovalConfig,
    on_reject: Callable[[ApprovalDecision], Any] | None,
) -> ApprovalDecision:
    """``ctx.approval``: wait until enough approvers approve, one rejects, or it times out.

    The journal keeps the decision as the step's output either way: ``succeeded`` when
    approved, ``failed`` with reason ``rejected_by_approver`` when rejected (runs journaled
    before rejections were ``failed`` show theirs as ``succeeded``; both replay alike).
    """
    if entry is not None and (
        entry["status"] == StepStatus.SUCCEEDED
        or (entry["status"] == StepStatus.FAILED and entry["output"] is not None)
    ):
        decision = ApprovalDecision.model_validate(json.loads(entry["output"]))
    elif entry is not None and entry["status"] == StepStatus.TIMED_OUT:
        raise WaitTimedOut(step_id, "approval", entry["deadline"].isoformat())
    else:
        ex.cancel_point()
        await ex.pause_point()
        decision = await _await_decision(ex, step_id=step_id, seq=seq, entry=entry, config=config)
    if decision.approved:
        return decision
    if on_reject is not None:
        await ctx.step(on_reject, decision, name=f"{step_id}.on_reject")
        return decision
    raise ApprovalRejected(step_id, decision.decided_by[-1], decision.comment)


def _rejection(step_id: str, decision: ApprovalDecision) -> dict[str, Any]:
    # The rejected approval step's error: who rejected and why, in ApprovalRejected's
    # words, with the step reason docs/api.md lists for it.
    rejected = ApprovalRejected(step_id, decision.decided_by[-1], decision.comment)
    return {
        "type": "ApprovalRejected",
        "message": rejected.message,
        "reason": RunReason.REJECTED_BY_APPROVER.value,
        "decided_by": decision.decided_by,
    }


async def _await_decision(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    config: ApprovalConfig,
) -> ApprovalDecision:
    if entry is not None:
        deadline: datetime | None = entry["deadline"]
        needed = int((json.loads(entry["detail"]) or {}).get("approvals", config.approvals))
    else:
        deadline = (
            ex.db_now() + timedelta(seconds=config.timeout) if config.timeout is not None else None
        )
        needed = config.approvals
    detail = config.as_detail()
    json.dumps_limited(detail, ex.settings.max_payload_bytes, "approval payload")

    def decide(rows: list[RowMapping]) -> ApprovalDecision | None:
        return resolve_decisions(rows, needed)

    taken = await ex.journal.waits.resolve_approval(
        step_id=step_id,
        seq=seq,
        name=step_id.split("#")[0],  # the approval's name, as ctx.approval passes it
        deadline=deadline,
        record=None if entry is not None else detail,
        decide=decide,
        rejection=lambda decision: _rejection(step_id, decision),
    )
    if taken.found:
        result: ApprovalDecision = taken.value
        return result
    if taken.timed_out:
        assert deadline is not None
        raise WaitTimedOut(step_id, "approval", deadline.isoformat())

    decided = ex.journal.waits.decision_made(step_id, decide)
    remaining = _remaining(ex, deadline)
    await ex.suspend(
        PendingWait(
            max(remaining, 0.0) if remaining is not None else None,
            RunStatus.WAITING_APPROVAL,
            "approval",
            step_id,
            decided,
        )
    )
    raise AssertionError("unreachable")


async def value(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    produce: Callable[[], Any],
    decode: Callable[[Any], Any],
) -> Any:
    """``ctx.now`` / ``uuid`` / ``random``: produced once, journaled, replayed verbatim."""
    if entry is not None:
        return decode(json.loads(entry["output"]))
    ex.cancel_point()
    await ex.pause_point()
    produced = produce()
    text = json.dumps(produced)

    await ex.journal.waits.record_value(
        step_id=step_id, seq=seq, name=step_id.split("#")[0], output=text
    )
    return decode(json.loads(text))


async def label(
    ex: RunExecution, *, step_id: str, seq: int, entry: RowMapping | None, key: str, value: str
) -> None:
    """``ctx.set_label``: the label and its journal entry in one fenced write, once.

    A replay (``entry`` journaled) writes nothing: the label was written with the entry.
    """
    if entry is not None:
        return
    ex.cancel_point()

    await ex.journal.waits.record_label(step_id=step_id, seq=seq, key=key, value=value)


async def child(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    entry: RowMapping | None,
    workflow: str,
    input_value: Any,
    version: str | None,
    detached: bool,
    labels: dict[str, str] | None = None,
) -> Any:
    """``ctx.child`` / ``ctx.start_child``: a child run of the same tenant.

    The child is created in the same fenced transaction that journals the wait, with the
    idempotency key ``<run_id>:<step_id>``, so a crash never creates it twice. Detached:
    returns the child's run id at once. Joined: waits (``waiting_child``) for its result.

    Raises:
        StepFailed: a joined child ended without completing (reason of the child).
    """
    if entry is not None and entry["status"] == StepStatus.SUCCEEDED:
        return json.loads(entry["output"])
    if entry is not None and entry["status"] in (StepStatus.FAILED, StepStatus.TIMED_OUT):
        err = json.loads(entry["error"]) or {}
        raise StepFailed(
            step_id,
            str(err.get("reason", "failure_non_retryable")),
            "ChildFailed",
            str(err.get("message", "")),
            1,
        )
    ex.cancel_point()
    await ex.pause_point()
    if entry is None:
        request = SubmitRequest(
            workflow=workflow,
            input=input_value,
            version=version,
            idempotency_key=f"{ex.run_id}:{step_id}",
            labels=labels or {},
        )
        input_text, resolved = await ex.submitter.prepare(request)
        # A child is at least as private as its parent: an owner-policy parent's children
        # are the owner's too, whatever their own definition says.
        access = AccessPolicy.stricter(
            ex.run["access"], await ex.submitter.access(workflow, resolved)
        ).value

        def check_count(started: int) -> None:
            # Counted under the fence, in the transaction that creates the child.
            limit = ex.settings.max_children_per_run
            if started >= limit:
                ex.ceiling(
                    "max_children_per_run",
                    f"run started {started} children, TREADLE_MAX_CHILDREN_PER_RUN={limit}",
                    limit,
                )

        async def insert(conn: AsyncConnection) -> RowMapping:
            row, _ = await insert_prepared(
                conn,
                request,
                input_text,
                resolved,
                tenant_id=ex.tenant_id,
                subject=ex.run["created_by"],
                parent_run_id=ex.run_id,
                # A child acts for the parent's submitter: same key, re-checked likewise.
                api_key_id=ex.run["api_key_id"],
                access=access,
                # In the parent's trace, under the execution that creates it.
                trace=tracing.inherit(ex.run),
            )
            return row

        child_id = await ex.journal.waits.create_child(
            step_id=step_id,
            seq=seq,
            workflow=workflow,
            detached=detached,
            insert=insert,
            check_count=check_count,
        )
        if detached:
            return child_id
    else:
        child_id = (json.loads(entry["detail"]) or {})["child_run_id"]
    return await _join_child(ex, step_id=step_id, child_id=uuid.UUID(child_id))


async def _join_child(ex: RunExecution, *, step_id: str, child_id: uuid.UUID) -> Any:
    taken = await ex.journal.waits.settle_child(step_id=step_id, child_id=child_id)
    if taken.found:
        return json.loads(taken.value)
    if taken.failed is not None:
        reason, message = taken.failed
        raise StepFailed(step_id, reason, "ChildFailed", message, 1)
    finished = ex.journal.waits.child_finished(child_id)
    await ex.suspend(PendingWait(None, RunStatus.WAITING_CHILD, "child", str(child_id), finished))
