"""Transactional steps: the step's database writes commit with its checkpoint, once.

One attempt is ONE write transaction (after DBOS transactions): the user function runs on
an :class:`AsyncSession` bound to it, then the fenced ``UPDATE runs … WHERE fence =
:fence``, the journal entry and the step's events are written
(:meth:`app.engine.journal.RunJournal.record_transaction`), then everything commits. A
fence that moved (cancel, lease taken over) makes that UPDATE match zero rows:
``LeaseLost`` rolls the user's writes back with the rest.

Why the fence is checked *after* the user function rather than before it: on PostgreSQL
the check locks the run row, and holding that lock while user code runs would block
cancels and every heartbeat of the worker; checked last, the lock is held for the commit
only, and a fence moved while the function ran is still caught. On SQLite the transaction
holds the database write lock from ``BEGIN IMMEDIATE``, so the fence cannot move during
it at all.

Why no separate "attempt started" write on success: a crash inside the transaction rolls
the attempt back, so it leaves nothing to account for; one commit per transactional step.
A failed attempt is recorded (started + failed) after the rollback, in its own fenced
transaction, so the retry policy counts it like any step's.

Why a deadlock or serialization failure re-runs the function at once, uncounted: the
database rolled the whole transaction back, the function's writes included, so calling it
again on a fresh session keeps them exactly once (up to ``TREADLE_DB_RETRY_ATTEMPTS``
calls; :func:`app.db.faults.retry_conflicts`). The function must therefore do nothing but
database work through its session.

Why other database faults split two ways (:attr:`app.db.faults.DbFault.may_be_the_callers`):
a statement or lock timeout, or a conflict past the retries, may be the function's own
doing (a slow query of its own), so it is a failed attempt and the step's ``RetryPolicy``
ends it; a fault no query of the function can cause (unreachable, pool timeout, disk full,
a system error, an SQLSTATE nobody listed) raises ``CheckpointFault``: everything rolled
back, the run is given back and the attempt is not counted, as for any checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.core import json, tracing
from app.core.errors import CheckpointFault, InvalidInput, PayloadTooLarge
from app.core.status import RunReason, StepStatus
from app.db.faults import classify, retry_conflicts
from app.sdk.context import StepInfo, _current_step
from app.sdk.errors import Permanent
from app.sdk.retry import RetryPolicy

if TYPE_CHECKING:
    from app.engine.executor import RunExecution


class _BadOutput(Exception):
    """The function's result does not match its return annotation or is too large."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def session_for(conn: AsyncConnection) -> AsyncSession:
    """An ``AsyncSession`` working inside a SAVEPOINT of ``conn``'s open transaction.

    ``create_savepoint``: the session's ``commit()`` releases its savepoint and its
    ``rollback()`` undoes only the function's own writes; neither can end the step's
    transaction, whose commit is the checkpoint's.
    """
    return AsyncSession(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)


