"""What one execution of a run comes to, and the values the executor hands around.

Outcome types (:class:`Completed`, :class:`Failed`, :class:`Suspended`), the reasons a
branch releases the run (:class:`PendingWait`), registered undo actions
(:class:`Compensation`), the cancel point, and how errors and step functions are named in
the journal. Their own module so that the executor, the durable waits, the replay context
and the worker share them without importing each other (docs/architecture.md).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.settings import TracebackMode
from app.core.status import RunReason, RunStatus
from app.core.tracebacks import full_traceback, user_traceback
from app.db.faults import describe, redact
from app.sdk.context import _current_step
from app.sdk.errors import Permanent
from app.sdk.retry import RetryPolicy

log = structlog.get_logger("treadle.engine")


@dataclass(frozen=True, slots=True)
class Completed:
    """The body returned; ``output`` is its JSON text."""

    output: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The run ended without a result: ``status`` with ``reason``.

    ``status`` is ``failed`` (a dead letter is written), ``compensated`` (failed, and every
    compensation succeeded) or ``cancelled``. ``error`` is a JSON-able description.
    """

    reason: RunReason
    error: dict[str, Any] | None
    status: RunStatus = RunStatus.FAILED


@dataclass(frozen=True, slots=True)
class Compensation:
    """An undo action registered by ``ctx.step(..., compensate=fn)``.

    Attributes:
        args: passed before the step's result (``fn(*args, result)``).
        transactional: run as a transactional step (``fn(tx, *args, result)``).
        cancel_only: only a cancel runs it, not a failure (state machines: a failed
            machine is dead-lettered as it stands, for an operator to requeue).
        slot: registering a compensation in an occupied slot replaces the earlier one.
    """

    seq: int
    step_id: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    args: tuple[Any, ...] = ()
    transactional: bool = False
    cancel_only: bool = False
    slot: str | None = None


# Compensation steps get sequence numbers far above any body step (seq of the step they
# undo + this), so they never collide with the body's call order.
COMPENSATION_SEQ_BASE = 1_000_000_000


class CancelPoint(BaseException):
    """Raised in a cancelling run's replay where new work would start.

    Not catchable by ``except Exception``: the body stops there and compensation begins.
    """


WakeCheck = Callable[[AsyncConnection], Awaitable[bool]]
"""Re-checked inside the release transaction: True if the wait is already satisfied (a
signal or decision arrived while the run was being released), so it must not sleep."""


@dataclass(frozen=True, slots=True)
class PendingWait:
    """One branch's reason to release the run.

    Attributes:
        delay: seconds until it is due (DB time); None = only an external event wakes it.
        status: the run status while waiting.
        kind: ``retry``, ``timer``, ``signal`` or ``approval``.
        name: what is awaited (step id, signal or approval name).
        wake_check: see :data:`WakeCheck`.
    """

    delay: float | None
    status: RunStatus
    kind: str
    name: str
    wake_check: WakeCheck | None = None


@dataclass(frozen=True, slots=True)
class Suspended:
    """The run must wait: claimable again after ``delay`` seconds (DB time).

    With ``delay`` None, only a signal or decision wakes it.

    ``waiting_kind`` / ``waiting_name`` say on what (e.g. ``retry`` of step ``charge``).
    """

    status: RunStatus
    delay: float | None
    waiting_kind: str | None = None
    waiting_name: str | None = None
    wake_checks: tuple[WakeCheck, ...] = ()


Outcome = Completed | Failed | Suspended


@dataclass(frozen=True, slots=True)
class _ErrorScope:
    tracebacks: TracebackMode
    run_id: str | None = None
    workflow: str | None = None


_error_scope: ContextVar[_ErrorScope | None] = ContextVar("treadle_error_scope", default=None)


def describe_errors_for(run_id: str, workflow: str, tracebacks: TracebackMode) -> None:
    """Set how :func:`error_info` describes errors in this task and the tasks it starts.

    Called once at the start of an execution (``RunExecution.execute``): its steps run in
    tasks and threads started from there, which inherit the context. Outside any
    execution :func:`error_info` shows user frames only (the safe default).

    Args:
        run_id: the run, named in the worker's log line of each error.
        workflow: its workflow name, likewise.
        tracebacks: ``TREADLE_ERROR_TRACEBACKS``.
    """
    _error_scope.set(_ErrorScope(tracebacks, run_id, workflow))


def outcome_summary(outcome: Outcome) -> tuple[str, str | None, dict[str, Any] | None]:
    """``(run status, reason, error)`` an outcome writes (what the execution's span records)."""
    if isinstance(outcome, Completed):
        return RunStatus.COMPLETED.value, "succeeded", None
    if isinstance(outcome, Failed):
        return outcome.status.value, outcome.reason.value, outcome.error
    return outcome.status.value, None, None


def error_info(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """Describe an exception as ``{type, message, traceback, …extra}`` (JSON-able).

    What the run's tenant reads (a step's or the run's error):

    - ``traceback`` holds only the frames of the user's code, with relative paths
      (:func:`app.core.tracebacks.user_traceback`, docs/adr/0025-user-frames-only.md),
      unless ``TREADLE_ERROR_TRACEBACKS=full`` (see :func:`describe_errors_for`); its
      last 8000 characters are kept.
    - SQL statements and their parameters are cut out of the message and the traceback
      (:func:`app.db.faults.redact`), whether the statement was the product's or a
      transactional step's own.
    - ``type`` and ``message`` are the exception's own (a ``Permanent`` wrapping another
      error names the wrapped one), unfiltered.

    Side effect: the full traceback goes to the worker's log (``treadle.engine``, warning
    ``step error recorded`` or ``run error recorded``) with the run, workflow, step and
    attempt where known: the frames the tenant does not see stay there for the operator.
    """
    inner = (
        exc.error if isinstance(exc, Permanent) and isinstance(exc.error, BaseException) else exc
    )
    scope = _error_scope.get() or _ErrorScope(TracebackMode.USER)
    step = _current_step.get()
    full = redact(full_traceback(exc), exc)
    # The operator's copy: every frame. Statements are redacted here too, as in the
    # tenant's copy: a statement's parameters are the tenant's data, not the operator's.
    log.warning(
        "step error recorded" if step is not None else "run error recorded",
        run_id=str(step.run_id) if step is not None else scope.run_id,
        workflow=step.workflow if step is not None else scope.workflow,
        step_id=step.step_id if step is not None else extra.get("step_id"),
        attempt=step.attempt if step is not None else None,
        error_type=type(inner).__name__,
        exception=full,
    )
    shown = full if scope.tracebacks == TracebackMode.FULL else redact(user_traceback(exc), exc)
    return {
        "type": type(inner).__name__,
        "message": describe(inner),
        "traceback": shown[-8000:],
        **extra,
    }


def step_name(fn: Callable[..., Any]) -> str:
    """The journaled name of a step function (its ``__qualname__``)."""
    # functools.partial and similar wrappers: name the wrapped function, never repr()
    # (it embeds a memory address, which would differ on replay in another process).
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        raise TypeError(f"cannot name step function {fn!r}; pass name=")
    return str(name)
