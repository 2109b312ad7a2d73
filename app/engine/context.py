"""The context handed to workflow bodies: assigns step ids and dispatches to the executor."""

from __future__ import annotations

import inspect
import math
import random as _random
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from app.core import json
from app.core.event_match import MatchError, check_match
from app.core.labels import MAX_LABELS, key_problem, value_problem
from app.engine import events, waits
from app.engine.outcomes import COMPENSATION_SEQ_BASE, Compensation, step_name
from app.sdk.context import ApprovalDecision, WorkflowContext
from app.sdk.errors import NondeterminismError
from app.sdk.events import ReceivedEvent
from app.sdk.retry import DEFAULT_RETRY, RetryPolicy
from app.sdk.workflow import WorkflowDefinition

MAX_WAIT_SECONDS = 100 * 366 * 86400
"""Longest duration a workflow may ask for (a sleep, a timeout): 100 years, in seconds.

Past it a deadline overflows the clock arithmetic (``timedelta``, database timestamps)
and the run would fail with an internal error instead of at the call (docs/authoring.md).
"""


def check_seconds(value: float, what: str, *, zero: bool = False) -> float:
    """``value`` as a duration in seconds, or ``ValueError`` naming ``what``.

    A real number (not a bool), finite, > 0 (>= 0 when ``zero``), at most
    :data:`MAX_WAIT_SECONDS`.

    Raises:
        ValueError: any other value; nothing is journaled.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{what} must be {'>=' if zero else '>'} 0 seconds, got {value!r}")
    if value > MAX_WAIT_SECONDS:
        raise ValueError(f"{what} must be at most {MAX_WAIT_SECONDS} seconds (100 years)")
    return value


if TYPE_CHECKING:
    from sqlalchemy import RowMapping

    from app.engine.executor import RunExecution


class ReplayContext(WorkflowContext):
    """The :class:`WorkflowContext` of one execution.

    Every durable call gets its step id and sequence number synchronously, when it is
    *called* (not when it completes), and is checked against the journal: a different
    step id at the same position, or a different function or kind under the same id,
    is nondeterminism.
    """

    def __init__(self, execution: RunExecution) -> None:
        self._exec = execution
        self.run_id = execution.run_id
        self.workflow = execution.definition.name
        self.concurrency_key = execution.run["concurrency_key"]
        self._seq = 0
        self._names: dict[str, int] = {}
        self._patches: dict[str, bool] = {}
        # The run's labels as this execution knows them: the row's at claim, plus each
        # set_label reached (journaled or new). Only the run's own workflow changes them.
        self._labels = execution.journal.labels_at_claim()
        # ctx.logger knows replays by the journal position workflow code has reached.
        self.logger = execution.logbook
        execution.logbook.follow(lambda: self._seq)
        execution.emitter.follow(lambda: self._seq)

    def _in_fresh_budget(self) -> bool:
        return self._seq >= self._exec.budget_seq

    def _assign(self, base: str, kind: str, fn_name: str) -> tuple[str, int, RowMapping | None]:
        seq = self._seq
        self._seq += 1
        count = self._names.get(base, 0) + 1
        self._names[base] = count
        step_id = base if count == 1 else f"{base}#{count}"
        entry = self._exec.entries.get(step_id)
        at_seq = self._exec.entries_by_seq.get(seq)
        mismatch: str | None = None
        if at_seq is not None and at_seq["step_id"] != step_id:
            mismatch = (
                f"replay reached step {step_id!r} at position {seq}, but the journal recorded "
                f"{at_seq['step_id']!r} there"
            )
        elif entry is not None and (entry["name"] != fn_name or entry["kind"] != kind):
            mismatch = (
                f"step {step_id!r} is now {kind} {fn_name!r}, but the journal recorded "
                f"{entry['kind']} {entry['name']!r}"
            )
        if mismatch is not None:
            err = NondeterminismError(mismatch)
            self._exec.nondeterminism = err
            raise err
        if entry is None:
            self._exec.check_new_step(seq)
        return step_id, seq, entry

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
    ) -> Coroutine[Any, Any, Any]:
        if timeout is not None:
            check_seconds(timeout, "step timeout")
        try:
            fn_name = step_name(fn)
        except TypeError:
            if name is None:
                raise
            fn_name = name  # a callable without a qualified name: the step name stands in
        try:
            step_id, seq, entry = self._assign(name or fn_name, "step", fn_name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.run_step(
            step_id=step_id,
            seq=seq,
            fn=fn,
            args=args,
            retry=retry or DEFAULT_RETRY,
            timeout=timeout,
            entry=entry,
            compensation=None
            if compensate is None
            else Compensation(
                seq=seq,
                step_id=step_id,
                fn=compensate,
                retry=compensate_retry or RetryPolicy(max_attempts=1),
            ),
        )

    def _transaction(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | None,
        on_cancel: Callable[..., Awaitable[Any]] | None = None,
        on_cancel_args: tuple[Any, ...] = (),
        on_cancel_retry: RetryPolicy | None = None,
    ) -> Coroutine[Any, Any, Any]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"ctx.transaction needs an async def function, got {fn!r}")
        if timeout is not None:
            check_seconds(timeout, "transaction timeout")
        fn_name = step_name(fn)
        try:
            step_id, seq, entry = self._assign(name or fn_name, "transaction", fn_name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.run_step(
            step_id=step_id,
            seq=seq,
            fn=fn,
            args=args,
            retry=retry or DEFAULT_RETRY,
            timeout=timeout,
            entry=entry,
            kind="transaction",
            compensation=None
            if on_cancel is None
            else Compensation(
                seq=seq,
                step_id=step_id,
                fn=on_cancel,
                retry=on_cancel_retry or RetryPolicy(max_attempts=1),
                args=on_cancel_args,
                transactional=True,
                cancel_only=True,
                slot="on_cancel",
            ),
        )

    def compensation_step(self, comp: Compensation, result: Any) -> Coroutine[Any, Any, Any]:
        """Journal and run one registered compensation (``<step_id>__compensate``)."""
        step_id = f"{comp.step_id}__compensate"
        seq = COMPENSATION_SEQ_BASE + comp.seq
        entry = self._exec.entries.get(step_id)
        return self._exec.run_step(
            step_id=step_id,
            seq=seq,
            fn=comp.fn,
            args=(*comp.args, result),
            retry=comp.retry,
            timeout=None,
            entry=entry,
            kind="compensation",
            transactional=comp.transactional,
        )

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        """See :meth:`app.sdk.context.WorkflowContext.sleep`."""
        check_seconds(seconds, "sleep duration", zero=True)
        try:
            step_id, seq, entry = self._assign("sleep", "timer", "sleep")
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.timer(self._exec, step_id=step_id, seq=seq, entry=entry, seconds=seconds)
        )

    def sleep_until(self, when: datetime) -> Coroutine[Any, Any, None]:
        """See :meth:`app.sdk.context.WorkflowContext.sleep_until`."""
        if when.tzinfo is None:
            raise ValueError("sleep_until needs a timezone-aware datetime")
        try:
            step_id, seq, entry = self._assign("sleep", "timer", "sleep")
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.timer(self._exec, step_id=step_id, seq=seq, entry=entry, until=when)
        )

    def signal(self, name: str, *, timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """See :meth:`app.sdk.context.WorkflowContext.signal`."""
        waits.check_wait_name(name)
        if timeout is not None:
            check_seconds(timeout, "signal timeout")
        try:
            step_id, seq, entry = self._assign(f"signal:{name}", "signal", name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.signal(
                self._exec, step_id=step_id, seq=seq, entry=entry, name=name, timeout=timeout
            )
        )

    def wait_for_event(
        self,
        name: str,
        *,
        match: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, ReceivedEvent]:
        """See :meth:`app.sdk.context.WorkflowContext.wait_for_event`."""
        waits.check_wait_name(name)
        try:
            checked = check_match("match", match)
        except MatchError as exc:
            raise ValueError(str(exc)) from None
        if timeout is not None:
            check_seconds(timeout, "wait_for_event timeout")
        try:
            step_id, seq, entry = self._assign(f"event:{name}", "event", name)
        except NondeterminismError as err:
            return _raise(err)

        async def wait() -> ReceivedEvent:
            value = await events.wait_for_event(
                self._exec,
                step_id=step_id,
                seq=seq,
                entry=entry,
                name=name,
                match=checked,
                timeout=timeout,
            )
            return ReceivedEvent.model_validate(value)

        return self._exec.journaling(wait())

    def approval(
        self,
        name: str,
        *,
        group: str | None = None,
        payload: Any = None,
        timeout: float | None = None,
        approvals: int = 1,
        self_approval: bool = False,
        on_reject: Callable[[ApprovalDecision], Any] | None = None,
    ) -> Coroutine[Any, Any, ApprovalDecision]:
        """See :meth:`app.sdk.context.WorkflowContext.approval`."""
        waits.check_wait_name(name)
        if not 1 <= approvals <= 100:
            raise ValueError("approvals must be within 1..100")
        if timeout is not None:
            check_seconds(timeout, "approval timeout")
        try:
            step_id, seq, entry = self._assign(name, "approval", name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.approval(
                self,
                self._exec,
                step_id=step_id,
                seq=seq,
                entry=entry,
                config=waits.ApprovalConfig(
                    group=group,
                    payload=payload,
                    timeout=timeout,
                    approvals=approvals,
                    self_approval=self_approval,
                ),
                on_reject=on_reject,
            )
        )

    def child(
        self,
        workflow: str | WorkflowDefinition[Any, Any],
        input: Any,
        *,
        version: str | None = None,
        inherit_labels: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        """See :meth:`app.sdk.context.WorkflowContext.child`."""
        return self._child(workflow, input, version, detached=False, inherit_labels=inherit_labels)

    def start_child(
        self,
        workflow: str | WorkflowDefinition[Any, Any],
        input: Any,
        *,
        version: str | None = None,
        inherit_labels: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        """See :meth:`app.sdk.context.WorkflowContext.start_child`."""
        return self._child(workflow, input, version, detached=True, inherit_labels=inherit_labels)

    def _child(
        self,
        workflow: str | WorkflowDefinition[Any, Any],
        input_value: Any,
        version: str | None,
        *,
        detached: bool,
        inherit_labels: bool,
    ) -> Coroutine[Any, Any, Any]:
        if isinstance(workflow, WorkflowDefinition):
            name, version = workflow.name, version or workflow.version
        else:
            name = workflow
        if isinstance(input_value, BaseModel):
            input_value = input_value.model_dump(mode="json")
        try:
            step_id, seq, entry = self._assign(f"child:{name}", "child", name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.child(
                self._exec,
                step_id=step_id,
                seq=seq,
                entry=entry,
                workflow=name,
                input_value=input_value,
                version=version,
                detached=detached,
                labels=dict(self._labels) if inherit_labels else {},
            )
        )

    def emit(self, name: str, data: Any = None) -> None:
        """See :meth:`app.sdk.context.WorkflowContext.emit` (app/engine/emitter.py)."""
        self._exec.emitter.emit(name, data)

    def patched(self, change_id: str) -> bool:
        """See :meth:`app.sdk.context.WorkflowContext.patched`.

        The decision is made against the journal at the current position: a
        ``patch:<id>`` marker there → True (replaying a run that took the new path);
        any journaled step at or after this position → False (the run went past this
        point on the old code; no position is consumed, so its later steps still line
        up); nothing there → True, consuming the position and journaling the marker with
        the run's next write (before any later step can be journaled).
        """
        _check_change_id(change_id)
        known = self._patches.get(change_id)
        if known is not None:
            return known
        step_id = f"patch:{change_id}"
        at_seq = self._exec.entries_by_seq.get(self._seq)
        entry = self._exec.entries.get(step_id)
        if entry is not None and int(entry["seq"]) != self._seq:
            err = NondeterminismError(
                f"ctx.patched({change_id!r}) moved: the journal recorded it at position "
                f"{entry['seq']}, the code now reaches it at {self._seq}"
            )
            self._exec.nondeterminism = err
            raise err
        if at_seq is not None and at_seq["step_id"] == step_id:
            decision = True
            self._seq += 1
        elif at_seq is not None or any(
            self._seq < seq < COMPENSATION_SEQ_BASE for seq in self._exec.entries_by_seq
        ):
            decision = False
        else:
            decision = True
            self._exec.journal.mark_patch(step_id, self._seq, change_id)
            self._seq += 1
        self._patches[change_id] = decision
        return decision

    def deprecate_patch(self, change_id: str) -> None:
        """See :meth:`app.sdk.context.WorkflowContext.deprecate_patch`."""
        _check_change_id(change_id)
        if change_id in self._patches:
            return
        at_seq = self._exec.entries_by_seq.get(self._seq)
        if at_seq is not None and at_seq["step_id"] == f"patch:{change_id}":
            self._seq += 1  # a run that journaled the marker: keep its positions aligned
        self._patches[change_id] = True

    def now(self) -> Coroutine[Any, Any, datetime]:
        """See :meth:`app.sdk.context.WorkflowContext.now`."""
        return self._value("now", lambda: self._exec.db_now().isoformat(), datetime.fromisoformat)

    def uuid(self) -> Coroutine[Any, Any, uuid.UUID]:
        """See :meth:`app.sdk.context.WorkflowContext.uuid`."""
        return self._value("uuid", lambda: str(uuid.uuid4()), uuid.UUID)

    def random(self) -> Coroutine[Any, Any, float]:
        """See :meth:`app.sdk.context.WorkflowContext.random`."""
        return self._value("random", _random.random, float)

    def set_label(self, key: str, value: str) -> Coroutine[Any, Any, None]:
        """See :meth:`app.sdk.context.WorkflowContext.set_label`.

        Checked before a position is taken, so a refused label raises ``ValueError`` in
        the workflow and journals nothing.
        """
        problem = key_problem(key) or value_problem(value)
        if problem is None and key not in self._labels and len(self._labels) >= MAX_LABELS:
            problem = f"a run has at most {MAX_LABELS} labels; {key!r} would be one more"
        if problem is not None:
            raise ValueError(f"ctx.set_label({str(key)[:64]!r}, ...): {problem}")
        try:
            step_id, seq, entry = self._assign("label", "value", "label")
        except NondeterminismError as err:
            return _raise(err)
        if entry is not None:
            # Replay: the journal's label stands, whatever the code passes now.
            journaled = json.loads(entry["output"]) or {}
            key, value = str(journaled.get("key", key)), str(journaled.get("value", value))
        self._labels[key] = value
        return self._exec.journaling(
            waits.label(self._exec, step_id=step_id, seq=seq, entry=entry, key=key, value=value)
        )

    def _value(
        self, kind_name: str, produce: Callable[[], Any], decode: Callable[[Any], Any]
    ) -> Coroutine[Any, Any, Any]:
        try:
            step_id, seq, entry = self._assign(kind_name, "value", kind_name)
        except NondeterminismError as err:
            return _raise(err)
        return self._exec.journaling(
            waits.value(
                self._exec, step_id=step_id, seq=seq, entry=entry, produce=produce, decode=decode
            )
        )


def _check_change_id(change_id: str) -> None:
    if not change_id or len(change_id) > 200 or not change_id.isprintable():
        raise ValueError("change_id must be 1..200 printable characters")


async def _raise(exc: BaseException) -> Any:
    raise exc