async def attempt(
    ex: RunExecution,
    *,
    step_id: str,
    seq: int,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    retry: RetryPolicy,
    timeout: float | None,
    attempt: int,
    adapter: TypeAdapter[Any],
    detail: str | None,
    kind: str = "transaction",
    started: bool = False,
) -> Any:
    """Run one attempt of a transactional step (see ``WorkflowContext.transaction``).

    ``kind`` is journaled: ``transaction``, or ``compensation`` for a transactional undo.
    ``started``: the attempt's start record is already journaled (an attempt after a retry
    backoff, docs/adr/0050-an-attempt-counts-when-it-starts.md), so neither the
    checkpoint nor a failure writes it again.

    Returns:
        The validated result (as a replay would return it), or the executor's retry marker
        after a failed attempt that will be retried.

    Raises:
        LeaseLost: the fence moved; the function's writes were rolled back.
        StepFailed: the step gave up (``Permanent``, attempts exhausted, timed out, or a
            result that does not match the return annotation).
    """
    info = StepInfo(
        run_id=ex.run_id,
        step_id=step_id,
        attempt=attempt,
        idempotency_key=f"{ex.run_id}:{step_id}",
        workflow=ex.definition.name,
        logger=ex.logbook,
    )
    token = _current_step.set(info)

    # Where the last attempt got to: an error before the function ran (checkout, BEGIN)
    # is the database's whatever its type; inside it, only an error the database raised
    # can be a fault (a step may raise ConnectionError about its own business).
    in_function = False

    async def once() -> str:
        nonlocal in_function
        in_function = False
        async with ex.journal.step_transaction() as conn:
            session = session_for(conn)
            in_function = True
            try:
                call = fn(session, *args)
                value = await tracing.step_call(
                    asyncio.wait_for(call, timeout) if timeout else call,
                    step_id=step_id,
                    name=name,
                    attempt=attempt,
                    kind=kind,
                )
                # Flush and release the savepoint; the outer transaction stays open.
                await session.commit()
            finally:
                await session.close()
            in_function = False
            try:
                payload = adapter.dump_python(adapter.validate_python(value), mode="json")
                text = json.dumps_limited(payload, ex.settings.max_payload_bytes, "step output")
            except (PayloadTooLarge, InvalidInput, ValueError, TypeError) as exc:
                raise _BadOutput(exc) from exc
            # The fenced write: zero rows raises LeaseLost, which rolls back fn's writes.
            await ex.journal.record_transaction(
                conn,
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                attempt=attempt,
                max_attempts=retry.max_attempts,
                detail=detail,
                output=text,
                started=started,
            )
        return text

    try:
        # A deadlock or serialization failure rolled fn's writes back with the rest, so
        # running the whole transaction again keeps them exactly once. A database error
        # fn's own queries may cause (the caller's fault, a statement or lock timeout, a
        # conflict past the retries) is a failed attempt under the step's RetryPolicy,
        # like any error of fn; any other fault gives the run back (below).
        text = await retry_conflicts(
            once, attempts=ex.settings.db_retry_attempts, what="transactional step"
        )
    except _BadOutput as exc:
        await _start_failed_attempt(ex, step_id, seq, name, retry, attempt, detail, kind, started)
        await ex.give_up(
            step_id,
            StepStatus.FAILED,
            RunReason.FAILURE_NON_RETRYABLE,
            _error_info(exc.cause),
            attempt,
        )
    except Permanent as exc:
        await _start_failed_attempt(ex, step_id, seq, name, retry, attempt, detail, kind, started)
        await ex.give_up(
            step_id, StepStatus.FAILED, RunReason.FAILURE_NON_RETRYABLE, _error_info(exc), attempt
        )
    except TimeoutError as exc:
        await _start_failed_attempt(ex, step_id, seq, name, retry, attempt, detail, kind, started)
        return await ex.after_error(step_id, retry, attempt, exc, timed_out=timeout)
    except Exception as exc:  # any other error is retryable by contract, but faults
        fault = classify(exc)
        raised_by_database = not in_function or isinstance(exc, (DBAPIError, PoolTimeout))
        if fault is not None and raised_by_database and not fault.may_be_the_callers:
            # The database's fault, not the function's (unreachable, no pooled connection,
            # disk full, a system error, an unknown SQLSTATE): the transaction rolled back,
            # so nothing happened; the run is given back instead of spending an attempt.
            raise CheckpointFault(ex.run_id, fault.value) from exc
        await _start_failed_attempt(ex, step_id, seq, name, retry, attempt, detail, kind, started)
        return await ex.after_error(step_id, retry, attempt, exc, timed_out=None)
    finally:
        _current_step.reset(token)
    return adapter.validate_python(json.loads(text))


def _error_info(exc: BaseException) -> dict[str, Any]:
    from app.engine.outcomes import error_info

    return error_info(exc)


async def _start_failed_attempt(
    ex: RunExecution,
    step_id: str,
    seq: int,
    name: str,
    retry: RetryPolicy,
    attempt: int,
    detail: str | None,
    kind: str,
    started: bool,
) -> None:
    # The attempt's transaction was rolled back; journal that it happened, so the failure
    # written next (by the executor) counts against the retry budget. Unless its start
    # record was written before the transaction (an attempt after a backoff).
    if started:
        return
    await ex.journal.start_attempt(
        step_id=step_id,
        seq=seq,
        kind=kind,
        name=name,
        attempt=attempt,
        max_attempts=retry.max_attempts,
        detail=detail,
    )
