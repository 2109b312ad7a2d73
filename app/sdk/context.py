"""The context a workflow body receives: its only door to durable operations."""

from __future__ import annotations

import abc
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel

from app.core import tracing
from app.sdk.events import ReceivedEvent
from app.sdk.logger import DISCARD, RunLogger
from app.sdk.retry import RetryPolicy

if TYPE_CHECKING:
    from app.sdk.workflow import WorkflowDefinition

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step may know about itself (read with :func:`current_step`).

    Attributes:
        run_id: the run.
        step_id: the journaled step id (unique within the run).
        attempt: 1-based attempt number.
        idempotency_key: ``"<run_id>:<step_id>"``, stable across attempts and replays;
            pass it to external APIs so a retried attempt is not applied twice.
        workflow: workflow name.
        logger: the run's ``ctx.logger``; lines logged here are kept with this attempt.
    """

    run_id: uuid.UUID
    step_id: str
    attempt: int
    idempotency_key: str
    workflow: str
    logger: RunLogger = field(default=DISCARD, repr=False, compare=False)


_current_step: ContextVar[StepInfo | None] = ContextVar("treadle_current_step", default=None)


def current_step() -> StepInfo:
    """Return the :class:`StepInfo` of the step executing in this task or thread.

    Raises:
        RuntimeError: called outside a step.
    """
    info = _current_step.get()
    if info is None:
        raise RuntimeError("current_step() is only available while a step executes")
    return info


class ApprovalDecision(BaseModel):
    """What ``ctx.approval`` returns.

    Attributes:
        approved: True once enough approvers approved; False after a rejection (only
            returned when the workflow gave ``on_reject``).
        decided_by: subjects who decided, in order.
        payload: the deciding approver's payload (the rejecter's, or the last approver's).
        comment: the deciding approver's comment.
    """

    approved: bool
    decided_by: list[str]
    payload: Any = None
    comment: str | None = None


class WorkflowContext(abc.ABC):
    """Durable operations for workflow code (DESIGN §1a).

    Workflow bodies must be deterministic: anything that reads the clock, randomness or the
    outside world belongs in a step. The engine replays the body from the start after every
    suspension or crash, returning journaled results instead of re-running steps.
    """

    run_id: uuid.UUID
    workflow: str
    concurrency_key: str | None
    """The run's concurrency key (a state machine's parent), or None."""
    logger: RunLogger
    """Log lines kept with the run, replay-safe (:class:`app.sdk.logger.RunLogger`)."""

    @overload
    def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[[Any], Any] | None = None,
        compensate_retry: RetryPolicy | None = None,
    ) -> Awaitable[T]: ...

    @overload
    def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[[Any], Any] | None = None,
        compensate_retry: RetryPolicy | None = None,
    ) -> Awaitable[T]: ...

    def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[[Any], Any] | None = None,
        compensate_retry: RetryPolicy | None = None,
    ) -> Awaitable[Any]:
        """Run ``fn(*args)`` as a journaled step, at least once.

        The step id is assigned when this method is *called* (call order, not completion
        order), so ``asyncio.gather(ctx.step(a), ctx.step(b))`` replays identically.

        Args:
            fn: a sync or async function; sync functions run in a worker thread.
            *args: positional arguments (not journaled; keep them derived from the input
                and earlier step results so replays pass the same values).
            name: step name; default the function's ``__qualname__``. A name used again in
                one run gets ``#2``, ``#3`` … appended.
            retry: retry policy (default :data:`app.sdk.retry.DEFAULT_RETRY`).
            timeout: seconds per attempt; an attempt that outruns it is ``timed_out``.
            compensate: undo action, registered only once this step succeeds, called with
                the step's result if an error later escapes the workflow or the run is
                cancelled. Compensations run in reverse call order, each journaled as
                ``<step_id>__compensate``; one failing does not stop the others.
            compensate_retry: retry policy of the undo action (default: one attempt).

        Returns:
            An awaitable of the step's result, validated against ``fn``'s return annotation
            (so the first execution and every replay return the same type).

        Raises:
            StepFailed: the step gave up (``Permanent``, attempts exhausted, timed out).
            ValueError: ``timeout`` is not positive.
        """
        return self._step(
            fn,
            args,
            name=name,
            retry=retry,
            timeout=timeout,
            compensate=compensate,
            compensate_retry=compensate_retry,
        )

    @abc.abstractmethod
    def _step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | None,
        compensate: Callable[[Any], Any] | None = None,
        compensate_retry: RetryPolicy | None = None,
    ) -> Awaitable[Any]:
        """Engine hook behind :meth:`step`."""

    def transaction(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Awaitable[T]:
        """Run ``fn(tx, *args)`` as a step whose database writes commit exactly once.

        ``tx`` is a SQLAlchemy :class:`~sqlalchemy.ext.asyncio.AsyncSession` bound to the
        very transaction that then checkpoints the step: ``fn``'s writes, the fenced check
        that this worker still holds the run (``UPDATE runs … WHERE fence = :fence``) and
        the journal entry commit together or not at all. So a crash, a lost lease or a
        cancel before the commit leaves no trace of ``fn``, and once it committed a replay
        returns the journaled result without calling ``fn`` again (DESIGN §1a, after DBOS
        transactions).

        The business tables are the user's and live in Treadle's database (the one of
        ``TREADLE_DATABASE_URL``). The session works inside a SAVEPOINT of the step's
        transaction: ``await tx.commit()`` only releases the savepoint (the real commit is
        the checkpoint's), ``await tx.rollback()`` undoes ``fn``'s writes so far. Do not
        touch Treadle's own tables through it. On SQLite the transaction holds the
        database's write lock while ``fn`` runs: keep it short and never await other
        durable work inside it.

        Args:
            fn: ``async def fn(tx: AsyncSession, *args) -> T``.
            *args: positional arguments after ``tx`` (not journaled; derive them from the
                input and earlier results).
            name: step name; default the function's ``__qualname__``.
            retry: retry policy (default :data:`app.sdk.retry.DEFAULT_RETRY`). An
                exception in ``fn`` rolls its writes back and counts as a failed attempt;
                ``Permanent`` ends retries at once.
            timeout: seconds per attempt (the transaction is rolled back when exceeded).

        Returns:
            An awaitable of ``fn``'s result, validated against its return annotation and
            journaled like :meth:`step` results.

        Raises:
            StepFailed: the step gave up (``Permanent``, attempts exhausted, timed out).
            TypeError: ``fn`` is not an ``async def`` function.
            ValueError: ``timeout`` is not positive.
        """
        return self._transaction(fn, args, name=name, retry=retry, timeout=timeout)

    @abc.abstractmethod
    def _transaction(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        *,
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | None,
        on_cancel: Callable[..., Awaitable[Any]] | None = None,
        on_cancel_args: tuple[Any, ...] = (),
        on_cancel_retry: RetryPolicy | None = None,
    ) -> Awaitable[Any]:
        """Engine hook behind :meth:`transaction`.

        ``on_cancel`` (used by state machines) is an undo action that only a *cancel*
        triggers, run as a transactional step ``on_cancel(tx, *on_cancel_args, result)``;
        a later transaction's ``on_cancel`` replaces an earlier one, so a cancel runs only
        the latest.
        """

    def _in_fresh_budget(self) -> bool:
        """Engine hook: whether the next durable call counts against the current budget.

        False for a call replayed from before the run's latest requeue or retry, whose
        budget was spent then (state machines count ``max_transitions`` with it,
        docs/adr/0050-an-attempt-counts-when-it-starts.md). True unless an engine knows.
        """
        return True

    @abc.abstractmethod
    async def sleep(self, seconds: float) -> None:
        """Durable timer: wait ``seconds`` of *database* time (status ``waiting_timer``).

        No process sits waiting: the run is released and claimed again when due, so a
        timer survives restarts. Short timers (under ``TREADLE_INLINE_RETRY_MAX_SECONDS``)
        wait in the worker.

        Raises:
            ValueError: negative duration.
        """

    @abc.abstractmethod
    async def sleep_until(self, when: datetime) -> None:
        """Durable timer until an aware UTC datetime (database clock)."""

    @abc.abstractmethod
    async def signal(self, name: str, *, timeout: float | None = None) -> Any:
        """Wait for the external signal ``name`` and return its payload.

        Signals sent (``POST /runs/{id}/signals/{name}``) before the run waits are
        buffered and consumed in arrival order, each exactly once.

        Args:
            name: signal name.
            timeout: seconds (database time) from when the wait was first recorded.

        Raises:
            WaitTimedOut: no signal arrived in time.
        """

    @abc.abstractmethod
    async def wait_for_event(
        self,
        name: str,
        *,
        match: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> ReceivedEvent:
        """Wait for an event posted to ``POST /events`` and return it (docs/authoring.md).

        The first event of ``name`` received since the run was created whose data
        satisfies ``match`` is delivered, even one posted before the run reached this
        wait; each event is delivered to at most one wait of a run (the event that
        started the run is not delivered to it). Journaled: a replay returns the same
        event.

        Args:
            name: event name, 1..200 of ``[A-Za-z0-9_.-]``.
            match: ``{dotted path: value}`` exact matches on the event's data (e.g.
                ``{"order_id": order.id}``); None or ``{}`` matches any data.
            timeout: seconds (database time) from when the wait was first recorded.

        Returns:
            The event (id, name, key, data, received_at).

        Raises:
            ValueError: a malformed name, match or timeout.
            WaitTimedOut: no matching event in time.
        """

    @abc.abstractmethod
    async def approval(
        self,
        name: str,
        *,
        group: str | None = None,
        payload: Any = None,
        timeout: float | None = None,
        approvals: int = 1,
        self_approval: bool = False,
        on_reject: Callable[[ApprovalDecision], Any] | None = None,
    ) -> ApprovalDecision:
        """Wait for a human decision (``POST /runs/{id}/approvals/{name}``).

        Args:
            name: approval name (its step id).
            group: only principals whose ``groups`` claim holds it may decide.
            payload: JSON shown to approvers (in the report and the steps list).
            timeout: seconds (database time) from when the wait was first recorded.
            approvals: distinct approvers needed (one rejection is enough to reject).
            self_approval: whether the subject that submitted the run may decide.
            on_reject: run as a step with the decision when rejected; then the decision
                (``approved=False``) is returned instead of raising.

        Raises:
            ApprovalRejected: rejected and no ``on_reject``.
            WaitTimedOut: no decision in time.
        """

    @abc.abstractmethod
    async def child(
        self,
        workflow: str | WorkflowDefinition[Any, Any],
        input: Any,
        *,
        version: str | None = None,
        inherit_labels: bool = False,
    ) -> Any:
        """Run a child workflow (same tenant) and wait for its output.

        Args:
            workflow: a workflow name or a :class:`WorkflowDefinition`.
            input: its input (a pydantic model or JSON value).
            version: pin a version; default the definition's (or the latest registered).
            inherit_labels: start the child with this run's labels as they are when the
                child is created (a later ``set_label`` of either run is its own).

        Returns:
            The child's output as JSON (dicts, lists, scalars).

        Raises:
            StepFailed: the child ended failed, compensated or cancelled.
        """

    @abc.abstractmethod
    async def start_child(
        self,
        workflow: str | WorkflowDefinition[Any, Any],
        input: Any,
        *,
        version: str | None = None,
        inherit_labels: bool = False,
    ) -> str:
        """Start a child workflow without waiting; returns its run id (as a string).

        ``inherit_labels`` as for :meth:`child`.
        """

    @abc.abstractmethod
    async def now(self) -> datetime:
        """The current UTC time, journaled: a replay returns the same value."""

    @abc.abstractmethod
    async def uuid(self) -> uuid.UUID:
        """A random UUID (v4), journaled."""

    @abc.abstractmethod
    async def random(self) -> float:
        """A random float in [0, 1), journaled."""

    async def set_label(self, key: str, value: str) -> None:
        """Set the run's label ``key`` to ``value`` (``GET /runs?label.<key>=<value>``).

        Journaled like a value: the label is written with the journal entry, a replay
        writes nothing and returns, and when the code now passes another value at that
        point the journal's stays (the run keeps the value it first set). Setting a key
        again later in the run replaces its value. Rules as at submit (docs/api.md,
        Labels): at most 16 labels per run.

        Raises:
            ValueError: the key or value breaks the label rules, or a 17th key.
        """
        raise NotImplementedError

    def emit(self, name: str, data: Any = None) -> None:
        """Publish progress or partial output (an LLM's tokens, a file's progress).

        Each emit becomes one ``emitted`` event of the run's timeline (``GET
        /runs/{run_id}/events``, live with ``?follow=true``), with data ``{"name",
        "data", "attempt"}`` and the step id of the step that emitted it. It never waits
        for the database.

        From workflow code an emit is kept once, like ``ctx.logger`` lines: it is written
        with the run's next journal write, and a replay that passes it again emits
        nothing (``attempt`` is null). From step code (the step closes over ``ctx``) it is
        written as soon as possible, in emit order, before the step's own result, so a
        long step streams live; each attempt of a retried step emits again, and the
        events carry the step id and ``attempt`` to tell them apart. See
        docs/authoring.md (Live progress).

        Args:
            name: what is emitted (``"token"``, ``"progress"``): 1..100 printable
                characters.
            data: a JSON value or a pydantic model.

        Raises:
            EmitRefused: a bad name; data that is not JSON; its JSON with the name over
                ``TREADLE_EMIT_MAX_BYTES``; or the run already keeps
                ``TREADLE_EMIT_MAX_PER_RUN`` emits.
        """
        raise NotImplementedError

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new code path of change ``change_id``.

        Use it to change a workflow while runs are in flight, without a new version::

            if ctx.patched("send-receipt"):
                await ctx.step(send_receipt, order)

        Returns True for runs that reach this point on code that has the call (the answer
        is journaled as a ``patch:<change_id>`` marker), and False for runs whose journal
        already went past this point without it (they started on the old code): both
        replay exactly as they first ran. Repeated calls with one id return the first
        answer. See docs/authoring.md (Versioning).

        Raises:
            ValueError: ``change_id`` is empty, over 200 characters or not printable.
        """
        raise NotImplementedError

    def deprecate_patch(self, change_id: str) -> None:
        """Mark change ``change_id`` as the only path, once no run predating it is open.

        Replace ``if ctx.patched(id): new() else: old()`` with ``ctx.deprecate_patch(id);
        new()``: runs that journaled the marker still replay, new runs record nothing.
        Remove the call once those runs have finished too.

        Raises:
            ValueError: ``change_id`` is empty, over 200 characters or not printable.
        """
        raise NotImplementedError

    @property
    def trace_context(self) -> dict[str, str]:
        """W3C trace headers of the span running now, to propagate to outgoing calls.

        Inside a step's code (sync or async): the step attempt's span; in the workflow
        body: the execution's span. ``{"traceparent": …, "tracestate": …}`` (``tracestate``
        only when set), or ``{}`` when the worker does not trace (docs/operations.md#traces).
        Pass it as HTTP headers (``httpx.post(url, headers=ctx.trace_context)``) so the
        called service's spans join the run's trace. Not journaled and different on every
        execution: never let it decide the workflow's path.
        """
        return tracing.current_headers()

    @property
    def idempotency_key(self) -> str:
        """``"<run_id>:<step_id>"`` of the step executing now (inside a step only)."""
        return current_step().idempotency_key
