"""Replay executor: runs a workflow body against its journal under one lease.

Model (after Temporal and DBOS): the body is re-executed from the start on every claim.
Each ``ctx.step`` call gets the next sequence number; if the journal already holds that
step's result, the result is returned without running the step again. New steps run, and
their attempts and results are checkpointed under the run's fence. When the body must wait
(a retry due later than ``inline_retry_max_seconds``), the execution *suspends*: it lets
in-flight parallel steps finish and checkpoint, then releases the run until the due time.
See docs/adr/0003-replay-model.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import time
import typing
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import RowMapping

from app.core import json, metrics, tracing
from app.core.errors import CeilingExceeded, InvalidInput, LeaseLost, PayloadTooLarge
from app.core.settings import Settings
from app.core.status import STATE_MACHINE_KIND, RunReason, RunStatus, StepStatus
from app.db.database import Database
from app.engine import story_log, transactions
from app.engine.emitter import RunEmitter
from app.engine.journal import RunJournal, load_entries
from app.engine.logbook import RunLogBook
from app.engine.outcomes import (
    COMPENSATION_SEQ_BASE,
    CancelPoint,
    Compensation,
    Completed,
    Failed,
    Outcome,
    PendingWait,
    Suspended,
    describe_errors_for,
    error_info,
    outcome_summary,
    step_name,
)
from app.engine.submit import Submitter
from app.engine.tenants import attempt_refusal
from app.sdk.context import StepInfo, WorkflowContext, _current_step
from app.sdk.errors import NondeterminismError, Permanent, StepFailed
from app.sdk.retry import RetryPolicy
from app.sdk.workflow import WorkflowDefinition

if TYPE_CHECKING:
    from app.engine.context import ReplayContext

T = TypeVar("T")

log = structlog.get_logger("treadle.worker")


_DONE = (
    StepStatus.SUCCEEDED,
    StepStatus.COMPENSATING,
    StepStatus.COMPENSATED,
    StepStatus.COMPENSATION_FAILED,
)
_UNDONE = (StepStatus.COMPENSATING, StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED)


def _undo_began(entry: RowMapping) -> bool:
    # Twin of app/db/queries/steps.py compensation_began, on the loaded journal.
    return entry["kind"] == "compensation" or StepStatus(entry["status"]) in _UNDONE


_adapters: dict[Callable[..., Any], TypeAdapter[Any]] = {}


def _output_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    # Cached per function: building a TypeAdapter compiles a validator, too slow per step.
    adapter = _adapters.get(fn)
    if adapter is None:
        try:
            ret = typing.get_type_hints(fn).get("return", Any)
        except Exception:  # noqa: BLE001 - unresolvable hints: treat the result as JSON
            ret = Any
        adapter = TypeAdapter(ret)
        _adapters[fn] = adapter
    return adapter


class RunExecution:
    """One lease's worth of work on one run.

    Args:
        db: the database.
        settings: ceilings and retry timing.
        run: the claimed ``runs`` row (its ``fence`` is ours; ``updated_at`` is the DB
            clock at claim time).
        definition: the pinned workflow definition.
        journal: the run's ``steps`` rows (kept as :attr:`entries`).
        worker_id: for step info and logs.
        claim_sent: ``time.monotonic()`` taken before the claim statement was sent, if the
            caller knows it (the worker does); it bounds :meth:`attempt_started_at`.

    Every write goes through :attr:`journal` (:class:`app.engine.journal.RunJournal`).
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        run: RowMapping,
        definition: WorkflowDefinition[Any, Any],
        journal: Sequence[RowMapping],
        worker_id: str,
        submitter: Submitter | None = None,
        *,
        claim_sent: float | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.run_id: uuid.UUID = run["run_id"]
        self.tenant_id: str = run["tenant_id"]
        self.fence: int = int(run["fence"])
        self.run = run
        self.definition = definition
        self.worker_id = worker_id
        self.submitter = submitter or Submitter(db, settings)
        self.entries: dict[str, RowMapping] = {r["step_id"]: r for r in journal}
        self.entries_by_seq: dict[int, RowMapping] = {int(r["seq"]): r for r in journal}
        self._db_now_at_claim: datetime = run["updated_at"]
        self._mono_at_claim = time.monotonic()
        self._mono_claim_sent = self._mono_at_claim if claim_sent is None else claim_sent
        # The one writer of this run's state under our fence.
        self.journal = RunJournal(
            db, settings, run, worker_id, clock=self.db_now, claim_sent=claim_sent
        )
        self._active = 0
        self._suspends: list[PendingWait] = []
        self._ready = asyncio.Event()
        # Tasks currently inside run_step (gather wraps each ctx.step in its own task).
        self._step_tasks: set[asyncio.Task[Any]] = set()
        # Branches inside a wait's or a value's own journal writes, by nesting depth; each
        # level counts in _active, so no branch's suspension releases the run meanwhile.
        self._journaling: dict[asyncio.Task[Any], int] = {}
        self.nondeterminism: NondeterminismError | None = None
        self.failure: Failed | None = None
        # A cancelled run is replayed only to rebuild its compensations, never to advance.
        # The cancel request is durable (``cancel_requested_at``): whatever path brought
        # the run back (requeue, retry, resume), its body never runs again.
        self.cancelling = (
            run["status"] == RunStatus.CANCELLING.value
            or run.get("cancel_requested_at") is not None
        )
        # Likewise a run whose compensation began: the effects of its undone steps are
        # gone, so their journaled results must never again feed new work. The journal
        # decides, not only the status (docs/adr/0009-requeue-into-compensation.md).
        self.compensating = not self.cancelling and (
            run["status"] == RunStatus.COMPENSATING.value or any(_undo_began(r) for r in journal)
        )
        self._registered: list[tuple[Compensation, Any]] = []
        # Attempts of each step interrupted by a lost worker (not counted as failures).
        self._lost: dict[str, int] = {}
        # Timeline rows when this execution began (resumed runs only): events ceiling.
        self.events_at_claim = 0
        # Body position the run's latest requeue or retry counts its fresh budget from
        # (state machines' max_transitions; docs/adr/0050-an-attempt-counts-when-it-starts.md).
        self.budget_seq = 0
        # ctx.logger: lines wait here for the next fenced write (docs/adr/0027-run-logs.md).
        body_seqs = [s for s in self.entries_by_seq if s < COMPENSATION_SEQ_BASE]
        self.logbook = RunLogBook(
            run_id=self.run_id,
            workflow=definition.name,
            worker_id=worker_id,
            horizon=max(body_seqs) + 1 if body_seqs else 0,
            clock=self.db_now,
            max_line_bytes=settings.run_log_max_line_bytes,
            max_lines=settings.run_log_max_lines,
        )
        # ctx.emit: workflow emits ride on the journal's writes like log lines, step emits
        # are written as made (docs/adr/0028-live-event-streams.md).
        self.emitter = RunEmitter(
            run_id=self.run_id,
            horizon=max(body_seqs) + 1 if body_seqs else 0,
            clock=self.db_now,
            max_bytes=settings.emit_max_bytes,
            max_per_run=settings.emit_max_per_run,
            write_steps=self.journal.append_step_emits,
        )
        self.journal.attach(self.logbook, self.emitter)

    def db_now(self) -> datetime:
        """The database clock, estimated from the claim time plus local monotonic time.

        Never later than the database's own clock (the claim's ``now()`` happened before
        this execution was built), so a deadline computed from it is never early by more
        than the claim's round trip and a line stamped with it never postdates the
        commit that writes it.
        """
        return self._db_now_at_claim + timedelta(seconds=time.monotonic() - self._mono_at_claim)

    def attempt_started_at(self) -> datetime:
        """A step attempt's ``started_at``: the database clock, estimated from above.

        Counted from before the claim statement was sent, so never earlier than the
        database clock now (clock rates aside), hence never earlier than the
        ``finished_at`` (a ``now()``) of anything this run committed before the attempt
        began: a step never appears to start before the steps it waited for finished
        (``db_now`` lags the database by the claim's round trip, and did show that). The
        write caps it with ``LEAST(started_at, now())`` of its own transaction, so it is
        never later than the attempt's record either. Without ``claim_sent`` it is
        :meth:`db_now`.
        """
        return self._db_now_at_claim + timedelta(seconds=time.monotonic() - self._mono_claim_sent)

    async def execute(self) -> Outcome:
        """Replay and advance the run until it completes, fails or must wait.

        Lines ``ctx.logger`` logged after the execution's last checkpoint are appended
        before the outcome is returned (a small fenced write of their own).

        Raises:
            LeaseLost: a checkpoint found the fence moved; the caller abandons the run.
            CheckpointFault: a checkpoint met a transient database fault; the caller
                gives the run back (``RunJournal._write``, app/engine/journal.py).
        """
        describe_errors_for(str(self.run_id), self.definition.name, self.settings.error_tracebacks)
        try:
            outcome = await self._advance()
            await self.journal.flush()
        except asyncio.CancelledError:
            # Stopped (a drain past its grace): a step result still held is written before
            # the run is given back, so the step is not run again; a write that cannot be
            # made leaves the step to its next claim, as a crash would.
            with contextlib.suppress(Exception, LeaseLost):
                await self.journal.release_held()
            raise
        finally:
            await self.emitter.close()
        return outcome

    async def _advance(self) -> Outcome:
        try:
            # Parsed with the stdlib first: pydantic's JSON parser refuses lone surrogates,
            # which JSON text (and our payload encoding) allows.
            input_value = self.definition.input_model.model_validate(json.loads(self.run["input"]))
        except ValidationError as exc:
            return Failed(
                RunReason.FAILURE_NON_RETRYABLE,
                {
                    "type": "InvalidInput",
                    "message": str(exc),
                    "errors": exc.errors(
                        include_url=False, include_context=False, include_input=False
                    ),
                },
            )
        kept_emits = 0
        if self.entries:
            # A resumed run: count its timeline once per claim for the events ceiling and
            # the emits ceiling (one index range scan). Fresh runs have a single event
            # and skip the query.
            self.events_at_claim, kept_emits = await self.journal.timeline_counts()
            if self.definition.kind == STATE_MACHINE_KIND:
                self.budget_seq = await self.journal.requeue_horizon()
        self.emitter.start(kept_emits)
        from app.engine.context import ReplayContext

        ctx = ReplayContext(self)
        body = asyncio.create_task(self._body(ctx, input_value))
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait({body, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            if not body.done():
                body.cancel()
            # A branch may still be running after a sibling's error ended the body (gather
            # does not cancel siblings): stop it, so no step outlives this execution.
            leftovers = [t for t in self._step_tasks if t is not body and not t.done()]
            for task in leftovers:
                task.cancel()
            await asyncio.gather(body, *leftovers, return_exceptions=True)
        if self.nondeterminism is not None:
            return Failed(RunReason.FAILURE_NONDETERMINISM, error_info(self.nondeterminism))
        if self.cancelling:
            return await self._compensate(ctx, None)
        if self.compensating:
            return await self._compensate(ctx, self._cause_being_undone(body))
        if self.failure is not None:
            return await self._compensate(ctx, self.failure)
        if self._suspends:
            return self._suspended()
        if body.cancelled():
            raise asyncio.CancelledError()
        escaped = body.exception()
        if escaped is not None:
            if not isinstance(escaped, Exception):
                raise escaped  # LeaseLost, CheckpointFault and friends
            return await self._compensate(ctx, self._failure_from(escaped))
        output = body.result()
        try:
            payload = self.definition.output_adapter.dump_python(output, mode="json")
            text = json.dumps_limited(payload, self.settings.max_payload_bytes, "run output")
        except (PayloadTooLarge, InvalidInput, ValueError, TypeError) as err:
            return Failed(RunReason.FAILURE_NON_RETRYABLE, error_info(err))
        return Completed(text)

    async def _body(self, ctx: WorkflowContext, input_value: Any) -> Any:
        return await self.definition.fn(ctx, input_value)

    def cancel_point(self) -> None:
        """Stop an undoing run's replay where it would start new work.

        A run being cancelled, or whose compensation began, is replayed only to rebuild
        its registered compensations.

        Raises:
            CancelPoint: the run is being cancelled or compensated.
        """
        if self.cancelling or self.compensating:
            raise CancelPoint()

    async def pause_point(self) -> None:
        """Release the run here, before new work, if an operator paused it.

        Called where :meth:`cancel_point` is: before a step's first attempt and before a
        wait journals or re-checks. The attempt in flight when the pause was written
        finishes and checkpoints first (a pause moves no fence); the run is then released
        ``queued`` and due at once, and no claim takes it until it is unpaused
        (docs/adr/0021-pause-is-a-flag-beside-the-status.md). One primary-key read per
        new step, a single round trip on PostgreSQL (:meth:`Database.read_statement`);
        an undoing run is not paused (its undo is what cancel asked for).

        Raises:
            CheckpointFault: the read met a transient database fault.
        """
        if self.cancelling or self.compensating:
            return
        # A transient fault here is the checkpoint's (CheckpointFault): the worker gives
        # the run back; it must never reach workflow code as its failure.
        if await self.journal.is_paused():
            await self.suspend(PendingWait(0.0, RunStatus.QUEUED, "pause", "pause"))

    def _cause_being_undone(self, body: asyncio.Task[Any]) -> Failed:
        """Why a ``compensating`` run is undone.

        The failure recorded on the row when compensation began
        (:func:`app.db.queries.runs.begin_compensation`, kept by a requeue), so the run
        ends with its original reason even when the replay stops before reaching the
        failure again (at a :class:`CancelPoint`, or the body even returns: such a run
        must never complete). Without one, the failure the replay reached.
        """
        reason = self.run["reason"]
        if reason is not None:
            error = json.loads(self.run["error"]) if self.run["error"] else None
            return Failed(RunReason(reason), error if isinstance(error, dict) else None)
        if self.failure is not None:
            return self.failure
        escaped = None if body.cancelled() else body.exception()
        if isinstance(escaped, Exception):
            return self._failure_from(escaped)
        return Failed(
            RunReason.FAILURE_NON_RETRYABLE,
            {
                "type": "CompensationResumed",
                "message": "the run's compensation began earlier; its cause is not recorded",
            },
        )

    def _suspended(self, status: RunStatus | None = None) -> Suspended:
        """The release the pending waits ask for (the soonest due one names the wait)."""
        timed = [w for w in self._suspends if w.delay is not None]
        first = min(timed, key=lambda w: w.delay or 0.0) if timed else self._suspends[0]
        return Suspended(
            status or first.status,
            first.delay,
            first.kind,
            first.name,
            tuple(w.wake_check for w in self._suspends if w.wake_check is not None),
        )

    async def _unless_suspended(self, work: Awaitable[Any]) -> bool:
        """Await ``work`` unless it asks to release the run; False if it did.

        A compensation that must wait (a retry due later than
        ``TREADLE_INLINE_RETRY_MAX_SECONDS``) parks in :meth:`suspend`, like a body step;
        it is stopped here so the run is released instead of holding its lease forever.

        Raises:
            StepFailed: ``work`` failed (and whatever else it raises).
        """
        task = asyncio.ensure_future(work)
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, ready, return_exceptions=True)
        if task.cancelled():
            if not self._suspends:
                raise asyncio.CancelledError()  # not ours: whoever cancelled it, stop too
            return False
        task.result()
        return True

    async def _compensate(self, ctx: ReplayContext, cause: Failed | None) -> Failed | Suspended:
        """Run registered compensations in reverse call order; ``cause`` None = cancel.

        Returns the terminal outcome: ``compensated`` / ``cancelled`` when every undo
        succeeded, else ``failed`` listing the compensations that failed; or
        :class:`Suspended` (status ``compensating`` / ``cancelling``) when a compensation
        must wait out a retry backoff: the run is released and resumes its undo when due.
        """
        if cause is not None and cause.reason == RunReason.FAILURE_NONDETERMINISM:
            return cause  # the code changed under the run: do not run its undo actions
        registered = [r for r in self._registered if cause is None or not r[0].cancel_only]
        if not registered:
            if cause is None:
                return Failed(RunReason.CANCELED_BY_REQUEST, None, RunStatus.CANCELLED)
            return cause
        status = RunStatus.CANCELLING if cause is None else RunStatus.COMPENSATING
        if cause is not None:
            await self.journal.begin_compensation(reason=cause.reason, error=cause.error)
        # Waits the body asked for no longer matter: only the undo's own waits release.
        self._suspends.clear()
        self._ready.clear()
        failures: list[dict[str, Any]] = []
        for comp, result in sorted(registered, key=lambda c: c[0].seq, reverse=True):
            try:
                if not await self._unless_suspended(ctx.compensation_step(comp, result)):
                    # Later compensations wait their turn: reverse order holds across the
                    # release, and the ones already done are skipped on resume.
                    return self._suspended(status)
                outcome = StepStatus.COMPENSATED
            except StepFailed as exc:
                failures.append({"step_id": comp.step_id, "error": exc.message})
                outcome = StepStatus.COMPENSATION_FAILED
            await self.journal.compensation_done(step_id=comp.step_id, status=outcome)
        compensated = [c.step_id for c, _ in registered]
        if failures:
            base = cause.error if cause is not None and cause.error else {}
            return Failed(
                cause.reason if cause is not None else RunReason.FAILURE_NON_RETRYABLE,
                {
                    **base,
                    "compensation_failures": failures,
                    "compensation_message": f"{len(failures)} compensation(s) failed: "
                    + ", ".join(f["step_id"] for f in failures),
                },
            )
        if cause is None:
            return Failed(
                RunReason.CANCELED_BY_REQUEST, {"compensated": compensated}, RunStatus.CANCELLED
            )
        return Failed(
            cause.reason, {**(cause.error or {}), "compensated": compensated}, RunStatus.COMPENSATED
        )

    @staticmethod
    def _failure_from(exc: BaseException) -> Failed:
        if isinstance(exc, StepFailed):
            return Failed(RunReason(exc.reason), error_info(exc, step_id=exc.step_id))
        if isinstance(exc, NondeterminismError):
            return Failed(RunReason.FAILURE_NONDETERMINISM, error_info(exc))
        if isinstance(exc, CeilingExceeded):
            return Failed(RunReason.FAILURE_NON_RETRYABLE, error_info(exc, **exc.data))
        # An error escaping the body (a Permanent, or a bug) ends the run: replaying the
        # same code would raise it again. A dead letter lets an operator requeue it later.
        return Failed(RunReason.FAILURE_NON_RETRYABLE, error_info(exc))

    # --- suspension bookkeeping -------------------------------------------------------

    def _check_ready(self) -> None:
        if self._suspends and self._active == 0:
            self._ready.set()

    async def journaling(self, work: Awaitable[T]) -> T:
        """Await a wait's or a value's own journal work as a step attempt is awaited.

        ``ctx.child``, ``ctx.signal``, ``ctx.sleep``, ``ctx.approval`` and ``ctx.now``
        write their journal entry (and create a child) before they park or return. While
        a branch is in that work, another branch's :meth:`suspend` does not release the
        run: parallel waits (``asyncio.gather`` of two children) are all journaled, and
        their children all created, in the execution that reached them, not one per
        execution. The hold ends when ``work`` returns or raises, when the branch parks
        in :meth:`suspend`, and for the length of :meth:`idle`.
        """
        task = asyncio.current_task()
        assert task is not None, "journal work runs inside the execution's tasks"
        self._journaling[task] = self._journaling.get(task, 0) + 1
        self._active += 1
        try:
            return await work
        finally:
            if self._journaling.get(task, 0) > 0:
                self._let_go(task, 1)

    @contextlib.asynccontextmanager
    async def idle(self) -> AsyncIterator[None]:
        """Within the block the current branch holds no release (an inline timer sleep).

        The holds come back only when the block ends normally: a branch cancelled while
        idle holds nothing, so compensation after a release starts from ``_active == 0``.
        """
        task = asyncio.current_task()
        assert task is not None
        held = self._journaling.get(task, 0)
        self._let_go(task, held)
        yield
        if held:
            self._journaling[task] = self._journaling.get(task, 0) + held
            self._active += held

    def _let_go(self, task: asyncio.Task[Any], levels: int) -> None:
        if levels <= 0:
            return
        left = self._journaling.get(task, 0) - levels
        if left > 0:
            self._journaling[task] = left
        else:
            self._journaling.pop(task, None)
        self._active -= levels
        self._check_ready()

    async def suspend(self, wait: PendingWait) -> typing.NoReturn:
        """Ask to release the run until ``wait`` is due or woken; never returns.

        The run is released once no other branch of this execution is mid-attempt or in
        a wait's journal work (:meth:`journaling`), so parallel branches checkpoint what
        they are doing first.
        """
        self._suspends.append(wait)
        story_log.waiting(wait, self.db_now())
        tracing.wait_event(wait.kind, wait.name, wait.delay)
        task = asyncio.current_task()
        if task is not None:
            self._let_go(task, self._journaling.get(task, 0))
        self._check_ready()
        # Park this branch; the executor cancels the body once every branch is idle.
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable: a suspended branch is only ever cancelled")

    # --- steps ------------------------------------------------------------------------

    async def run_step(
        self,
        *,
        step_id: str,
        seq: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retry: RetryPolicy,
        timeout: float | None,
        entry: RowMapping | None,
        compensation: Compensation | None = None,
        kind: str = "step",
        transactional: bool = False,
    ) -> Any:
        """Return a journaled result or execute the step's attempts (see ``ctx.step``).

        ``transactional`` runs a compensation like ``ctx.transaction`` (``fn(tx, …)``).
        """
        task = asyncio.current_task()
        if task is not None:
            self._step_tasks.add(task)
        try:
            result = await self._run_step(
                step_id=step_id,
                seq=seq,
                fn=fn,
                args=args,
                retry=retry,
                timeout=timeout,
                entry=entry,
                compensation=compensation,
                kind=kind,
                transactional=transactional,
            )
            if compensation is not None:
                if compensation.slot is not None:
                    self._registered = [
                        r for r in self._registered if r[0].slot != compensation.slot
                    ]
                self._registered.append((compensation, result))
            return result
        finally:
            if task is not None:
                self._step_tasks.discard(task)

    async def _run_step(
        self,
        *,
        step_id: str,
        seq: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retry: RetryPolicy,
        timeout: float | None,
        entry: RowMapping | None,
        compensation: Compensation | None,
        kind: str,
        transactional: bool,
    ) -> Any:
        adapter = _output_adapter(fn)
        name = step_name(fn)
        attempt = 0
        due: datetime | None = None
        if entry is not None and StepStatus(entry["status"]) in _DONE:
            return adapter.validate_python(json.loads(entry["output"]))
        if kind != "compensation":
            self.cancel_point()
            await self.pause_point()
        marks: dict[str, Any] = {}
        if compensation is not None:
            marks["compensate"] = step_name(compensation.fn)
        lost = 0
        if entry is not None:
            status = StepStatus(entry["status"])
            attempt = int(entry["attempt"])
            lost = int((json.loads(entry["detail"]) or {}).get("lost_attempts", 0))
            if status in (StepStatus.FAILED, StepStatus.TIMED_OUT):
                err = json.loads(entry["error"]) or {}
                raise StepFailed(
                    step_id,
                    str(err.get("reason", RunReason.FAILURE_NON_RETRYABLE)),
                    str(err.get("type", "Error")),
                    str(err.get("message", "")),
                    attempt,
                )
            if status == StepStatus.RETRY_WAIT:
                due = entry["next_attempt_at"]
            elif status == StepStatus.RUNNING:
                # The worker died mid-attempt. That is not the step's failure, so it does
                # not use the retry budget, up to TREADLE_MAX_LOST_ATTEMPTS: past that the
                # step itself is the likely killer (a poison pill) and fails.
                lost += 1
                await self._lost_ceiling(step_id, lost, attempt)
        inherited = self.journal.lost_claims
        if inherited and (
            entry is None
            or StepStatus(entry["status"]) not in (StepStatus.RUNNING, StepStatus.RETRY_WAIT)
        ):
            # The claims before this one lost their lease with no step progress journaled
            # since: the worker died between the last checkpoint and this step's first
            # write, i.e. in an attempt of this step that finished too soon to write a
            # start record (or in the workflow code just before it). Counted as this
            # step's lost attempts, as a ``running`` entry would be (ADR 0040). Not for
            # a step waiting out a retry backoff: the attempt after a backoff writes its
            # start record before it runs (``_attempt``), so a ``retry_wait`` entry means
            # that attempt never began, and the worker died in the backoff: no attempt
            # ran, none is counted (docs/adr/0050-an-attempt-counts-when-it-starts.md).
            # (A ``running`` entry is counted above, once.)
            lost += inherited
            attempt += inherited
            self.journal.defer_start(
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                attempt=attempt,
                max_attempts=retry.max_attempts,
                detail=json.dumps({**marks, "lost_attempts": lost}),
                started_at=self.attempt_started_at(),
            )
            await self._lost_ceiling(step_id, lost, attempt)
        if lost:
            marks["lost_attempts"] = lost
        self._lost[step_id] = lost
        detail = json.dumps(marks) if marks else None

        while True:
            if attempt >= self.settings.max_attempts_per_step:
                # Reached through recovered (lost) attempts; _after_error covers retries.
                await self._attempts_ceiling(step_id, attempt)
            if due is not None:
                remaining = (due - self.db_now()).total_seconds()
                if remaining > self.settings.inline_retry_max_seconds:
                    await self.suspend(PendingWait(remaining, RunStatus.RETRYING, "retry", step_id))
                if remaining > 0:
                    await asyncio.sleep(remaining)
            attempt += 1
            # An attempt after a backoff is journaled as started before it runs: the
            # start record is what tells a later claim that the backoff was over.
            after_backoff = due is not None
            self._active += 1
            workflow = self.definition.name
            metrics.STEP_ATTEMPTS.labels(workflow).inc()
            started = time.monotonic()
            outcome = "failed"
            logged = story_log.step_started(step_id, attempt, kind=kind, name=name)
            try:
                result = await self._attempt(
                    step_id,
                    seq,
                    name,
                    fn,
                    args,
                    retry,
                    timeout,
                    attempt,
                    adapter,
                    kind,
                    detail,
                    transactional or kind == "transaction",
                    after_backoff,
                )
                outcome = "retry" if isinstance(result, _Retry) else "succeeded"
            finally:
                metrics.STEP_DURATION.labels(workflow, outcome).observe(time.monotonic() - started)
                # Only an attempt that raised reads the exception being raised.
                raised = sys.exc_info()[1] if outcome == "failed" else None
                story_log.step_finished(logged, outcome, time.monotonic() - started, raised)
                self._active -= 1
                self._check_ready()
            if not isinstance(result, _Retry):
                return result
            due = self.db_now() + timedelta(seconds=result.delay)

    async def _lost_ceiling(self, step_id: str, lost: int, attempt: int) -> None:
        # Past TREADLE_MAX_LOST_ATTEMPTS the step itself is the likely killer (a poison
        # pill): it fails instead of taking another worker down.
        if lost > self.settings.max_lost_attempts:
            info = {
                "type": "WorkerLost",
                "message": f"{lost} attempts were interrupted by a lost worker "
                f"(TREADLE_MAX_LOST_ATTEMPTS={self.settings.max_lost_attempts})",
            }
            await self.give_up(
                step_id, StepStatus.FAILED, RunReason.FAILURE_ATTEMPTS_EXHAUSTED, info, attempt
            )

    async def _attempt(
        self,
        step_id: str,
        seq: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        retry: RetryPolicy,
        timeout: float | None,
        attempt: int,
        adapter: TypeAdapter[Any],
        kind: str,
        detail: str | None,
        transactional: bool,
        after_backoff: bool,
    ) -> Any:
        if after_backoff:
            # The end of a retry backoff is made durable by this attempt's start record,
            # written now (one commit more, for retries only): without it a worker killed
            # in the backoff and one killed in a quick attempt after it leave the same
            # journal, and the backoff would be charged as a lost attempt that never ran
            # (docs/adr/0050-an-attempt-counts-when-it-starts.md).
            await self.journal.start_attempt(
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                attempt=attempt,
                max_attempts=retry.max_attempts,
                detail=detail,
            )
        if transactional:
            # A parallel branch's held result first: the step's transaction is a write of
            # the run, and runs after every result journaled before it.
            await self.journal.release_held()
            # One transaction for the user's writes and the checkpoint: see transactions.py.
            return await transactions.attempt(
                self,
                step_id=step_id,
                seq=seq,
                name=name,
                fn=fn,
                args=args,
                retry=retry,
                timeout=timeout,
                attempt=attempt,
                adapter=adapter,
                detail=detail,
                kind=kind,
                started=after_backoff,
            )

        # The start record is held and written with the result: one commit for an attempt
        # that finishes within TREADLE_STEP_START_RECORD_AFTER_SECONDS; a longer one gets
        # it when that time is up (docs/adr/0040-one-commit-per-step.md).
        # PostgreSQL only: an embedded SQLite commit costs no round trip, and its writes
        # would then carry the worker's clock estimate beside the database's (ADR 0040).
        after = (
            self.settings.step_start_record_after_seconds
            if self.db.dialect == "postgresql" and not after_backoff
            else 0.0
        )
        if not after_backoff:
            self.journal.defer_start(
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                attempt=attempt,
                max_attempts=retry.max_attempts,
                detail=detail,
                started_at=self.attempt_started_at(),
            )
            if after <= 0:
                await self.journal.write_deferred_start(step_id, now=True)
        info = StepInfo(
            run_id=self.run_id,
            step_id=step_id,
            attempt=attempt,
            idempotency_key=f"{self.run_id}:{step_id}",
            workflow=self.definition.name,
            logger=self.logbook,
        )
        token = _current_step.set(info)
        try:
            if inspect.iscoroutinefunction(fn):
                call: Awaitable[Any] = fn(*args)
            else:
                call = asyncio.to_thread(fn, *args)
            traced = tracing.step_call(
                asyncio.wait_for(call, timeout) if timeout else call,
                step_id=step_id,
                name=name,
                attempt=attempt,
                kind=kind,
            )
            if after <= 0:
                value = await traced
            else:
                value = await self._start_when_slow(step_id, traced, after)
        except Permanent as exc:
            await self.give_up(
                step_id,
                StepStatus.FAILED,
                RunReason.FAILURE_NON_RETRYABLE,
                error_info(exc),
                attempt,
            )
        except TimeoutError as exc:
            return await self.after_error(step_id, retry, attempt, exc, timed_out=timeout)
        except Exception as exc:  # noqa: BLE001 - any other error is retryable by contract
            return await self.after_error(step_id, retry, attempt, exc, timed_out=None)
        finally:
            _current_step.reset(token)

        try:
            # Validate before the checkpoint: a result of the wrong type is a bug in the
            # step, recorded as a failure instead of a journal entry replay cannot read.
            payload = adapter.dump_python(adapter.validate_python(value), mode="json")
            text = json.dumps_limited(payload, self.settings.max_payload_bytes, "step output")
        except (PayloadTooLarge, InvalidInput, ValueError, TypeError) as exc:
            await self.give_up(
                step_id,
                StepStatus.FAILED,
                RunReason.FAILURE_NON_RETRYABLE,
                error_info(exc),
                attempt,
            )

        await self.journal.record_attempt(step_id=step_id, attempt=attempt, output=text)
        # Return what a replay would return, so both paths behave identically.
        return adapter.validate_python(json.loads(text))

    async def _start_when_slow(self, step_id: str, call: Awaitable[Any], after: float) -> Any:
        """Await a step's call; write its held start record once it has run ``after`` s.

        The call runs as a task (it inherits this context: the current step, the trace),
        so the start record is written while it runs. A fault of that write cancels the
        call and propagates (``LeaseLost``, ``CheckpointFault``), as a failed start
        record did before the call began; so does a cancellation of this coroutine.
        """
        task: asyncio.Future[Any] = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait((task,), timeout=after)
            if not done:
                await self.journal.write_deferred_start(step_id)
            return await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def after_error(
        self,
        step_id: str,
        retry: RetryPolicy,
        attempt: int,
        exc: BaseException,
        *,
        timed_out: float | None,
    ) -> _Retry:
        """After a failed attempt: give up (:meth:`give_up`) or journal the retry's schedule.

        ``timed_out`` is the step's timeout in seconds when the attempt exceeded it.

        Returns:
            The retry marker with its delay in seconds.

        Raises:
            StepFailed: the policy refuses the error, or the attempts are used up.
        """
        info = error_info(exc)
        if timed_out is not None:
            info["type"] = "StepTimeout"
            info["message"] = f"attempt {attempt} exceeded its timeout of {timed_out} s"
        # The policy's error rules apply to what the step's code raised; a timeout is
        # Treadle's own and is retried by count alone (app/sdk/retry.py).
        refused = None if timed_out is not None else retry.refusal(exc)
        if refused is not None:
            info["not_retried"] = refused
            await self.give_up(
                step_id, StepStatus.FAILED, RunReason.FAILURE_NON_RETRYABLE, info, attempt
            )
        if attempt >= self.settings.max_attempts_per_step:
            await self._attempts_ceiling(step_id, attempt, info)
        if attempt - self._lost.get(step_id, 0) >= retry.max_attempts:
            if timed_out is not None:
                await self.give_up(
                    step_id, StepStatus.TIMED_OUT, RunReason.FAILURE_TIMED_OUT, info, attempt
                )
            await self.give_up(
                step_id, StepStatus.FAILED, RunReason.FAILURE_ATTEMPTS_EXHAUSTED, info, attempt
            )
        delay = retry.delay_after(attempt, f"{self.run_id}:{step_id}")
        info["retry_in_seconds"] = delay

        await self.journal.schedule_retry(
            step_id=step_id,
            attempt=attempt,
            info=info,
            delay=delay,
            timed_out=timed_out is not None,
        )
        story_log.retry_scheduled(attempt, delay, self.db_now() + timedelta(seconds=delay), info)
        return _Retry(delay)

    async def _attempts_ceiling(
        self, step_id: str, attempt: int, last_error: dict[str, Any] | None = None
    ) -> typing.NoReturn:
        limit = self.settings.max_attempts_per_step
        info: dict[str, Any] = {
            "type": "CeilingExceeded",
            "message": f"step {step_id!r} reached TREADLE_MAX_ATTEMPTS_PER_STEP={limit} "
            f"after {attempt} attempts",
            "ceiling": "max_attempts_per_step",
            "limit": limit,
        }
        if last_error is not None:
            info["last_error"] = last_error
        await self.give_up(
            step_id, StepStatus.FAILED, RunReason.FAILURE_ATTEMPTS_EXHAUSTED, info, attempt
        )

    def ceiling(self, name: str, message: str, limit: int) -> typing.NoReturn:
        """Fail the run on a ceiling: record the failure, then raise it into the body.

        Recorded on the execution first, so workflow code that catches the error cannot
        go on: the run ends ``failed`` / ``failure_non_retryable`` with error type
        ``CeilingExceeded`` naming the setting.

        Raises:
            CeilingExceeded: always.
        """
        exc = CeilingExceeded(message, ceiling=name, limit=limit)
        self.failure = Failed(RunReason.FAILURE_NON_RETRYABLE, error_info(exc, **exc.data))
        raise exc

    def check_new_step(self, seq: int) -> None:
        """Enforce the per-run ceilings a new journal entry is subject to (not replays).

        Raises:
            CeilingExceeded: ``TREADLE_MAX_STEPS_PER_RUN`` or ``TREADLE_MAX_EVENTS_PER_RUN``
                reached (see :meth:`ceiling`).
        """
        steps_limit = self.settings.max_steps_per_run
        if seq >= steps_limit:
            self.ceiling(
                "max_steps_per_run",
                f"run reached TREADLE_MAX_STEPS_PER_RUN={steps_limit}",
                steps_limit,
            )
        events_limit = self.settings.max_events_per_run
        if self.events_at_claim >= events_limit:
            self.ceiling(
                "max_events_per_run",
                f"run has {self.events_at_claim} events, TREADLE_MAX_EVENTS_PER_RUN={events_limit}",
                events_limit,
            )

    async def give_up(
        self,
        step_id: str,
        status: StepStatus,
        reason: RunReason,
        info: dict[str, Any],
        attempt: int,
    ) -> typing.NoReturn:
        """Journal that a step gave up with ``status`` and ``reason``, then raise it.

        Raises:
            StepFailed: always, once the failure is journaled.
        """
        info = {**info, "reason": reason.value, "attempts": attempt}

        await self.journal.fail_step(
            step_id=step_id, status=status, reason=reason, info=info, attempt=attempt
        )
        raise StepFailed(step_id, reason.value, str(info["type"]), str(info["message"]), attempt)


@dataclass(frozen=True, slots=True)
class _Retry:
    delay: float


async def execute_claim(
    db: Database,
    settings: Settings,
    row: RowMapping,
    definition: WorkflowDefinition[Any, Any],
    worker_id: str,
    submitter: Submitter,
    *,
    settling: Callable[[], None] = lambda: None,
    claim_sent: float | None = None,
) -> Outcome:
    """Execute one claimed run and persist its outcome: the engine's half of a claim.

    The attempt is re-checked first (who the run acts for: tenant active, API key not
    revoked; the claim statement read both): a refused attempt fails the run without
    executing it. Otherwise the journal is loaded (only for a run that has one), the
    body replayed and advanced, and the outcome written by
    :meth:`app.engine.journal.RunJournal.settle`. ``settling()`` is called once the
    outcome is decided, before it is written (the worker stops judging the lease
    then); the write is shielded, so a stop request arriving meanwhile cannot cut it
    short. ``claim_sent`` is ``time.monotonic()`` before the claim was sent
    (:class:`RunExecution`).

    Returns:
        The outcome, as persisted.

    Raises:
        LeaseLost: a write found the fence moved; the run is someone else's now.
        CheckpointFault: a checkpoint met a transient database fault.
        Whatever the journal read or the outcome write raised (faults included).
    """
    outcome: Outcome
    journal = RunJournal(db, settings, row, worker_id)
    refusal = attempt_refusal(row)
    if refusal is not None:
        log.warning(
            "attempt refused; failing run",
            cause=(refusal.error or {}).get("cause"),
            api_key_id=str(row["api_key_id"]) if row["api_key_id"] else None,
        )
        outcome = refusal
    else:
        entries = await load_entries(db, row)
        execution = RunExecution(
            db, settings, row, definition, entries, worker_id, submitter, claim_sent=claim_sent
        )
        outcome = await execution.execute()
        journal = execution.journal
    if tracing.ENABLED:
        tracing.execution_outcome(*outcome_summary(outcome))
    settling()
    # Shielded: once decided, the outcome is written even if we are asked to stop.
    await asyncio.shield(journal.settle(outcome))
    return outcome
