"""RunJournal: the one writer of a leased run's state (every fenced write, in one place).

A worker that holds a run's lease (its ``fence``) changes the run only through here: an
attempt's start and result, a failure and its retry schedule, a wait's start and end
(timer, signal, approval, child), journaled values and labels, compensation records,
``ctx.patched`` markers, the log lines and emits that ride on those writes, the run's
outcome (completion, failure with its dead letter, suspension) with the slot hand-off and
the parent's wake-up, and a give-back after a drain or a database fault. The executor,
the durable waits (``ctx.wait_for_event`` included), transactional steps and the worker
call its methods; none of them builds SQL or picks a dialect path. The waits' writes are grouped on
``RunJournal.waits`` (:class:`app.engine.wait_journal.WaitJournal`, ``ctx.wait_for_event``
included), built on the same fenced primitive, which nothing else calls.

Each write is one method and one implementation. Where PostgreSQL can do a write as one
self-fencing statement in autocommit (a plain step's start and result, a completion with
nothing else to change) the method hands both forms to
:func:`app.db.queries.checkpoints.commit`, which picks by dialect; the journal never
does. Every write verifies the fence first (or carries ``fence = :fence``): a moved fence
raises ``LeaseLost`` and writes nothing. Step writes turn a transient database fault into
``CheckpointFault`` so it never reaches workflow code (the worker gives the run back).
See docs/adr/0038-one-writer-of-leased-run-state.md, docs/adr/0004-fencing.md and
docs/architecture.md ("Where a run's state is written").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json, metrics
from app.core.errors import CheckpointFault, LeaseLost
from app.core.settings import Settings
from app.core.status import EventKind, RunReason, RunStatus, StepStatus
from app.db import group_commit
from app.db.database import Database
from app.db.faults import classify
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries import dead_letters as dl_q
from app.db.queries import events as events_q
from app.db.queries import run_labels as labels_q
from app.db.queries import run_logs as run_logs_q
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.engine import slots, story_log, webhooks
from app.engine.outcomes import Completed, Failed, Outcome, Suspended
from app.engine.wait_journal import WaitJournal
from app.engine.wakeup import notify

if TYPE_CHECKING:
    from app.engine.emitter import RunEmitter
    from app.engine.logbook import RunLogBook

T = TypeVar("T")

log = structlog.get_logger("treadle.worker")

PAUSE_NEWS_SECONDS = 0.1
"""How long a write's reading of ``paused_at`` stands in for a pause point's own read.

