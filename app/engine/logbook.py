"""The engine side of ``ctx.logger``: bound lines, replay-safe, appended with checkpoints.

One :class:`RunLogBook` per execution (one lease's worth of work on one run). A line is
bounded here (message, fields), forwarded to the worker's structlog logger, and held until
the execution's next fenced write appends it (``RunJournal._write``, app/engine/journal.py):
the same transaction as the step checkpoint or wait that follows it, so a line logged
before a journaled point is stored exactly when that point is. See docs/adr/0027-run-logs.md.

Replay-safety has two layers. (1) A line logged by workflow code at a journal position the
run had already passed when this execution claimed it (``position < horizon``) is a replay:
it is neither kept nor forwarded. (2) Every line has an ``origin`` that a replay reproduces
(``w:<position>:<n>``, the n-th line logged at that position; ``s:<step>:<attempt>:<n>``),
and the append skips origins the run holds: a line logged after the last journaled point,
appended, then logged again because the worker died before the run's next checkpoint, is
kept once.
"""

from __future__ import annotations

import json as _stdlib_json
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import structlog

from app.core import json
from app.core.status import LogLevel
from app.db.queries.run_logs import LogLine
from app.sdk.context import _current_step
from app.sdk.logger import RunLogger

# Its own logger name: handler lines stay apart from the engine's story of the run.
log = structlog.get_logger("treadle.handler")

# structlog keys a field must not overwrite: bound by the worker or by structlog itself.
_RESERVED = frozenset(
    {"event", "run_id", "workflow", "worker_id", "step_id", "attempt", "level", "logger"}
)
_PREVIEW_CHARS = 200


def bound_message(message: object, limit: int) -> str:
    """``message`` as text of at most about ``limit`` characters.

    A longer message keeps its first ``limit`` characters and ends with
    ``… [N more characters]``, so a reader knows it was cut and by how much.
    """
    text = message if isinstance(message, str) else str(message)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def _fallback(value: object) -> str:
    return repr(value)


def _encode(value: Any) -> str:
    return _stdlib_json.dumps(
        value, ensure_ascii=True, separators=(",", ":"), allow_nan=False, default=_fallback
    )


def bound_fields(fields: Mapping[str, Any], limit: int) -> str | None:
    """``fields`` as JSON object text of at most about ``limit`` bytes, or None if empty.

    Values that are not JSON (a datetime, an object, NaN, a cycle) are kept as their
    ``repr``; the other values stay as they are. Larger than ``limit``:
    ``{"_truncated": true, "_bytes": N, "_preview": "<the first 200 characters>"}``.
    """
    if not fields:
        return None
    try:
        text = _encode(dict(fields))
    except (ValueError, TypeError, RecursionError):
        # Some value is not JSON even by repr (NaN, a cycle): that value alone as its repr.
        kept: dict[str, Any] = {}
        for key, value in fields.items():
            try:
                _encode(value)
                kept[str(key)] = value
            except (ValueError, TypeError, RecursionError):
                kept[str(key)] = repr(value)[:limit]
        text = _encode(kept)
    if len(text) <= limit:
        return text
    return json.dumps({"_truncated": True, "_bytes": len(text), "_preview": text[:_PREVIEW_CHARS]})


class RunLogBook(RunLogger):
    """``ctx.logger`` of one execution, and the lines it holds until the next write.

    Args:
        run_id: the run.
        workflow: its workflow name (bound on the worker's log records).
        worker_id: this worker (bound likewise).
        horizon: one past the highest journal position the run held at claim
            (compensations aside); workflow lines logged below it are replays.
        clock: the database clock estimate (``RunExecution.db_now``), stamped on lines.
        max_line_bytes: ``TREADLE_RUN_LOG_MAX_LINE_BYTES``.
        max_lines: ``TREADLE_RUN_LOG_MAX_LINES``: at most this many lines are held between
            two writes (a run keeps no more anyway); later ones are only counted.
    """

    def __init__(
        self,
        *,
        run_id: uuid.UUID,
        workflow: str,
        worker_id: str,
        horizon: int,
        clock: Callable[[], datetime],
        max_line_bytes: int,
        max_lines: int,
    ) -> None:
        self.run_id = run_id
        self._horizon = horizon
        self._clock = clock
        self._limit = max_line_bytes
        self._position: Callable[[], int] = lambda: horizon
        self._counts: dict[str, int] = {}
        self._pending: list[LogLine] = []
        self._max_pending = max_lines
        self._overflow = 0
        # Sync steps run in worker threads (asyncio.to_thread) and log from there.
        self._lock = threading.Lock()
        self._log = log.bind(run_id=str(run_id), workflow=workflow, worker_id=worker_id)

    def follow(self, position: Callable[[], int]) -> None:
        """Read the workflow's journal position from ``position`` (the replay context's)."""
        self._position = position

    def log(self, level: LogLevel, message: str, fields: dict[str, Any]) -> None:
        """See :meth:`app.sdk.logger.RunLogger.log`."""
        try:
            self._log_line(LogLevel(level), message, fields)
        except Exception:  # noqa: BLE001 - a log call must never fail the handler
            self._log.exception("ctx.logger line could not be recorded")

    def _log_line(self, level: LogLevel, message: str, fields: dict[str, Any]) -> None:
        step = _current_step.get()
        if step is not None and step.run_id == self.run_id:
            prefix, position = f"s:{step.step_id}:{step.attempt}", 0
            step_id: str | None = step.step_id
            attempt: int | None = step.attempt
        else:
            position = self._position()
            prefix = f"w:{position}"
            step_id = attempt = None
        with self._lock:
            n = self._counts.get(prefix, 0)
            self._counts[prefix] = n + 1
            if step_id is None and position < self._horizon:
                return  # replaying: this line was kept when the run first got here
            text = bound_message(message, self._limit)
            encoded = bound_fields(fields, self._limit)
            line = LogLine(
                origin=f"{prefix}:{n}",
                at=self._clock(),
                level=level,
                message=text,
                fields=encoded,
                step_id=step_id,
                attempt=attempt,
            )
            if len(self._pending) < self._max_pending:
                self._pending.append(line)
            else:
                self._overflow += 1  # more than the run could keep: counted as dropped
        extra = {
            (f"field_{k}" if k in _RESERVED else k): v
            for k, v in (json.loads(encoded) or {}).items()
        }
        if step_id is not None:
            extra["step_id"] = step_id
            extra["attempt"] = attempt
        getattr(self._log, level.value)(text, **extra)

    def take(self) -> tuple[list[LogLine], int]:
        """Remove and return the lines held since the last call (oldest first).

        Returns:
            The lines, and how many more were logged but not held (over ``max_lines``).
        """
        with self._lock:
            lines, self._pending = self._pending, []
            overflow, self._overflow = self._overflow, 0
        return lines, overflow

    @property
    def pending(self) -> bool:
        """True when lines (or a count of lines not held) wait for a write."""
        return bool(self._pending) or self._overflow > 0
