"""The engine side of ``ctx.emit``: bounded, replay-safe, streamed from steps as made.

One :class:`RunEmitter` per execution (one lease's worth of work on one run). An emit is
checked and encoded here, then held:

- **Workflow code**: held until the execution's next fenced write
  (``RunJournal._write``, app/engine/journal.py) appends it in the same transaction as
  the journal entry that follows it, as ``ctx.logger`` lines are
  (docs/adr/0027-run-logs.md). An emit made at a journal position the run had already
  passed when this execution claimed it (``position < horizon``) is a replay: nothing is
  kept.
- **Step code** (an attempt is running: the ``current_step`` context variable is set, in
  async steps and in the threads of sync steps alike): written as soon as possible by
  one writer task, in emit order, each batch in a fenced transaction of its own, so a
  long step streams live. ``write()`` drains what is left before any checkpoint, so a
  step's emits precede its result in the timeline.

See docs/adr/0028-live-event-streams.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import structlog
from pydantic import BaseModel

from app.core import json
from app.core.errors import InvalidInput
from app.db.queries.events import Emit
from app.sdk.context import _current_step
from app.sdk.errors import EmitRefused

log = structlog.get_logger("treadle.worker")

MAX_NAME_CHARS = 100
"""Longest ``ctx.emit`` name."""


def encode_emit(name: str, data: Any, attempt: int | None, limit: int) -> str:
    """The ``emitted`` event's data as JSON text: ``{"name", "data", "attempt"}``.

    Raises:
        EmitRefused: ``name`` is not 1..100 printable characters, ``data`` is not JSON
            (NaN, a set, a lone surrogate, nested too deep), or the text exceeds
            ``limit`` bytes (``TREADLE_EMIT_MAX_BYTES``).
    """
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise EmitRefused(f"ctx.emit name must be 1..{MAX_NAME_CHARS} printable characters")
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    body = {"name": name, "data": data, "attempt": attempt}
    try:
        json.check_depth(body, "ctx.emit data")
        text = json.dumps(body)
    except (InvalidInput, ValueError, TypeError, RecursionError) as exc:
        raise EmitRefused(f"ctx.emit({name!r}) data is not JSON: {str(exc)[:200]}") from None
    if len(text) > limit:
        raise EmitRefused(
            f"ctx.emit({name!r}) is {len(text)} bytes of JSON, over TREADLE_EMIT_MAX_BYTES={limit}"
        )
    return text


class RunEmitter:
    """``ctx.emit`` of one execution, and the emits it holds until they are written.

    Args:
        run_id: the run.
        horizon: one past the highest journal position the run held at claim
            (compensations aside); workflow emits made below it are replays.
        clock: the database clock estimate (``RunExecution.db_now``), stamped on emits.
        max_bytes: ``TREADLE_EMIT_MAX_BYTES``.
        max_per_run: ``TREADLE_EMIT_MAX_PER_RUN``.
        write_steps: appends a batch of step emits in a fenced transaction (raises
            ``LeaseLost`` / ``CheckpointFault`` like any checkpoint).
    """

    def __init__(
        self,
        *,
        run_id: uuid.UUID,
        horizon: int,
        clock: Callable[[], datetime],
        max_bytes: int,
        max_per_run: int,
        write_steps: Callable[[list[Emit]], Awaitable[None]],
    ) -> None:
        self.run_id = run_id
        self._horizon = horizon
        self._clock = clock
        self._max_bytes = max_bytes
        self._max_per_run = max_per_run
        self._write_steps = write_steps
        self._position: Callable[[], int] = lambda: horizon
        self.kept = 0
        self._workflow: list[Emit] = []
        self._steps: list[Emit] = []
        # Sync steps emit from worker threads (asyncio.to_thread).
        self._lock = threading.Lock()
        self._flushing = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    def follow(self, position: Callable[[], int]) -> None:
        """Read the workflow's journal position from ``position`` (the replay context's)."""
        self._position = position

    def start(self, already_kept: int) -> None:
        """Begin the execution: the run keeps ``already_kept`` emits (its earlier ones)."""
        self.kept = already_kept
        self._loop = asyncio.get_running_loop()

    def emit(self, name: str, data: Any) -> None:
        """See :meth:`app.sdk.context.WorkflowContext.emit`."""
        step = _current_step.get()
        in_step = step is not None and step.run_id == self.run_id
        if not in_step and self._position() < self._horizon:
            # Replaying: this emit was kept when the run first got here. Checked first, so
            # a replay neither refuses nor counts what the first pass already kept.
            return
        attempt = step.attempt if in_step and step is not None else None
        text = encode_emit(name, data, attempt, self._max_bytes)
        emit = Emit(at=self._clock(), data=text, step_id=step.step_id if in_step and step else None)
        with self._lock:
            if self.kept >= self._max_per_run:
                raise EmitRefused(
                    f"run keeps {self.kept} emits, TREADLE_EMIT_MAX_PER_RUN={self._max_per_run}"
                )
            self.kept += 1
            if not in_step:
                self._workflow.append(emit)
                return
            self._steps.append(emit)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._kick)

    def _kick(self) -> None:
        self._wake.set()
        if self._writer is None and self._failed is None:
            self._writer = asyncio.create_task(self._write_loop(), name=f"emits:{self.run_id}")

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush_steps()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - LeaseLost / CheckpointFault too
                # Kept for the execution's next checkpoint, which drains the emits and
                # meets the same fault itself; this task stops writing.
                self._failed = exc
                log.warning("step emits not written", run_id=str(self.run_id), error=repr(exc))
                return

    async def flush_steps(self) -> None:
        """Write the step emits made so far (oldest first); a no-op when there are none.

        Serialised: the writer task and every checkpoint call it, and a batch is taken
        only while holding the flush lock, so batches commit in emit order.

        Raises:
            LeaseLost: the fence moved; nothing was written.
            CheckpointFault: a transient database fault; nothing was written.
        """
        async with self._flushing:
            with self._lock:
                batch, self._steps = self._steps, []
            if not batch:
                return
            try:
                await self._write_steps(batch)
            except BaseException:
                with self._lock:
                    self._steps[:0] = batch  # kept for a later try, still first
                raise

    def take_workflow(self) -> list[Emit]:
        """Remove and return the workflow emits held since the last call (oldest first)."""
        with self._lock:
            emits, self._workflow = self._workflow, []
        return emits

    def give_back(self, emits: list[Emit]) -> None:
        """Put back workflow emits a failed write took (they stay first)."""
        with self._lock:
            self._workflow[:0] = emits

    @property
    def pending(self) -> bool:
        """True when emits wait for a write."""
        with self._lock:
            return bool(self._workflow or self._steps)

    async def close(self) -> None:
        """Stop the writer task (the execution flushed what it could)."""
        writer, self._writer = self._writer, None
        self._failed = self._failed or asyncio.CancelledError()  # no new writer starts
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
