"""The durable waits' writes: timers, signals, events, approvals, values, labels, children.

Part of the one writer of a leased run's state (:class:`app.engine.journal.RunJournal`,
docs/adr/0038-one-writer-of-leased-run-state.md), kept in a module of its own by concept:
every method here is one fenced write through the journal's primitive
(``RunJournal._write``), so the fence check, the riders (log lines, emits, ``ctx.patched``
markers) and the fault handling are the journal's. ``app/engine/waits.py`` and, for
``ctx.wait_for_event``, ``app/engine/events.py`` (which keeps what an event is and what
matches) decide what to write and when; this module decides the rows; ``app/db/queries``
holds the statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import EventKind, RunStatus, StepStatus
from app.db.queries import approvals as approvals_q
from app.db.queries import event_waits as event_waits_q
from app.db.queries import events as events_q
from app.db.queries import inbound_events as inbound_q
from app.db.queries import run_labels as labels_q
from app.db.queries import runs as runs_q
from app.db.queries import signals as signals_q
from app.db.queries import steps as steps_q
from app.engine.outcomes import WakeCheck

if TYPE_CHECKING:
    from app.engine.journal import RunJournal
    from app.sdk.context import ApprovalDecision


@dataclass(frozen=True, slots=True)
class Taken:
    """What a wait found in its fenced write.

    Attributes:
        value: the delivered value (signal payload as JSON text, an approval decision,
            a child's output as JSON text); meaningful when ``found``.
        found: the wait is satisfied by ``value``.
        timed_out: the wait's deadline passed; it was journaled ``timed_out``.
        failed: a joined child ended without completing: ``(reason, message)``.
    """

    value: Any = None
    found: bool = False
    timed_out: bool = False
    failed: tuple[str, str] | None = None


_NOTHING = Taken()
_SCAN_PAGE = 200  # events read per page when a starting event wait looks back


class WaitJournal:
    """The fenced writes of a run's durable waits (``RunJournal.waits``).

    Args:
        journal: the run's journal, whose fence and write primitive these use.
    """

    def __init__(self, journal: RunJournal) -> None:
        self._journal = journal
        self.run_id = journal.run_id
        self.tenant_id = journal.tenant_id
        self.fence = journal.fence

    def _due(self, deadline: datetime | None) -> bool:
        clock = self._journal.clock
        return deadline is not None and clock is not None and deadline <= clock()

    async def _wait_rows(
        self,
        conn: AsyncConnection,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        deadline: datetime | None,
        detail: dict[str, Any] | None,
    ) -> None:
        await steps_q.insert_step(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            step_id=step_id,
            seq=seq,
            kind=kind,
            name=name,
            status=StepStatus.WAITING,
            fence=self.fence,
            deadline=deadline,
            detail=None if detail is None else json.dumps(detail),
        )
        await events_q.append(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            kind=EventKind.WAIT_STARTED,
            step_id=step_id,
            data={
                "kind": kind,
                "name": name,
                "deadline": deadline.isoformat() if deadline else None,
            },
        )

    async def _finish_rows(
        self,
        conn: AsyncConnection,
        step_id: str,
        status: StepStatus,
        output: str | None,
        event: EventKind,
        data: dict[str, Any],
        error: dict[str, Any] | None = None,
    ) -> None:
        # A step that did not succeed records why: ``error`` if given, else the event data.
        if error is None and status != StepStatus.SUCCEEDED:
            error = data
        await steps_q.finish_attempt(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            step_id=step_id,
            status=status,
            output=output,
            error=None if error is None else json.dumps(error),
            fence=self.fence,
        )
        await events_q.append(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            kind=event,
            step_id=step_id,
            data=data,
        )

    async def start_wait(
        self,
        *,
        step_id: str,
        seq: int,
        kind: str,
        name: str,
        deadline: datetime | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Journal a wait as ``waiting`` with its ``deadline`` (DB time), and ``wait_started``.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def record(conn: AsyncConnection) -> None:
            await self._wait_rows(
                conn,
                step_id=step_id,
                seq=seq,
                kind=kind,
                name=name,
                deadline=deadline,
                detail=detail,
            )

        await self._journal._write(record)

    async def fire_timer(self, *, step_id: str, deadline: datetime) -> None:
        """Journal a timer as fired (output ``null``) with ``timer_fired``.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def fire(conn: AsyncConnection) -> None:
            await self._finish_rows(
                conn,
                step_id,
                StepStatus.SUCCEEDED,
                "null",
                EventKind.TIMER_FIRED,
                {"deadline": deadline.isoformat()},
            )

        await self._journal._write(fire)

    async def take_signal(
        self,
        *,
        step_id: str,
        seq: int,
        name: str,
        deadline: datetime | None,
        record: dict[str, Any] | None,
    ) -> Taken:
        """Consume the oldest buffered signal ``name`` for a wait, or time it out.

        ``record``, when given, is the wait's detail: the wait is journaled first, in the
        same write. The run row is locked by the fence check, so no other consumer races
        this one. Returns the payload (JSON text) as ``value``, ``timed_out``, or nothing.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        taken: list[Taken] = []

        async def attempt(conn: AsyncConnection) -> None:
            taken.clear()  # a conflict re-runs the transaction: keep only the last run's
            if record is not None:
                await self._wait_rows(
                    conn,
                    step_id=step_id,
                    seq=seq,
                    kind="signal",
                    name=name,
                    deadline=deadline,
                    detail=record,
                )
            found = await signals_q.oldest_unconsumed(
                conn, self.run_id, name, tenant_id=self.tenant_id
            )
            if found is not None and await signals_q.consume(
                conn, found["signal_id"], step_id, tenant_id=self.tenant_id
            ):
                payload = found["payload"] or "null"
                await self._finish_rows(
                    conn,
                    step_id,
                    StepStatus.SUCCEEDED,
                    payload,
                    EventKind.SIGNAL_CONSUMED,
                    {"signal": name, "signal_id": found["signal_id"]},
                )
                taken.append(Taken(value=payload, found=True))
            elif self._due(deadline):
                await self._finish_rows(
                    conn,
                    step_id,
                    StepStatus.TIMED_OUT,
                    None,
                    EventKind.WAIT_TIMED_OUT,
                    {"kind": "signal", "signal": name},
                )
                taken.append(Taken(timed_out=True))

        await self._journal._write(attempt)
        return taken[0] if taken else _NOTHING

    def signal_arrived(self, name: str) -> WakeCheck:
        """A release's wake check: a signal ``name`` is buffered for the run."""

        async def arrived(conn: AsyncConnection) -> bool:
            return (
                await signals_q.oldest_unconsumed(conn, self.run_id, name, tenant_id=self.tenant_id)
                is not None
            )

        return arrived

    async def open_event_wait(
        self,
        *,
        step_id: str,
        seq: int,
        name: str,
        deadline: datetime | None,
        detail: dict[str, Any],
        match: str,
        since: datetime,
        wanted: Callable[[RowMapping], bool],
        received: Callable[[RowMapping], Any],
    ) -> Taken:
        """Journal a new ``ctx.wait_for_event``, open its mailbox, take an event already in.

        One write: the step ``waiting`` with ``detail`` and ``wait_started``; then, under
        the event name's lock (:func:`app.db.queries.inbound_events.lock_name`, so every
        event posted before is seen here and every one posted after sees the mailbox
        open), the mailbox row (``match``: JSON text; ``since``: the database time the
        look-back starts at). The look-back takes the oldest event of ``name`` received
        since then that was delivered to none of the run's waits and that ``wanted``
        accepts (the match rules are the caller's, docs/adr/0029-event-triggers.md): it is
        delivered with ``event_delivered`` and ``received(event)`` (JSON-able) is
        journaled as the step's output. With none and the deadline passed, the wait times
        out. Returns that value, ``timed_out``, or nothing (the run waits).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        taken: list[Taken] = []

        async def attempt(conn: AsyncConnection) -> None:
            taken.clear()  # a conflict re-runs the transaction: keep only the last run's
            await self._wait_rows(
                conn,
                step_id=step_id,
                seq=seq,
                kind="event",
                name=name,
                deadline=deadline,
                detail=detail,
            )
            await inbound_q.lock_name(conn, self.tenant_id, name)
            await event_waits_q.insert_wait(
                conn,
                run_id=self.run_id,
                step_id=step_id,
                tenant_id=self.tenant_id,
                name=name,
                match=match,
                since=since,
            )
            event = await self._look_back(conn, name, since, wanted)
            if event is not None:
                assert await inbound_q.deliver(
                    conn, self.run_id, step_id, event["event_id"], tenant_id=self.tenant_id
                )
                await events_q.append(
                    conn,
                    run_id=self.run_id,
                    tenant_id=self.tenant_id,
                    kind=EventKind.EVENT_DELIVERED,
                    step_id=step_id,
                    data={"event_id": str(event["event_id"]), "name": name},
                )
                taken.append(await self._take_event_rows(conn, step_id, event, received))
            elif self._due(deadline):
                # Under the name's lock no post can have delivered since the look-back.
                assert await event_waits_q.time_out(
                    conn, self.run_id, step_id, tenant_id=self.tenant_id
                )
                taken.append(await self._event_timed_out_rows(conn, step_id, name))

        await self._journal._write(attempt)
        return taken[0] if taken else _NOTHING

    async def take_delivered_event(
        self,
        *,
        step_id: str,
        name: str,
        deadline: datetime | None,
        received: Callable[[RowMapping], Any],
    ) -> Taken:
        """Journal the event a post delivered into a resumed wait's mailbox, or time it out.

        The wait was journaled (:meth:`open_event_wait`). A delivered event's
        ``received(event)`` (JSON-able) becomes the step's output; past the deadline the
        mailbox is closed ``timed_out`` unless an event won that race (then it is taken).
        Returns the value, ``timed_out``, or nothing (still waiting).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        taken: list[Taken] = []

        async def attempt(conn: AsyncConnection) -> None:
            taken.clear()  # a conflict re-runs the transaction: keep only the last run's
            wait = await event_waits_q.get_wait(
                conn, self.run_id, step_id, tenant_id=self.tenant_id
            )
            assert wait is not None  # written with the step
            event: RowMapping | None = None
            if wait["status"] == "delivered":
                event = await inbound_q.get_event(conn, self.tenant_id, wait["event_id"])
            elif self._due(deadline):
                if await event_waits_q.time_out(
                    conn, self.run_id, step_id, tenant_id=self.tenant_id
                ):
                    taken.append(await self._event_timed_out_rows(conn, step_id, name))
                    return
                # An event won the race for the mailbox: take it.
                wait = await event_waits_q.get_wait(
                    conn, self.run_id, step_id, tenant_id=self.tenant_id
                )
                assert wait is not None
                event = await inbound_q.get_event(conn, self.tenant_id, wait["event_id"])
            if event is not None:
                taken.append(await self._take_event_rows(conn, step_id, event, received))

        await self._journal._write(attempt)
        return taken[0] if taken else _NOTHING

    def event_delivered(self, step_id: str) -> WakeCheck:
        """A release's wake check: a post delivered an event into wait ``step_id``'s mailbox."""

        async def delivered(conn: AsyncConnection) -> bool:
            wait = await event_waits_q.get_wait(
                conn, self.run_id, step_id, tenant_id=self.tenant_id
            )
            return wait is not None and wait["status"] == "delivered"

        return delivered

    async def _look_back(
        self,
        conn: AsyncConnection,
        name: str,
        since: datetime,
        wanted: Callable[[RowMapping], bool],
    ) -> RowMapping | None:
        # The oldest event of the name received since ``since`` that was delivered to none
        # of the run's waits yet (each event reaches a run at most once) and is wanted.
        taken = await event_waits_q.delivered_to_run(conn, self.run_id, tenant_id=self.tenant_id)
        after: uuid.UUID | None = None
        while True:
            page = await inbound_q.events_since(
                conn, self.tenant_id, name, since=since, after_event_id=after, limit=_SCAN_PAGE
            )
            for event in page:
                if event["event_id"] not in taken and wanted(event):
                    return event
            if len(page) < _SCAN_PAGE:
                return None
            after = page[-1]["event_id"]

    async def _take_event_rows(
        self,
        conn: AsyncConnection,
        step_id: str,
        event: RowMapping,
        received: Callable[[RowMapping], Any],
    ) -> Taken:
        # The step's result only: the delivery's own event (event_delivered) says it came.
        value = received(event)
        await steps_q.finish_attempt(
            conn,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            step_id=step_id,
            status=StepStatus.SUCCEEDED,
            output=json.dumps(value),
            error=None,
            fence=self.fence,
        )
        return Taken(value=value, found=True)

    async def _event_timed_out_rows(self, conn: AsyncConnection, step_id: str, name: str) -> Taken:
        await self._finish_rows(
            conn,
            step_id,
            StepStatus.TIMED_OUT,
            None,
            EventKind.WAIT_TIMED_OUT,
            {"kind": "event", "event": name},
        )
        return Taken(timed_out=True)

    async def resolve_approval(
        self,
        *,
        step_id: str,
        seq: int,
        name: str,
        deadline: datetime | None,
        record: dict[str, Any] | None,
        decide: Callable[[list[RowMapping]], ApprovalDecision | None],
        rejection: Callable[[ApprovalDecision], dict[str, Any]],
    ) -> Taken:
        """Decide an approval from its decision rows, or time it out.

        ``record``: the approval's detail, journaled first when the wait is new.
        ``decide`` turns the rows into a decision (None while open); ``rejection`` gives
        a rejected approval's step error. Returns the decision as ``value``.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        taken: list[Taken] = []

        async def attempt(conn: AsyncConnection) -> None:
            taken.clear()  # a conflict re-runs the transaction: keep only the last run's
            if record is not None:
                await self._wait_rows(
                    conn,
                    step_id=step_id,
                    seq=seq,
                    kind="approval",
                    name=name,
                    deadline=deadline,
                    detail=record,
                )
            decided = decide(
                list(
                    await approvals_q.list_decisions(
                        conn, self.run_id, step_id, tenant_id=self.tenant_id
                    )
                )
            )
            if decided is not None:
                await self._finish_rows(
                    conn,
                    step_id,
                    StepStatus.SUCCEEDED if decided.approved else StepStatus.FAILED,
                    json.dumps(decided.model_dump(mode="json")),
                    EventKind.APPROVAL_RESOLVED,
                    {"approved": decided.approved, "decided_by": decided.decided_by},
                    error=None if decided.approved else rejection(decided),
                )
                taken.append(Taken(value=decided, found=True))
            elif self._due(deadline):
                await self._finish_rows(
                    conn,
                    step_id,
                    StepStatus.TIMED_OUT,
                    None,
                    EventKind.WAIT_TIMED_OUT,
                    {"kind": "approval"},
                )
                taken.append(Taken(timed_out=True))

        await self._journal._write(attempt)
        return taken[0] if taken else _NOTHING

    def decision_made(
        self, step_id: str, decide: Callable[[list[RowMapping]], ApprovalDecision | None]
    ) -> WakeCheck:
        """A release's wake check: approval ``step_id`` has been decided."""

        async def decided(conn: AsyncConnection) -> bool:
            rows = list(
                await approvals_q.list_decisions(
                    conn, self.run_id, step_id, tenant_id=self.tenant_id
                )
            )
            return decide(rows) is not None

        return decided

    async def record_value(self, *, step_id: str, seq: int, name: str, output: str) -> None:
        """Journal a produced value (``ctx.now`` / ``uuid`` / ``random``; JSON text).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def record(conn: AsyncConnection) -> None:
            await steps_q.insert_step(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                seq=seq,
                kind="value",
                name=name,
                status=StepStatus.SUCCEEDED,
                fence=self.fence,
                output=output,
            )

        await self._journal._write(record)

    async def record_label(self, *, step_id: str, seq: int, key: str, value: str) -> None:
        """Write a run label and its journal entry (``ctx.set_label``) together.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """

        async def record(conn: AsyncConnection) -> None:
            await steps_q.insert_step(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                seq=seq,
                kind="value",
                name="label",
                status=StepStatus.SUCCEEDED,
                fence=self.fence,
                output=json.dumps({"key": key, "value": value}),
            )
            await labels_q.set_label(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                key=key,
                value=value,
            )

        await self._journal._write(record)

    async def create_child(
        self,
        *,
        step_id: str,
        seq: int,
        workflow: str,
        detached: bool,
        insert: Callable[[AsyncConnection], Awaitable[RowMapping]],
        check_count: Callable[[int], None],
    ) -> str:
        """Create a child run and journal the step that waits for it, in one write.

        ``check_count(started)`` sees the children the run started so far, counted under
        the fence (it raises the ceiling); ``insert(conn)`` writes the child's run row
        (:func:`app.engine.submit.insert_prepared`) and returns it. A detached child's
        step succeeds at once with the child's id; a joined one waits. Returns the
        child's run id (text).

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
            CeilingExceeded: from ``check_count``.
        """
        created: list[str] = []

        async def create(conn: AsyncConnection) -> None:
            created.clear()
            check_count(
                await steps_q.count_kind(conn, self.run_id, "child", tenant_id=self.tenant_id)
            )
            row = await insert(conn)
            child_id = str(row["run_id"])
            await steps_q.insert_step(
                conn,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                step_id=step_id,
                seq=seq,
                kind="child",
                name=workflow,
                status=StepStatus.SUCCEEDED if detached else StepStatus.WAITING,
                fence=self.fence,
                output=json.dumps(child_id) if detached else None,
                detail=json.dumps({"child_run_id": child_id, "detached": detached}),
            )
            created.append(child_id)

        await self._journal._write(create)
        return created[0]

    async def settle_child(self, *, step_id: str, child_id: uuid.UUID) -> Taken:
        """Journal a joined child's end if it ended: its output, or why it failed.

        Returns the child's output (JSON text) as ``value``, ``failed`` as
        ``(reason, message)``, or nothing while the child runs.

        Raises:
            LeaseLost: the fence moved. CheckpointFault: a transient database fault.
        """
        taken: list[Taken] = []

        async def check(conn: AsyncConnection) -> None:
            taken.clear()  # a conflict re-runs the transaction: keep only the last run's
            row = await runs_q.get_run_any_tenant(conn, child_id)
            assert row is not None
            status = RunStatus(row["status"])
            data = {"child_run_id": str(child_id), "status": status.value}
            if status == RunStatus.COMPLETED:
                output = row["output"] or "null"
                await self._finish_rows(
                    conn, step_id, StepStatus.SUCCEEDED, output, EventKind.CHILD_FINISHED, data
                )
                taken.append(Taken(value=output, found=True))
            elif status.is_terminal:
                reason = row["reason"] if row["reason"] != "succeeded" else "failure_non_retryable"
                if reason == "canceled_by_request":
                    reason = "failure_non_retryable"
                message = f"child run {child_id} ended {status.value} ({row['reason']})"
                error = {
                    "type": "ChildFailed",
                    "reason": reason,
                    "message": message,
                    "child_run_id": str(child_id),
                }
                await self._finish_rows(
                    conn, step_id, StepStatus.FAILED, None, EventKind.CHILD_FINISHED, data, error
                )
                taken.append(Taken(failed=(reason, message)))

        await self._journal._write(check)
        return taken[0] if taken else _NOTHING

    @staticmethod
    def child_finished(child_id: uuid.UUID) -> WakeCheck:
        """A release's wake check: the joined child run is terminal."""

        async def finished(conn: AsyncConnection) -> bool:
            row = await runs_q.get_run_any_tenant(conn, child_id)
            return row is not None and RunStatus(row["status"]).is_terminal

        return finished
