"""The test environment: the real engine, a throwaway SQLite database, a virtual clock.

See :mod:`app.sdk.testing` for the overview and docs/authoring.md for the guide.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from pydantic import BaseModel
from sqlalchemy import func, select, tuple_, type_coerce

from app.core import json
from app.core.settings import Settings
from app.core.status import EventKind, RunStatus, StepStatus
from app.db.database import Database
from app.db.dialect import now_expr
from app.db.migrations import upgrade_to_head
from app.db.queries import events as events_q
from app.db.queries import run_logs as run_logs_q
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import runs
from app.db.types import UtcDateTime
from app.engine import control
from app.engine.events import EventPost, post_event
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk.testing.clock import VirtualClock, install_clock
from app.sdk.workflow import WorkflowDefinition
from app.worker.worker import Worker

__all__ = [
    "EmitSnapshot",
    "EventSnapshot",
    "RunBlocked",
    "RunHandle",
    "RunNotCompleted",
    "RunSnapshot",
    "StepSnapshot",
    "WorkflowTestEnv",
]

OutT = TypeVar("OutT")


# --- a migrated template, built once per process ---------------------------------------

_template_lock = threading.Lock()
_template: Path | None = None


def _migrated_template() -> Path:
    """Path of a SQLite file at the Alembic head (the same migrations production runs)."""
    global _template
    with _template_lock:
        if _template is None or not _template.exists():
            directory = Path(tempfile.mkdtemp(prefix="treadle-testkit-"))
            path = directory / "template.db"
            upgrade_to_head(f"sqlite+aiosqlite:///{path}")
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            _template = path
        return _template


# --- what tests read --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunHandle(Generic[OutT]):
    """A run started by :meth:`WorkflowTestEnv.start`; typed by the workflow's output."""

    run_id: uuid.UUID
    definition: WorkflowDefinition[Any, OutT]


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """A run as ``GET /runs/{id}`` would show it (JSON payloads decoded).

    Attributes:
        waiting_kind: ``timer``, ``retry``, ``signal``, ``approval`` or ``child`` while
            the run waits; ``waiting_deadline`` is when the wait is due or times out
            (virtual database time).
        concurrency_slot: the slot of its concurrency key the run holds (1..key_limit),
            None without a key or while it waits for one (``blocked_reason`` says so).
    """

    run_id: uuid.UUID
    workflow: str
    version: str
    status: RunStatus
    reason: str | None
    output: Any
    error: dict[str, Any] | None
    waiting_kind: str | None
    waiting_name: str | None
    waiting_deadline: datetime | None
    attempt: int
    created_at: datetime
    finished_at: datetime | None
    concurrency_slot: int | None
    blocked_reason: str | None


@dataclass(frozen=True, slots=True)
class StepSnapshot:
    """One journal entry (a step, wait, value, child or compensation), in call order."""

    step_id: str
    kind: str
    name: str
    status: StepStatus
    attempt: int
    output: Any
    error: dict[str, Any] | None
    deadline: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class EventSnapshot:
    """One timeline event of a run."""

    at: datetime
    kind: str
    step_id: str | None
    actor: str | None
    data: Any


@dataclass(frozen=True, slots=True)
class LogSnapshot:
    """One line the run kept from ``ctx.logger`` (``step_id``/``attempt`` None in workflow code)."""

    seq: int
    at: datetime
    level: str
    message: str
    fields: dict[str, Any] | None
    step_id: str | None
    attempt: int | None


@dataclass(frozen=True, slots=True)
class EmitSnapshot:
    """One ``ctx.emit`` the run kept (``step_id``/``attempt`` None in workflow code)."""

    name: str
    data: Any
    step_id: str | None
    attempt: int | None


class RunNotCompleted(Exception):
    """Raised by :meth:`WorkflowTestEnv.result` for a run that did not complete.

    The run ended ``failed``, ``compensated`` or ``cancelled``; ``snapshot`` has its
    reason and error.
    """

    def __init__(self, snapshot: RunSnapshot) -> None:
        message = (snapshot.error or {}).get("message", "")
        super().__init__(
            f"run {snapshot.run_id} ended {snapshot.status.value} ({snapshot.reason}): {message}"
        )
        self.snapshot = snapshot