Between a step's result and the next pause point lies only the workflow's own code,
microseconds for most; a pause written in that gap takes effect one step later, as one
written just after a read does. Longer gaps (code that awaits something between steps)
read again (docs/adr/0044-pause-news.md).
"""


class RunJournal:
    """Every fenced write of one run under one claim.

    Args:
        db: the database.
        settings: retry attempts, log and payload bounds.
        run: the claimed ``runs`` row (its ``fence`` is the claim's).
        worker_id: stamped on ``step_started`` events and give-back logs.
        clock: the database clock estimate (``RunExecution.db_now``); a journal built
            without an execution (a give-back) reads ``time.monotonic`` from the claim.
        claim_sent: ``time.monotonic()`` before the claim statement was sent, if known:
            the claim took the run unpaused, the first pause news (:meth:`is_paused`).
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        run: RowMapping,
        worker_id: str,
        *,
        clock: Callable[[], datetime] | None = None,
        claim_sent: float | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.run = run
        self.run_id: uuid.UUID = run["run_id"]
        self.tenant_id: str = run["tenant_id"]
        self.fence: int = int(run["fence"])
        self.worker_id = worker_id
        self.clock = clock
        self._logbook: RunLogBook | None = None
        self._emitter: RunEmitter | None = None
        # ctx.patched markers decided this execution, journaled by the next write.
        self._markers: list[tuple[str, int, str]] = []
        # Lost claims in a row before this one (runs.lost_claims); 0 once a step write of
        # this claim committed, which resets the column (docs/adr/0040-one-commit-per-step.md).
        self.lost_claims: int = int(run.get("lost_claims") or 0)
        # Start records not written yet, by step id: an attempt's start is journaled with
        # its result unless the attempt outlives TREADLE_STEP_START_RECORD_AFTER_SECONDS,
        # emits, or fails (then it rides on that write). Arguments of _start_rows.
        self._deferred: dict[str, dict[str, Any]] = {}
        # Held start records being written (write_deferred_start): the run's outcome
        # waits for them, so a branch cut short while its start was in flight is listed.
        self._starting: set[asyncio.Task[None]] = set()
        # The step result being held (record_attempt), written before the run's next write
        # or with its outcome (docs/adr/0047-held-step-results.md).
        self._held: _HeldResult | None = None
        # The waits' writes (timers, signals, approvals, values, labels, children).
        self.waits = WaitJournal(self)
        # Pause news: (time.monotonic() when the write was sent, paused?) of the newest
        # fenced write, if it read the run's paused_at under its row lock; the claim's
        # counts, since it never takes a paused run (docs/adr/0044-pause-news.md).
        self._pause_news: tuple[float, bool] | None = (
            None if claim_sent is None else (claim_sent, False)
        )

    def attach(self, logbook: RunLogBook, emitter: RunEmitter) -> None:
        """Let ``ctx.logger`` lines and workflow emits ride on the next fenced write.

        Lines and emits wait in ``logbook`` / ``emitter`` and are appended by the next
        write, after its fence check (docs/adr/0027-run-logs.md,
        docs/adr/0028-live-event-streams.md).
        """
        self._logbook = logbook
        self._emitter = emitter

    def labels_at_claim(self) -> dict[str, str]:
        """The run's labels as the claim read them (``runs.labels``, decoded)."""
        return labels_q.decode(self.run.get("labels"))

    def mark_patch(self, step_id: str, seq: int, change_id: str) -> None:
        """Journal a ``ctx.patched`` marker with the run's next write (before any later step)."""
        self._markers.append((step_id, seq, change_id))

    # --- the primitive ------------------------------------------------------------------

    async def _write(
        self,
        fn: Callable[[AsyncConnection], Awaitable[None]],
        *,
        single: Callable[[AsyncConnection], Awaitable[object]] | None = None,
        grouped: group_commit.Grouped | None = None,
        what: str = "checkpoint",
    ) -> object:
        """Run ``fn`` in a write transaction that first verifies our fence.

        A step result still held (:meth:`record_attempt`) is written first, on its own:
        nothing is journaled after a step before the step's own result.

        Returns what the form that committed returned: the pause news of ``single`` or
        ``grouped`` where those read it (a bool), else None.

        The fence check comes first; then the emits, log lines and ``ctx.patched``
        markers waiting to ride (markers before ``fn``'s rows: no later step can be
        journaled without the marker that decided its path); then ``fn``. ``single``,
        when given, is the same write as ONE self-fencing statement, used instead when
        nothing rides along and the dialect allows
        (:func:`app.db.queries.checkpoints.commit`). ``grouped`` is that statement as a
        group-commit row: sent with other runs' rows of the same moment as one statement
        (app/db/group_commit.py); this returns after that statement committed.

        Private to the journal and its collaborator :class:`WaitJournal`: every fenced
        write of a leased run is a named method (here or on ``self.waits``) built on this
        one, and nothing outside composes its own (docs/adr/0038). A conflict re-runs the
        whole transaction, so ``fn`` must keep no state outside the database between
        calls (or reset it first).

        Raises:
            LeaseLost: the fence moved; nothing was written.
            CheckpointFault: a transient database fault (unreachable, pool or statement
                timeout, conflicts past the retries); nothing was written.
        """
        await self.release_held()
        return await self._write_now(fn, single=single, grouped=grouped, what=what)

    async def _write_now(
        self,
        fn: Callable[[AsyncConnection], Awaitable[None]],
        *,
        single: Callable[[AsyncConnection], Awaitable[object]] | None = None,
        grouped: group_commit.Grouped | None = None,
        what: str = "checkpoint",
        riders: _Riders | None = None,
    ) -> object:
        # _write without the held result; ``riders`` taken already (a held result's,
        # taken when its step finished), else taken now after the step emits' flush.
        # Pause news is the newest write's: a write that reads no paused_at (SQLite, a
        # rider, any other kind) leaves the next pause point to read for itself.
        self._pause_news = None
        if riders is None:
            if self._emitter is not None:
                # Step emits made so far first (their own fenced write): a step's emits
                # precede its result, and a parallel branch's are not held behind this one.
                await self._emitter.flush_steps()
            riders = self._take_riders()

        async def checkpoint(conn: AsyncConnection) -> None:
            await runs_q.check_fence(conn, self.run_id, self.fence, tenant_id=self.tenant_id)
            await self._rider_rows(conn, riders)
            await fn(conn)

        alone = single if riders.empty else None
        try:
            return await self._faults_as_checkpoint(
                checkpoints_q.commit(
                    self.db,
                    checkpoint,
                    statement=alone,
                    grouped=grouped if alone is not None else None,
                    what=what,
                )
            )
        except BaseException:
            self._markers[:0] = riders.markers  # still to be journaled, still first
            raise

    def _take_riders(self) -> _Riders:
        # What rides on the next write: held markers, log lines and workflow emits, all
        # taken (a write in flight on the emit path and this one never carry the same).
        lines, overflow = self._logbook.take() if self._logbook is not None else ([], 0)
        emits = self._emitter.take_workflow() if self._emitter is not None else []
        markers, self._markers = self._markers, []
        return _Riders(markers, lines, overflow, emits)

    async def _rider_rows(self, conn: AsyncConnection, riders: _Riders) -> None:
        await events_q.append_emits(
            conn, run_id=self.run_id, tenant_id=self.tenant_id, emits=riders.emits
        )
        if riders.lines or riders.overflow:
            await run_logs_q.append(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                lines=riders.lines,
                max_lines=self.settings.run_log_max_lines,
                also_dropped=riders.overflow,
            )
        for step_id, seq, change_id in riders.markers:
            await steps_q.insert_step(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                seq=seq,
                kind="patch",
                name=change_id,
                status=StepStatus.SUCCEEDED,
                fence=self.fence,
                output="true",
            )

    async def _faults_as_checkpoint(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            raise CheckpointFault(self.run_id, fault.value) from exc

    async def append_step_emits(self, emits: list[events_q.Emit]) -> None:
        """Append a batch of step emits in a fenced transaction of its own (see :meth:`_write`).

        A held step result is written first (:meth:`release_held`).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        await self.release_held()
        # An emitting step's start record goes first, so its step_started precedes its
        # emits in the timeline; taken now (not inside the retried body), put back if the
        # write fails.
        starts = {
            e.step_id: self._deferred.pop(e.step_id)
            for e in emits
            if e.step_id is not None and e.step_id in self._deferred
        }
        # A start record carries what rides on a write (workflow emits and log lines made
        # before the step began, markers), as it did when it was written before the call.
        riders = self._take_riders() if starts else None

        async def append(conn: AsyncConnection) -> None:
            await runs_q.check_fence(conn, self.run_id, self.fence, tenant_id=self.tenant_id)
            if riders is not None:
                await self._rider_rows(conn, riders)
            for args in starts.values():
                await self._start_rows(conn, **args)
            await events_q.append_emits(
                conn, run_id=self.run_id, tenant_id=self.tenant_id, emits=emits
            )

        try:
            await self._faults_as_checkpoint(self.db.write_retrying(append, what="emit"))
        except BaseException:
            for step_id, args in starts.items():
                self._deferred.setdefault(step_id, args)
            if riders is not None:
                self._markers[:0] = riders.markers
            raise
        if riders is not None:
            self.lost_claims = 0

    async def flush(self) -> None:
        """Append the lines and emits still waiting: the execution's last write.

        Step emits first, waiting for a batch the emitter's writer has in flight, so
        closing the emitter afterwards cancels no write.
        """
        if self._emitter is not None:
            await self._emitter.flush_steps()
        # Only lines and emits: a marker left pending here decided nothing journaled after
        # it, and is not written on its own (as before the journal had one owner).
        if (self._logbook is not None and self._logbook.pending) or (
            self._emitter is not None and self._emitter.pending
        ):

            async def nothing_else(conn: AsyncConnection) -> None:
                del conn  # the riders are the write

            await self._write(nothing_else)

    # --- reads under the claim ----------------------------------------------------------

    async def timeline_counts(self) -> tuple[int, int]:
        """``(events, emits)`` of the run's timeline, for the per-run ceilings.

        Raises:
            Whatever the read raised (the worker gives the run back on a fault).
        """
        async with self.db.read() as conn:
            return await events_q.counts_for_run(conn, self.run_id, tenant_id=self.tenant_id)

    async def requeue_horizon(self) -> int:
        """Where the run's latest requeue or retry began its fresh budget (a body ``seq``).

        Raises:
            Whatever the read raised (the worker gives the run back on a fault).
        """
        async with self.db.read() as conn:
            return await events_q.requeue_horizon(conn, self.run_id, tenant_id=self.tenant_id)

    async def is_paused(self) -> bool:
        """Whether an operator paused the run (after writing a held step result).

        The pause news of this claim's newest write that read ``paused_at`` (the claim,
        a step's result on PostgreSQL) answers when that write was sent less than
        :data:`PAUSE_NEWS_SECONDS` ago; otherwise one primary-key read, one round trip
        (docs/adr/0044-pause-news.md).

        Raises:
            CheckpointFault: the read met a transient database fault.
        """
        # A held step result is written first: no new step starts before it is committed,
        # and its write brings fresh pause news.
        await self.release_held()
        news = self._pause_news
        if news is not None and time.monotonic() - news[0] < PAUSE_NEWS_SECONDS:
            return news[1]

        async def read() -> bool:
            async with self.db.read_statement() as conn:
                return await runs_q.is_paused(conn, self.run_id, tenant_id=self.tenant_id)

        return await self._faults_as_checkpoint(read())

    # --- step attempts ------------------------------------------------------------------

    async def _start_rows(
        self,
        conn: AsyncConnection,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        attempt: int,
        max_attempts: int,
        detail: str | None,
        started_at: datetime | None = None,
    ) -> None:
        # The start record is what lets an attempt cut short by a lost worker be
        # recognised (a ``running`` entry on replay). ``started_at`` is given for a start
        # journaled after the fact (with the attempt's result or failure).
        await self._progress_rows(conn)
        await steps_q.start_attempt(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            step_id=step_id,
            seq=seq,
            detail=detail,
            kind=kind,
            name=name,
            attempt=attempt,
            max_attempts=max_attempts,
            fence=self.fence,
            started_at=started_at,
        )
        await events_q.append(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            kind=EventKind.STEP_STARTED,
            step_id=step_id,
            data={"attempt": attempt, "worker_id": self.worker_id},
            at=started_at,
        )

    async def _progress_rows(self, conn: AsyncConnection) -> None:
        # A step write is progress: the run's run of lost claims ends (PostgreSQL's
        # single statements reset the column in the same UPDATE that holds the fence).
        if self.lost_claims:
            await runs_q.clear_lost_claims(conn, self.run_id, tenant_id=self.tenant_id)

    async def _deferred_rows(self, conn: AsyncConnection, step_id: str) -> None:
        # A failure or retry schedule of an attempt whose start was not written yet
        # carries the start record, so the steps row it updates exists.
        args = self._deferred.get(step_id)
        if args is not None:
            await self._start_rows(conn, **args)

    async def _success_rows(
        self, conn: AsyncConnection, *, step_id: str, attempt: int, output: str
    ) -> None:
        await self._progress_rows(conn)
        await steps_q.finish_attempt(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            step_id=step_id,
            status=StepStatus.SUCCEEDED,
            output=output,
            error=None,
            fence=self.fence,
        )
        await events_q.append(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            kind=EventKind.STEP_SUCCEEDED,
            step_id=step_id,
            data={"attempt": attempt},
        )

    async def start_attempt(
        self,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        attempt: int,
        max_attempts: int,
        detail: str | None,
        started_at: datetime | None = None,
    ) -> None:
        """Journal that attempt ``attempt`` of a step started, with ``step_started``.

        ``detail`` is the step's JSON detail text (lost attempts, its compensation).
        ``started_at`` (the database clock as the worker estimates it) when the attempt
        began before this write (its start record was held, :meth:`defer_start`); None
        means now. Never later than the database's now.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        args: dict[str, Any] = {
            "step_id": step_id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "detail": detail,
            "started_at": started_at,
        }

        async def rows(conn: AsyncConnection) -> None:
            await self._start_rows(conn, **args)

        params: dict[str, Any] = {
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "fence": self.fence,
            "event_data": json.dumps({"attempt": attempt, "worker_id": self.worker_id}),
            **args,
        }

        async def statement(conn: AsyncConnection) -> None:
            await checkpoints_q.start_attempt(conn, **params)

        self._deferred.pop(step_id, None)
        await self._write(
            rows, single=statement, grouped=group_commit.Grouped(group_commit.START_ATTEMPT, params)
        )
        self.lost_claims = 0

    def defer_start(
        self,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        attempt: int,
        max_attempts: int,
        detail: str | None,
        started_at: datetime,
    ) -> None:
        """Hold attempt ``attempt``'s start record instead of writing it now.

        It is then written by :meth:`write_deferred_start` (the attempt outlived
        ``TREADLE_STEP_START_RECORD_AFTER_SECONDS``), with the step's first emits, with
        its failure or retry schedule, or with its result (:meth:`record_attempt`): one
        commit for an attempt that finishes quickly. ``started_at`` is the database
        clock (as the worker estimates it) when the attempt began. A later call for the
        same step replaces the held record (docs/adr/0040-one-commit-per-step.md).
        """
        self._deferred[step_id] = {
            "step_id": step_id,
            "seq": seq,
            "kind": kind,
            "name": name,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "detail": detail,
            "started_at": started_at,
        }

    def start_deferred(self, step_id: str) -> bool:
        """Whether step ``step_id``'s start record is still held (not yet written)."""
        return step_id in self._deferred

    async def write_deferred_start(self, step_id: str, *, now: bool = False) -> None:
        """Write step ``step_id``'s held start record now, if it is still held.

        ``now``: stamp it with the database's clock (the attempt has not begun yet)
        instead of the held start time (the worker's estimate).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        args = self._deferred.get(step_id)
        if args is None:
            return
        # Its own task, shielded: a sibling's failure cancels this attempt while the write
        # may be queued (group commit) or in flight. Cut short, it would be sent after the
        # run's failure had committed, be refused by its fence, and the branch would leave
        # no steps row; whole, it commits first (the run is still leased: :meth:`settle`
        # waits for it) and the failure lists the branch as cancelled.
        task = asyncio.ensure_future(
            self.start_attempt(**({**args, "started_at": None} if now else args))
        )
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        task.add_done_callback(_retrieved)
        await asyncio.shield(task)

    async def record_attempt(self, *, step_id: str, attempt: int, output: str) -> None:
        """Journal a step attempt's result (``output``: encoded JSON text), with its start.

        If the start record is still held (:meth:`defer_start`), start and result are one
        write, ``step_started`` then ``step_succeeded``; otherwise the result alone with
        ``step_succeeded``. Step emits made so far are written first either way (an emit
        writes the held start record with it).

        With ``TREADLE_STEP_RESULT_HOLD_SECONDS`` above 0 the write is held, not sent:
        this returns at once, and the result is written before the run's next write
        (:meth:`release_held`), with the run's outcome (:meth:`settle`: a run's last step
        commits with its completion), or alone when the hold is up. A result held before
        this one (a parallel branch's) is written first. See
        docs/adr/0047-held-step-results.md.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault (of
                this write, or of the held result written before it).
        """
        if self._emitter is not None:
            await self._emitter.flush_steps()
        while self._held is not None:
            await self.release_held()
        result = self._result_write(step_id=step_id, attempt=attempt, output=output)
        self._deferred.pop(step_id, None)
        hold = self.settings.step_result_hold_seconds
        if hold <= 0:
            await self._commit_result(result)
            return
        # What rides on the step's write today (lines and emits made before its result)
        # rides on the held one, so the timeline keeps its order: anything the workflow
        # logs or emits after this step follows the step's events.
        result.riders = self._take_riders()
        result.timer = asyncio.get_running_loop().call_later(hold, self._send_held, result)
        self._held = result

    def _result_write(self, *, step_id: str, attempt: int, output: str) -> _HeldResult:
        # The write of a step's result in its three forms: multi-statement rows, single
        # statement, group-commit row (the whole attempt when its start is still held).
        args = self._deferred.get(step_id)
        if args is None:

            async def success(conn: AsyncConnection) -> None:
                await self._success_rows(conn, step_id=step_id, attempt=attempt, output=output)

            params: dict[str, Any] = {
                "run_id": self.run_id,
                "tenant_id": self.tenant_id,
                "fence": self.fence,
                "step_id": step_id,
                "output": output,
                "event_data": json.dumps({"attempt": attempt}),
            }

            async def record(conn: AsyncConnection) -> bool:
                return await checkpoints_q.record_success(conn, **params)

            return _HeldResult(
                success, record, group_commit.Grouped(group_commit.RECORD_SUCCESS, params)
            )

        async def whole(conn: AsyncConnection) -> None:
            await self._start_rows(conn, **args)
            await self._success_rows(conn, step_id=step_id, attempt=attempt, output=output)

        done: dict[str, Any] = {
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "fence": self.fence,
            "output": output,
            "started_data": json.dumps({"attempt": attempt, "worker_id": self.worker_id}),
            "event_data": json.dumps({"attempt": attempt}),
            **args,
        }

        async def statement(conn: AsyncConnection) -> bool:
            return await checkpoints_q.step_done(conn, **done)

        return _HeldResult(
            whole,
            statement,
            group_commit.Grouped(group_commit.STEP_DONE, done),
            whole_attempt=done,
        )

    async def _commit_result(self, result: _HeldResult) -> None:
        sent = time.monotonic()
        news = await self._write_now(
            result.rows, single=result.single, grouped=result.grouped, riders=result.riders
        )
        self._note_pause_news(sent, news)
        self.lost_claims = 0

    def _send_held(self, result: _HeldResult) -> None:
        # The hold is up (a call_later callback): the result goes alone, now.
        if self._held is result and result.sending is None:
            result.sending = asyncio.ensure_future(self._commit_held(result))
            result.sending.add_done_callback(_retrieved)

    async def _commit_held(self, result: _HeldResult) -> None:
        await self._commit_result(result)
        if self._held is result:
            self._held = None

    async def release_held(self) -> None:
        """Write the held step result now, if one is held (or wait for its write).

        Called before every other write of the run and by :meth:`is_paused`: nothing is
        journaled after a step, and no new step starts, before that step's result is
        committed. A held write that failed raises its error to every caller until the
        run is given up.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        result = self._held
        if result is None:
            return
        if result.sending is None:
            if result.timer is not None:
                result.timer.cancel()
            result.sending = asyncio.ensure_future(self._commit_held(result))
            result.sending.add_done_callback(_retrieved)
        # Shielded: a caller cancelled while it waits does not cut the write short.
        await asyncio.shield(result.sending)

    async def _take_held(self) -> _HeldResult | None:
        # The held result, unsent, for the outcome's write to carry; or None once any
        # write of it is done (awaited here: the outcome never precedes it).
        result = self._held
        if result is None:
            return None
        if result.sending is None:
            if result.timer is not None:
                result.timer.cancel()
            self._held = None
            return result
        await self.release_held()
        return None

    def _note_pause_news(self, sent: float, news: object) -> None:
        # A bool when the statement read paused_at (PostgreSQL's single statement or its
        # group-commit row); the multi-statement form (SQLite, riders) reads nothing.
        if isinstance(news, bool):
            self._pause_news = (sent, news)

    @contextlib.asynccontextmanager
    async def step_transaction(self) -> AsyncIterator[AsyncConnection]:
        """The write transaction a transactional step's own writes run in.

        It commits with the step's checkpoint (:meth:`record_transaction`), once; any
        exception rolls both back (app/engine/transactions.py).
        """
        async with self.db.write() as conn:
            yield conn

    async def record_transaction(
        self,
        conn: AsyncConnection,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        attempt: int,
        max_attempts: int,
        detail: str | None,
        output: str,
        started: bool = False,
    ) -> None:
        """Checkpoint a transactional step inside its own transaction (``conn``).

        The fence is checked after the step's function ran, so the run row is locked for
        the commit only; zero rows raises ``LeaseLost``, which rolls the function's
        writes back with the rest. Start and result are journaled together: a crash
        inside the transaction leaves nothing to account for. Nothing rides along (log
        lines and markers wait for the next write, which a retry cannot roll back).
        ``started``: the start record was written before the transaction (an attempt
        after a retry backoff, :meth:`start_attempt`); only the result is written.

        Raises:
            LeaseLost: the fence moved.
        """
        await runs_q.check_fence(conn, self.run_id, self.fence, tenant_id=self.tenant_id)
        if not started:
            await self._start_rows(
                conn,
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                attempt=attempt,
                max_attempts=max_attempts,
                detail=detail,
            )
        await self._success_rows(conn, step_id=step_id, attempt=attempt, output=output)

    async def schedule_retry(
        self,
        *,
        step_id: str,
        attempt: int,
        info: dict[str, Any],
        delay: float,
        timed_out: bool,
    ) -> None:
        """Journal a failed attempt that will be retried in ``delay`` seconds (DB time).

        ``info`` is the error description journaled on the step; the event is
        ``step_timed_out`` for a timeout, else ``step_retry_scheduled``.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def schedule(conn: AsyncConnection) -> None:
            await self._deferred_rows(conn, step_id)
            await steps_q.finish_attempt(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                status=StepStatus.RETRY_WAIT,
                output=None,
                error=json.dumps(info),
                fence=self.fence,
                retry_in=delay,
            )
            await events_q.append(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                kind=EventKind.STEP_TIMED_OUT if timed_out else EventKind.STEP_RETRY_SCHEDULED,
                step_id=step_id,
                data={
                    "attempt": attempt,
                    "error_type": info["type"],
                    "message": info["message"][:500],
                    "retry_in_seconds": delay,
                },
            )

        await self._write(schedule)
        self._deferred.pop(step_id, None)

    async def fail_step(
        self,
        *,
        step_id: str,
        status: StepStatus,
        reason: RunReason,
        info: dict[str, Any],
        attempt: int,
    ) -> None:
        """Journal a step that gave up (``failed`` / ``timed_out``) with ``step_failed``.

        ``info`` already carries ``reason`` and ``attempts`` (the executor adds them).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def fail(conn: AsyncConnection) -> None:
            await self._deferred_rows(conn, step_id)
            await steps_q.finish_attempt(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                status=status,
                output=None,
                error=json.dumps(info),
                fence=self.fence,
            )
            await events_q.append(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                kind=EventKind.STEP_FAILED,
                step_id=step_id,
                data={
                    "attempt": attempt,
                    "reason": reason.value,
                    "error_type": info["type"],
                    "message": str(info["message"])[:500],
                },
            )

        await self._write(fail)
        self._deferred.pop(step_id, None)

    # --- compensation -------------------------------------------------------------------

    async def begin_compensation(self, *, reason: RunReason, error: dict[str, Any] | None) -> None:
        """Mark the run ``compensating``, keeping the failure being undone on the row.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        error_text = None if error is None else json.dumps(error)

        async def mark(conn: AsyncConnection) -> None:
            await runs_q.begin_compensation(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                fence=self.fence,
                reason=reason.value,
                error=error_text,
            )

        await self._write(mark)

    async def compensation_done(self, *, step_id: str, status: StepStatus) -> None:
        """Record how the undo of step ``step_id`` ended (``compensated`` / ``..._failed``).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def record(conn: AsyncConnection) -> None:
            await steps_q.set_status(
                conn, run_id=self.run_id, tenant_id=self.tenant_id, step_id=step_id, status=status
            )

        await self._write(record)

    # --- the outcome --------------------------------------------------------------------

    async def settle(self, outcome: Outcome) -> None:
        """Persist what the execution came to, under the fence, in one write.

        ``Completed``: the output and ``run_completed``. ``Failed``: the terminal status
        and its event, unfinished branches cancelled, a dead letter for ``failed``.
        ``Suspended``: the release with its due time and ``run_released``, made due at
        once if a wake check finds the wait satisfied already (the run row is locked by
        the release, so a signal or decision that raced it is seen). A terminal outcome
        writes the run's webhook deliveries, hands its concurrency slot to the oldest
        waiter and wakes a joined parent, in the same transaction. A step result still
        held (:meth:`record_attempt`) is written first in the same write, so a run's last
        step commits with its outcome. A completion with no slot and no parent is one
        statement on PostgreSQL (:func:`app.db.queries.checkpoints.commit`), its last
        step's whole attempt included when that was held with nothing riding on it
        (:func:`app.db.queries.checkpoints.complete_with_step`).

        Faults are not turned into ``CheckpointFault`` here: the caller gives the run
        back on any classified fault alike.

        Raises:
            LeaseLost: the fence moved; nothing was written.
        """
        if self._starting:
            # Start records of branches cut short, still being written: committed (or
            # refused) before the outcome, never after it (write_deferred_start).
            await asyncio.gather(*self._starting, return_exceptions=True)
        # The result still held (the run's last step): written by this same write.
        held = await self._take_held()
        run = self.run
        run_id, tenant_id, fence = self.run_id, self.tenant_id, self.fence

        async def write(conn: AsyncConnection) -> None:
            # Re-run whole after a conflict: nothing outside the database changes in here.
            if held is not None:
                await runs_q.check_fence(conn, run_id, fence, tenant_id=tenant_id)
                if held.riders is not None:
                    await self._rider_rows(conn, held.riders)
                await held.rows(conn)
            if isinstance(outcome, Completed):
                await runs_q.finish_run(
                    conn,
                    run_id=run_id,
                    tenant_id=tenant_id,
                    fence=fence,
                    status=RunStatus.COMPLETED,
                    reason="succeeded",
                    output=outcome.output,
                    error=None,
                )
                await events_q.append(
                    conn, run_id=run_id, tenant_id=tenant_id, kind=EventKind.RUN_COMPLETED
                )
            elif isinstance(outcome, Failed):
                await self._failed_rows(conn, outcome)
            else:
                await self._released_rows(conn, outcome)
            if isinstance(outcome, Suspended):
                return
            # Its webhook deliveries are written with the terminal state (app/engine/webhooks.py).
            await webhooks.run_became_terminal(conn, run_id, tenant_id=tenant_id)
            # The run's concurrency slot goes to its key's oldest waiter, in this same
            # transaction (app/engine/slots.py).
            if await slots.release(conn, run):
                await notify(conn)
            # A parent joined on this child waits for exactly this moment.
            if run["parent_run_id"] is not None and await runs_q.wake_parent(
                conn, parent_run_id=run["parent_run_id"], tenant_id=tenant_id
            ):
                await notify(conn)

        # Nothing else changes with this outcome: one self-fencing statement where allowed
        # (with the held result when that is a whole quick attempt with nothing riding).
        statement: Callable[[AsyncConnection], Awaitable[object]] | None = None
        grouped: group_commit.Grouped | None = None
        if (
            isinstance(outcome, Completed)
            and run["concurrency_slot"] is None
            and run["parent_run_id"] is None
        ):
            bare = {"run_id": run_id, "tenant_id": tenant_id, "fence": fence}
            if held is None:
                params: dict[str, Any] = {**bare, "output": outcome.output}
                statement = functools.partial(checkpoints_q.complete_run, **params)
                grouped = group_commit.Grouped(group_commit.COMPLETE_RUN, params)
            elif held.whole_attempt is not None and (held.riders is None or held.riders.empty):
                params = {**held.whole_attempt, "run_output": outcome.output}
                statement = functools.partial(checkpoints_q.complete_with_step, **params)
                grouped = group_commit.Grouped(group_commit.COMPLETE_WITH_STEP, params)
        await checkpoints_q.commit(
            self.db, write, statement=statement, grouped=grouped, what="run outcome"
        )
        if held is not None:
            self.lost_claims = 0
        story_log.run_outcome(outcome)
        if isinstance(outcome, Completed):
            metrics.RUNS_FINISHED.labels(run["workflow"], "completed", "succeeded").inc()
        elif isinstance(outcome, Failed):
            metrics.RUNS_FINISHED.labels(
                run["workflow"], outcome.status.value, outcome.reason.value
            ).inc()

    async def _failed_rows(self, conn: AsyncConnection, outcome: Failed) -> None:
        run_id, tenant_id = self.run_id, self.tenant_id
        error = outcome.error or {}
        error_text = None if outcome.error is None else json.dumps(outcome.error)
        await runs_q.finish_run(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            fence=self.fence,
            status=outcome.status,
            reason=outcome.reason.value,
            output=None,
            error=error_text,
        )
        # Branches still mid-attempt when the body ended were cancelled: by the cancel
        # request the run was carrying out, else by the run's failure. Those whose start
        # record was still held get it now, so they are listed as cancelled too.
        for args in self._deferred.values():
            await self._start_rows(conn, **args)
        if (
            outcome.reason == RunReason.CANCELED_BY_REQUEST
            or self.run["status"] == RunStatus.CANCELLING.value
        ):
            await steps_q.cancel_running(conn, run_id, tenant_id=tenant_id)
        else:
            failed_at = error.get("step_id")
            await steps_q.cancel_running(
                conn,
                run_id,
                RunReason.CANCELED_BY_FAILURE,
                f"cancelled: the run failed ({outcome.reason.value}"
                + (f" at step {failed_at!r}" if failed_at else "")
                + ") while this step was unfinished",
                tenant_id=tenant_id,
            )
        kind = {
            RunStatus.CANCELLED: EventKind.RUN_CANCELLED,
            RunStatus.COMPENSATED: EventKind.RUN_COMPENSATED,
        }.get(outcome.status, EventKind.RUN_FAILED)
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=kind,
            data={
                "reason": outcome.reason.value,
                "error_type": error.get("type"),
                "message": str(error.get("message", ""))[:500],
                # Authorization failures say why: tenant suspended or key revoked.
                **(
                    {"cause": error.get("cause")}
                    if outcome.reason == RunReason.FAILURE_AUTHORIZATION
                    else {}
                ),
            },
        )
        if outcome.status == RunStatus.FAILED:
            dl_id = await dl_q.insert_dead_letter(
                conn,
                run_id=run_id,
                tenant_id=tenant_id,
                workflow=self.run["workflow"],
                reason=outcome.reason.value,
                error=error_text,
            )
            await events_q.append(
                conn,
                run_id=run_id,
                tenant_id=tenant_id,
                kind=EventKind.DEAD_LETTER_WRITTEN,
                data={"dead_letter_id": str(dl_id)},
            )

    async def _released_rows(self, conn: AsyncConnection, outcome: Suspended) -> None:
        await runs_q.release_run(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            fence=self.fence,
            status=outcome.status,
            delay=outcome.delay,
            waiting_kind=outcome.waiting_kind,
            waiting_name=outcome.waiting_name,
        )
        await events_q.append(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            kind=EventKind.RUN_RELEASED,
            data={
                "status": outcome.status.value,
                "resume_in_seconds": outcome.delay,
                "waiting_on": outcome.waiting_kind,
                "name": outcome.waiting_name,
            },
        )
        # The row is locked by the release above: a signal or decision that arrived while
        # we were releasing is seen here, and the run stays due.
        for check in outcome.wake_checks:
            if await check(conn):
                await runs_q.make_due(conn, run_id=self.run_id, tenant_id=self.tenant_id)
                break

    async def give_back(self, *, why: str = "worker draining", delay: float = 0.0) -> bool:
        """Release the run ``queued`` (drain: at once; after a database fault: ``delay`` s).

        Attempts it interrupted are reset, not counted: another worker (or this one) may
        claim the run when ``delay`` has passed. On the lease pool, like heartbeats: a
        drain or a fault's give-back must not queue behind steps holding the main pool.
        Never raises: a lease already gone, or a release that cannot be written, leaves
        the run to its lease's expiry.

        Returns:
            True if the release was written.
        """

        async def release(conn: AsyncConnection) -> None:
            # Fenced first: if the lease is gone this raises and nothing is touched.
            await runs_q.release_run(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                fence=self.fence,
                status=RunStatus.QUEUED,
                delay=delay,
            )
            await steps_q.reset_interrupted(conn, self.run_id, tenant_id=self.tenant_id)
            await events_q.append(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                kind=EventKind.RUN_RELEASED,
                data={"status": RunStatus.QUEUED.value, "why": why},
            )

        try:
            await checkpoints_q.commit(self.db, release, what="release", pool="lease")
        except LeaseLost:
            return False
        except Exception as exc:  # noqa: BLE001 - the lease will expire instead
            log.warning(
                "release failed",
                worker_id=self.worker_id,
                run_id=str(self.run_id),
                error=str(exc)[:300],
            )
            return False
        story_log.given_back(why, delay)
        return True


