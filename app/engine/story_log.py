"""The worker's story of a run, as log lines: claimed, each attempt, retries, waits, outcome.

One owner for what the worker says about a run, so the executor and the worker each call
a few functions at the points where the journal records the same facts. Every line is
at info and carries the run's context, bound once per execution with :func:`bind_run`
(``run_id``, ``workflow``, ``version``, ``tenant``, ``worker_id``, ``claim``: the run's
claim count, not a step attempt) plus, inside an attempt, ``step_id`` and ``attempt``.
Step code that logs through structlog or stdlib logging gets the same fields.

Volume: two lines per step attempt on :data:`app.core.logging.STEP_LOGGER`
(``TREADLE_STEP_LOG_LEVEL``), a handful per run on ``treadle.run``
(``TREADLE_LOG_LEVEL``). Field list and example lines: docs/operations.md#logs.

The lines describe what this execution did; the journal stays the record (a line may be
missing if the process dies right after a checkpoint, and a replay logs nothing for the
steps it reads from the journal).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import RowMapping

from app.core.logging import STEP_LOGGER
from app.engine.outcomes import Completed, Failed, Outcome, PendingWait, Suspended
from app.sdk.errors import StepFailed

log = structlog.get_logger("treadle.run")
step_log = structlog.get_logger(STEP_LOGGER)

# Error messages are the step's own text: bounded, so one huge message cannot flood.
_MESSAGE_CHARS = 300

# When this execution of the run began (monotonic s); one per task context.
_claimed_at: ContextVar[float | None] = ContextVar("treadle_claimed_at", default=None)


def bind_run(row: RowMapping, worker_id: str) -> None:
    """Bind the run's fields to this task's log context and log ``run claimed``.

    Call at the top of the task executing the run (the worker's per-run task): the
    binding lives in that task's own context copy (``asyncio.create_task`` copies the
    context), so it needs no reset and reaches the step tasks it creates, and threads of
    sync steps (``asyncio.to_thread`` copies it too).

    Args:
        row: the claimed run (``run_id``, ``workflow``, ``version``, ``tenant_id``,
            ``attempt``: the claim count).
        worker_id: this worker's id.
    """
    structlog.contextvars.bind_contextvars(
        run_id=str(row["run_id"]),
        workflow=row["workflow"],
        version=row["version"],
        tenant=row["tenant_id"],
        worker_id=worker_id,
        claim=int(row["attempt"]),
    )
    _claimed_at.set(time.monotonic())
    log.info("run claimed", status=row["status"])


def _since_claim_ms() -> float | None:
    claimed = _claimed_at.get()
    return None if claimed is None else round((time.monotonic() - claimed) * 1000, 3)


def step_started(step_id: str, attempt: int, *, kind: str, name: str) -> Mapping[str, Token[Any]]:
    """Bind ``step_id`` / ``attempt`` to the log context and log ``step started``.

    Returns:
        The context tokens, for :func:`step_finished` to unbind.
    """
    tokens = structlog.contextvars.bind_contextvars(step_id=step_id, attempt=attempt)
    step_log.info("step started", kind=kind, name=name)
    return tokens


def step_finished(
    tokens: Mapping[str, Token[Any]],
    outcome: str,
    seconds: float,
    error: BaseException | None,
) -> None:
    """Log ``step finished`` for the attempt :func:`step_started` began, then unbind.

    Args:
        tokens: what :func:`step_started` returned.
        outcome: ``succeeded`` or ``retry`` (another attempt is scheduled: see
            :func:`retry_scheduled`); anything else means the attempt raised, and
            ``error`` says what: a :class:`StepFailed` is ``failed`` (with ``reason`` and
            ``error_type``), a cancellation or lost lease ``interrupted``.
        seconds: the attempt's duration (logged as ``duration_ms``).
        error: the exception the attempt raised, if it did.
    """
    fields: dict[str, Any] = {"duration_ms": round(seconds * 1000, 3)}
    if outcome not in ("succeeded", "retry"):
        if isinstance(error, StepFailed):
            outcome = "failed"
            fields.update(
                reason=error.reason,
                error_type=error.error_type,
                message=error.message[:_MESSAGE_CHARS],
            )
        else:
            # Cancelled (drain, a lost lease, the run's cancel or failure elsewhere) or
            # the checkpoint met a fault: the journal keeps the attempt as interrupted.
            outcome = "interrupted"
            fields["error_type"] = type(error).__name__ if error is not None else None
    try:
        step_log.info("step finished", outcome=outcome, **fields)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def retry_scheduled(attempt: int, delay: float, due: datetime, error: Mapping[str, Any]) -> None:
    """Log ``step retry scheduled``: attempt ``attempt`` failed, the next is due at ``due``.

    Logged inside the failed attempt (its ``step_id`` and ``attempt`` are bound).

    Args:
        attempt: the failed attempt (``next_attempt`` is the one after it).
        delay: seconds until the next attempt (``retry_in_seconds``).
        due: database time of the next attempt (``next_attempt_at``, ISO 8601).
        error: the failed attempt's ``{type, message}``.
    """
    log.info(
        "step retry scheduled",
        next_attempt=attempt + 1,
        error_type=error.get("type"),
        message=str(error.get("message", ""))[:_MESSAGE_CHARS],
        retry_in_seconds=round(delay, 3),
        next_attempt_at=due.isoformat(),
    )


def waiting(wait: PendingWait, now: datetime) -> None:
    """Log ``wait started``: a branch of the run waits on ``wait`` (database time ``now``).

    Fields: ``wait_kind`` (``retry``, ``timer``, ``signal``, ``approval``, ``child``,
    ``pause``), ``wait_name`` (step id, signal or approval name, child run id) and
    ``deadline`` (ISO 8601, None when only an event ends it).
    """
    deadline = None if wait.delay is None else now + timedelta(seconds=wait.delay)
    log.info(
        "wait started",
        wait_kind=wait.kind,
        wait_name=wait.name,
        deadline=None if deadline is None else deadline.isoformat(),
    )


def run_outcome(outcome: Outcome) -> None:
    """Log what this execution's outcome, just written, did: ``run finished`` or released.

    A finished run (:class:`Completed` / :class:`Failed`) logs ``run finished`` with
    ``status``, ``reason`` and, if failed, ``error_type`` (the run's error: ``StepFailed``
    when a step's failure escaped the body) and ``failed_step``; a :class:`Suspended` one logs
    ``run released`` with the ``status`` it waits in, ``waiting_on`` / ``wait_name`` and
    ``resume_in_seconds``. Both carry ``execution_ms``, the time since :func:`bind_run`.
    """
    elapsed = _since_claim_ms()
    if isinstance(outcome, Completed):
        log.info("run finished", status="completed", reason="succeeded", execution_ms=elapsed)
    elif isinstance(outcome, Failed):
        error = outcome.error or {}
        log.info(
            "run finished",
            status=outcome.status.value,
            reason=outcome.reason.value,
            error_type=error.get("type"),
            failed_step=error.get("step_id"),
            execution_ms=elapsed,
        )
    elif isinstance(outcome, Suspended):
        log.info(
            "run released",
            status=outcome.status.value,
            waiting_on=outcome.waiting_kind,
            wait_name=outcome.waiting_name,
            resume_in_seconds=outcome.delay,
            execution_ms=elapsed,
        )


def given_back(why: str, delay: float) -> None:
    """Log ``run released`` for a run handed back unfinished (``why``: drain, a fault)."""
    log.info(
        "run released",
        status="queued",
        why=why,
        resume_in_seconds=delay,
        execution_ms=_since_claim_ms(),
    )