class RunBlocked(Exception):
    """The run cannot make progress by time alone.

    It waits for a signal, an approval without a timeout, a child of a workflow the
    environment does not run, or a slot of its concurrency key held by a run that cannot
    finish by time alone; ``snapshot`` says which.
    """

    def __init__(self, snapshot: RunSnapshot) -> None:
        if snapshot.blocked_reason:
            message = f"run {snapshot.run_id} is {snapshot.blocked_reason}, with nothing due"
        else:
            message = (
                f"run {snapshot.run_id} is {snapshot.status.value}, waiting on "
                f"{snapshot.waiting_kind} {snapshot.waiting_name!r} with nothing due: "
                "send it with env.signal / env.approve first"
            )
        super().__init__(message)
        self.snapshot = snapshot


def _decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _snapshot(row: Any) -> RunSnapshot:
    return RunSnapshot(
        run_id=row["run_id"],
        workflow=row["workflow"],
        version=row["version"],
        status=RunStatus(row["status"]),
        reason=row["reason"],
        output=_decode(row["output"]),
        error=_decode(row["error"]),
        waiting_kind=row["waiting_kind"],
        waiting_name=row["waiting_name"],
        waiting_deadline=row["waiting_deadline"],
        attempt=int(row["attempt"]),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        concurrency_slot=row["concurrency_slot"],
        blocked_reason=row["blocked_reason"],
    )


def _run_id(run: RunHandle[Any] | uuid.UUID) -> uuid.UUID:
    return run.run_id if isinstance(run, RunHandle) else run


# --- the environment --------------------------------------------------------------------