@dataclass(slots=True, eq=False)
class _HeldResult:
    """A step result's write, in its forms, while it is held (RunJournal.record_attempt).

    ``rows`` is the multi-statement form (no fence check: the enclosing write's), ``single``
    and ``grouped`` the self-fencing statement and its group-commit row; ``whole_attempt``
    the parameters of :func:`app.db.queries.checkpoints.step_done` when start and result
    go together (the form a bare completion can carry in one statement). ``riders``: what
    rode on it, taken when the step finished; ``timer`` sends it when the hold is up;
    ``sending``: its write, once sent.
    """

    rows: Callable[[AsyncConnection], Awaitable[None]]
    single: Callable[[AsyncConnection], Awaitable[object]]
    grouped: group_commit.Grouped
    whole_attempt: dict[str, Any] | None = None
    riders: _Riders | None = None
    timer: asyncio.TimerHandle | None = None
    sending: asyncio.Future[None] | None = None


@dataclass(frozen=True, slots=True)
class _Riders:
    """What rides on a fenced write: ``ctx.patched`` markers, log lines, workflow emits."""

    markers: list[tuple[str, int, str]]
    lines: list[Any]
    overflow: int
    emits: list[events_q.Emit]

    @property
    def empty(self) -> bool:
        return not (self.markers or self.lines or self.overflow or self.emits)


def _retrieved(task: asyncio.Future[None]) -> None:
    # A start record whose caller was cancelled: its outcome is the settle's concern (or
    # nobody's, once the run is lost), never an "exception was never retrieved" warning.
    if not task.cancelled():
        task.exception()


async def load_entries(db: Database, row: RowMapping) -> Sequence[RowMapping]:
    """The journal a claimed run replays (its ``steps`` rows), read only when it has one.

    Steps are journaled only by an execution under a claim, and the claim bumps
    ``attempt``: a run's first claim has nothing to replay, so a fresh run skips this
    read (one transaction per run on the hot path). A rerun is the exception: it starts
    with its original's prefix (docs/adr/0022-rerun-from-a-step.md).
    """
    if int(row["attempt"]) <= 1 and row.get("rerun_of") is None:
        return ()
    async with db.read() as conn:
        return await steps_q.load_journal(conn, row["run_id"], tenant_id=row["tenant_id"])