class WorkflowTestEnv:
    """An in-process Treadle (database, registry, one worker) for unit tests.

    Use it as an async context manager; the database lives in a temporary directory that
    is removed on exit.

    Args:
        handlers: the workflow definitions to run (children included).
        start: the virtual time at entry (aware); default: the real time.
        tenant_id: tenant of every run started here.
        submitter: subject that submits runs (an approver must differ unless the
            approval allows ``self_approval``).
        concurrency: runs the worker executes at once.
        settle_timeout: real seconds an action may take to reach idle before
            :class:`TimeoutError` (a step that never returns).
        settings: overrides of :class:`~app.core.settings.Settings` fields (ceilings,
            ``max_lost_attempts``, …). ``database_url`` and ``inline_retry_max_seconds``
            are the kit's: every wait goes through the (virtual) database clock.
    """

    def __init__(
        self,
        handlers: Iterable[WorkflowDefinition[Any, Any]],
        *,
        start: datetime | None = None,
        tenant_id: str = "test",
        submitter: str = "test-submitter",
        concurrency: int = 8,
        settle_timeout: float = 30.0,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.registry = Registry(handlers)
        if not len(self.registry):
            raise ValueError("WorkflowTestEnv needs at least one workflow definition")
        self.clock = VirtualClock(start)
        self.tenant_id = tenant_id
        self.submitter = submitter
        self.concurrency = concurrency
        self.settle_timeout = settle_timeout
        self._overrides = dict(settings or {})
        self._dir: Path | None = None
        self._db: Database | None = None
        self._worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._submit: Submitter | None = None
        self._settings: Settings | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Create the database, register the handlers and start the worker."""
        try:
            await self._open()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _open(self) -> None:
        template = await asyncio.to_thread(_migrated_template)
        self._dir = Path(tempfile.mkdtemp(prefix="treadle-testenv-"))
        path = self._dir / "treadle.db"
        shutil.copy(template, path)
        self._settings = Settings(
            **{
                "lease_ttl_seconds": 30.0,
                "heartbeat_interval_seconds": 5.0,
                "poll_interval_seconds": 0.05,
                "drain_grace_seconds": 5.0,
                **self._overrides,
                "database_url": f"sqlite+aiosqlite:///{path}",
                "data_dir": self._dir / "data",
                # Every wait, even a 0.1 s back-off, releases the run until its due time
                # on the database clock, so the virtual clock governs all of them.
                "inline_retry_max_seconds": 0.0,
            }
        )
        self._db = Database(self._settings)
        install_clock(self._db.engine, self.clock)
        if self._db.read_engine is not self._db.engine:
            install_clock(self._db.read_engine, self.clock)
        self._worker = Worker(
            self._settings,
            self._db,
            self.registry,
            concurrency=self.concurrency,
            worker_id=f"testkit:{uuid.uuid4().hex[:8]}",
        )
        self._submit = Submitter(self._db, self._settings, cache_seconds=0.0)
        await self._worker.register()
        self._worker_task = asyncio.create_task(self._worker.run(), name="testkit-worker")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the worker, close the database and delete it."""
        try:
            if self._worker is not None and self._worker_task is not None:
                self._worker.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._worker_task, self.settle_timeout)
        finally:
            if self._db is not None:
                await self._db.dispose()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def database(self) -> Database:
        """The environment's database (to check rows your steps wrote)."""
        if self._db is None:
            raise RuntimeError("use WorkflowTestEnv as `async with WorkflowTestEnv(...)`")
        return self._db

    @property
    def settings(self) -> Settings:
        """The settings the engine runs with."""
        if self._settings is None:
            raise RuntimeError("use WorkflowTestEnv as `async with WorkflowTestEnv(...)`")
        return self._settings

    def now(self) -> datetime:
        """The virtual database time (aware UTC)."""
        return self.clock.now()

    # --- driving ------------------------------------------------------------------------

    async def start(
        self,
        workflow: WorkflowDefinition[Any, OutT],
        input: BaseModel | dict[str, Any],
        *,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        delay: float | None = None,
        settle: bool = True,
    ) -> RunHandle[OutT]:
        """Submit a run exactly as ``POST /runs`` does, then run until idle.

        Args:
            workflow: one of the environment's definitions (its version is pinned).
            input: the input model, or its JSON form (validated against the registered
                JSON Schema, like the API does).
            idempotency_key: optional, as in ``POST /runs``.
            concurrency_key: optional, as in ``POST /runs`` (a state machine's parent).
            delay: seconds before the run becomes claimable (virtual time).
            settle: False to return right after the submit (nothing executed yet).

        Raises:
            InvalidInput: input fails the schema (nothing stored).
            WorkflowNotFound: ``workflow`` is not one of the environment's handlers.
        """
        assert self._submit is not None, "use WorkflowTestEnv as a context manager"
        payload = input.model_dump(mode="json") if isinstance(input, BaseModel) else input
        row, _ = await self._submit.submit(
            SubmitRequest(
                workflow=workflow.name,
                input=payload,
                version=workflow.version,
                idempotency_key=idempotency_key,
                concurrency_key=concurrency_key,
                delay=delay,
            ),
            tenant_id=self.tenant_id,
            subject=self.submitter,
        )
        if settle:
            await self.run_until_idle()
        return RunHandle(row["run_id"], workflow)

    async def run_until_idle(self, *, timeout: float | None = None) -> None:
        """Let the worker execute until nothing runs and nothing is due (virtual time).

        Runs waiting on a later timer, retry or deadline stay waiting: :meth:`skip` or
        :meth:`result` moves the clock to them.

        Raises:
            TimeoutError: not idle within ``timeout`` real seconds (default
                ``settle_timeout``): a step that never returns.
            RuntimeError: an execution crashed inside the engine and left its run
                leased (the worker logged ``execution crashed`` with the traceback).
        """
        worker = self._require_worker()
        limit = self.settle_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        orphaned_since: float | None = None
        while True:
            worker.wake()
            await asyncio.sleep(0)
            busy, _next = await self._pending()
            if not busy:
                return
            now = time.monotonic()
            if await self._orphaned_leases(worker):
                # An execution ended without writing an outcome (the worker logged
                # "execution crashed"): its lease would only expire after the lease TTL.
                orphaned_since = orphaned_since or now
                if now - orphaned_since > 1.0:
                    raise RuntimeError(
                        "an execution crashed inside the engine (see the worker's "
                        "'execution crashed' log record); its run stays leased"
                    )
            else:
                orphaned_since = None
            if now > deadline:
                raise TimeoutError(f"the engine was not idle after {limit} s")
            await asyncio.sleep(0.005)

    async def skip(self, delta: timedelta | float) -> None:
        """Settle, move the virtual clock forward, then run whatever became due.

        Args:
            delta: a duration, or seconds.
        """
        await self.run_until_idle()
        self.clock.advance(delta if isinstance(delta, timedelta) else timedelta(seconds=delta))
        await self.run_until_idle()

    async def skip_to_next(self) -> datetime | None:
        """Jump to the earliest due time of any waiting run and run until idle.

        Returns:
            The due time jumped to, or None when nothing waits on time.
        """
        await self.run_until_idle()
        _busy, due = await self._pending()
        if due is None:
            return None
        gap = due - self.clock.now()
        # One millisecond past due: SQLite's clock text has millisecond resolution.
        self.clock.advance(max(gap, timedelta(0)) + timedelta(milliseconds=1))
        await self.run_until_idle()
        return due

    async def advance_until(
        self,
        run: RunHandle[Any] | uuid.UUID,
        *statuses: RunStatus,
        max_skip: timedelta = timedelta(days=366),
    ) -> RunSnapshot:
        """Run, skipping from one due time to the next, until the run is in ``statuses``.

        Useful before :meth:`approve` when the run must first get past retries or
        timers: ``await env.advance_until(run, RunStatus.WAITING_APPROVAL)``.

        Args:
            run: the run.
            statuses: wanted statuses; a terminal run always stops the advance.
            max_skip: the most virtual time this call may skip in total.

        Returns:
            The run, in one of ``statuses`` or terminal.

        Raises:
            RunBlocked: the run waits on something time cannot bring (a signal, an
                approval without timeout).
            TimeoutError: getting there would need more than ``max_skip``.
        """
        started = self.clock.now()
        await self.run_until_idle()
        while True:
            snapshot = await self.get(run)
            if snapshot.status in statuses or snapshot.status.is_terminal:
                return snapshot
            _busy, due = await self._pending()
            if due is None:
                raise RunBlocked(snapshot)
            if due - started > max_skip:
                raise TimeoutError(
                    f"run {snapshot.run_id} would need more than {max_skip} of virtual time"
                )
            await self.skip_to_next()

    async def wait_finished(
        self, run: RunHandle[Any] | uuid.UUID, *, max_skip: timedelta = timedelta(days=366)
    ) -> RunSnapshot:
        """:meth:`advance_until` the run is terminal; returns it.

        Raises:
            RunBlocked, TimeoutError: see :meth:`advance_until`.
        """
        return await self.advance_until(run, max_skip=max_skip)

    async def result(
        self, run: RunHandle[OutT], *, max_skip: timedelta = timedelta(days=366)
    ) -> OutT:
        """The run's typed output once it completes (skipping time as needed).

        Raises:
            RunNotCompleted: it ended ``failed``, ``compensated`` or ``cancelled``.
            RunBlocked, TimeoutError: see :meth:`wait_finished`.
        """
        snapshot = await self.wait_finished(run, max_skip=max_skip)
        if snapshot.status != RunStatus.COMPLETED:
            raise RunNotCompleted(snapshot)
        return run.definition.output_adapter.validate_python(snapshot.output)

    # --- outside events -----------------------------------------------------------------

    async def signal(
        self,
        run: RunHandle[Any] | uuid.UUID,
        name: str,
        payload: Any = None,
        *,
        sender: str = "test-sender",
    ) -> int:
        """Send a signal as ``POST /runs/{id}/signals/{name}`` does, then run until idle.

        Returns:
            The signal id.

        Raises:
            RunFinished: the run is terminal.
        """
        if isinstance(payload, BaseModel):
            payload = payload.model_dump(mode="json")
        signal_id = await control.send_signal(
            self.database,
            self.settings,
            tenant_id=self.tenant_id,
            run_id=_run_id(run),
            name=name,
            payload=payload,
            actor=sender,
        )
        await self.run_until_idle()
        return signal_id

    async def post_event(
        self,
        name: str,
        data: Any = None,
        *,
        key: str | None = None,
        sender: str = "test-sender",
    ) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """Post an event as ``POST /events`` does (triggers and waits), then run until idle.

        Returns:
            ``(started run ids, resumed run ids)``, as the API's response lists them.

        Raises:
            IdempotencyConflict: ``key`` was used for a different event.
            InvalidInput: the data fails a triggered workflow's input schema.
        """
        assert self._submit is not None, "use WorkflowTestEnv as a context manager"
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        record, _ = await post_event(
            self.database,
            self._submit,
            EventPost(name=name, data=data, key=key),
            tenant_id=self.tenant_id,
            subject=sender,
        )
        await self.run_until_idle()
        return record.started_run_ids, record.resumed_run_ids

    async def approve(
        self,
        run: RunHandle[Any] | uuid.UUID,
        step: str,
        *,
        approver: str = "test-approver",
        groups: Sequence[str] = (),
        payload: Any = None,
        comment: str | None = None,
    ) -> bool:
        """Approve the waiting approval ``step`` as ``approver`` (a member of ``groups``).

        Runs until idle first (so the run has reached the approval) and after.

        Returns:
            True when this decision settled the approval.

        Raises:
            StepNotFound: the run has no approval ``step`` (it has not reached it).
            Forbidden: ``approver`` is not in the approval's group, or submitted the run.
            InvalidState: already decided, or not waiting.
        """
        return await self._decide(run, step, "approve", approver, groups, payload, comment)

    async def reject(
        self,
        run: RunHandle[Any] | uuid.UUID,
        step: str,
        *,
        approver: str = "test-approver",
        groups: Sequence[str] = (),
        payload: Any = None,
        comment: str | None = None,
    ) -> bool:
        """Reject the approval ``step``; see :meth:`approve`."""
        return await self._decide(run, step, "reject", approver, groups, payload, comment)

    async def _decide(
        self,
        run: RunHandle[Any] | uuid.UUID,
        step: str,
        decision: str,
        approver: str,
        groups: Sequence[str],
        payload: Any,
        comment: str | None,
    ) -> bool:
        await self.run_until_idle()
        outcome = await control.decide_approval(
            self.database,
            self.settings,
            tenant_id=self.tenant_id,
            run_id=_run_id(run),
            step_id=step,
            subject=approver,
            groups=frozenset(groups),
            decision=decision,
            payload=payload,
            comment=comment,
        )
        await self.run_until_idle()
        return bool(outcome["resolved"])

    async def cancel(
        self, run: RunHandle[Any] | uuid.UUID, *, reason: str | None = None
    ) -> RunSnapshot:
        """Cancel as ``POST /runs/{id}/cancel`` does; compensations run before it returns.

        Returns:
            The run after cancellation settled (``cancelled``, or ``failed`` when a
            compensation failed).

        Raises:
            RunFinished: the run had already finished otherwise.
        """
        await self.run_until_idle()
        await control.cancel(
            self.database,
            tenant_id=self.tenant_id,
            run_id=_run_id(run),
            actor="test-canceller",
            reason=reason,
        )
        await self.run_until_idle()
        return await self.get(run)

    # --- inspection ---------------------------------------------------------------------

    async def get(self, run: RunHandle[Any] | uuid.UUID) -> RunSnapshot:
        """The run now.

        Raises:
            RunNotFound: no such run in this environment's tenant.
        """
        async with self.database.read() as conn:
            row = await runs_q.get_run(conn, self.tenant_id, _run_id(run))
        return _snapshot(row)

    async def steps(self, run: RunHandle[Any] | uuid.UUID) -> list[StepSnapshot]:
        """The run's journal in call order (compensations last)."""
        run_id = (await self.get(run)).run_id  # tenant check
        async with self.database.read() as conn:
            rows = await steps_q.list_steps(
                conn, self.tenant_id, run_id, after_seq=None, limit=1_000_000
            )
        return [
            StepSnapshot(
                step_id=r["step_id"],
                kind=r["kind"],
                name=r["name"],
                status=StepStatus(r["status"]),
                attempt=int(r["attempt"]),
                output=_decode(r["output"]),
                error=_decode(r["error"]),
                deadline=r["deadline"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
            )
            for r in rows
        ]

    async def step(self, run: RunHandle[Any] | uuid.UUID, step_id: str) -> StepSnapshot:
        """One journal entry by step id.

        Raises:
            KeyError: the run has no such step (yet).
        """
        for found in await self.steps(run):
            if found.step_id == step_id:
                return found
        raise KeyError(f"run {_run_id(run)} has no step {step_id!r}")

    async def events(self, run: RunHandle[Any] | uuid.UUID) -> list[EventSnapshot]:
        """The run's timeline, oldest first."""
        run_id = (await self.get(run)).run_id
        async with self.database.read() as conn:
            rows = await events_q.list_events(
                conn, self.tenant_id, run_id, after_id=None, limit=1_000_000
            )
        return [
            EventSnapshot(
                at=r["at"],
                kind=r["kind"],
                step_id=r["step_id"],
                actor=r["actor"],
                data=_decode(r["data"]),
            )
            for r in rows
        ]

    async def emits(self, run: RunHandle[Any] | uuid.UUID) -> list[EmitSnapshot]:
        """What the run emitted with ``ctx.emit``, in timeline order (the ``emitted`` events).

        The same rows ``GET /runs/{run_id}/events`` serves: replays emit nothing again,
        each attempt of a retried step keeps its own.
        """
        found: list[EmitSnapshot] = []
        for event in await self.events(run):
            if event.kind != EventKind.EMITTED:
                continue
            body = event.data or {}
            found.append(
                EmitSnapshot(
                    name=str(body.get("name")),
                    data=body.get("data"),
                    step_id=event.step_id,
                    attempt=body.get("attempt"),
                )
            )
        return found

    async def logs(self, run: RunHandle[Any] | uuid.UUID) -> list[LogSnapshot]:
        """The lines the run kept from ``ctx.logger``, in order (any dropped-lines summary last)."""
        run_id = (await self.get(run)).run_id
        async with self.database.read() as conn:
            rows = await run_logs_q.list_lines(
                conn, self.tenant_id, run_id, after_seq=None, limit=2**31 - 1
            )
        return [
            LogSnapshot(
                seq=r["seq"],
                at=r["at"],
                level=r["level"],
                message=json.loads(r["message"]),
                fields=_decode(r["fields"]),
                step_id=r["step_id"],
                attempt=r["attempt"],
            )
            for r in rows
        ]

    # --- internals ----------------------------------------------------------------------

    def _require_worker(self) -> Worker:
        if self._worker is None or self._worker_task is None:
            raise RuntimeError("use WorkflowTestEnv as `async with WorkflowTestEnv(...)`")
        if self._worker_task.done():
            self._worker_task.result()  # surface the worker's crash
            raise RuntimeError("the test environment's worker has stopped")
        return self._worker

    async def _orphaned_leases(self, worker: Worker) -> bool:
        """True when more runs are leased than the worker is executing."""
        executing = worker.in_flight
        async with self.database.read() as conn:
            leased = (
                await conn.execute(
                    select(func.count())
                    .select_from(runs)
                    .where(runs.c.tenant_id == self.tenant_id, runs.c.lease_owner.is_not(None))
                )
            ).scalar_one()
        return int(leased) > executing

    async def _pending(self) -> tuple[bool, datetime | None]:
        """``(busy, next due)``: busy while a run is leased or due now.

        Both come from one read of the database, whose state changes atomically (a claim
        sets the lease, a finalize drops it and may make a parent due in the same
        transaction), so "nothing leased and nothing due" is a true resting point.
        """
        claimable = [s.value for s in runs_q.CLAIMABLE_STATUSES]
        mine = runs.c.tenant_id == self.tenant_id
        leased = (
            select(func.count())
            .select_from(runs)
            .where(mine, runs.c.lease_owner.is_not(None))
            .scalar_subquery()
        )
        due = (
            select(type_coerce(func.min(runs.c.available_at), UtcDateTime()))
            .where(
                mine,
                runs.c.available_at.is_not(None),
                runs.c.status.in_(claimable),
                tuple_(runs.c.workflow, runs.c.version).in_(self.registry.keys),
            )
            .scalar_subquery()
        )
        async with self.database.read() as conn:
            row = (await conn.execute(select(leased, due, now_expr("sqlite")))).one()
        n_leased, next_due, now = int(row[0]), row[1], row[2]
        if n_leased:
            return True, None
        return (next_due is not None and next_due <= now), next_due
