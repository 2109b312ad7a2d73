"""``ctx.logger``: log lines a run keeps, replay-safe (docs/adr/0027-run-logs.md)."""

from __future__ import annotations

import abc
from typing import Any

from app.core.status import LogLevel


class RunLogger(abc.ABC):
    """The logger of one run, as ``ctx.logger`` (workflow code and step code alike).

    A line goes to the run's own log (``GET /runs/{run_id}/logs``, the run's report) and
    to the worker's log with the run id, workflow and step bound. Logged in workflow code,
    a line is kept once: when the body replays past it (after a wait, a retry back-off or
    a crash) it is not logged again. Logged inside a step attempt (the step closes over
    ``ctx``, or reads ``current_step().logger``), it is kept with that attempt's step id
    and attempt number, so each attempt of a retried step keeps its own lines.

    Bounded: a run keeps ``TREADLE_RUN_LOG_MAX_LINES`` lines (later ones are counted in
    one "N lines dropped" line), a message is cut at ``TREADLE_RUN_LOG_MAX_LINE_BYTES``
    characters with a marker and larger fields are replaced by a preview. Logging never
    raises: a field that is not JSON is kept as its ``repr``.
    """

    def debug(self, message: str, **fields: Any) -> None:
        """Log ``message`` at debug level with ``fields`` (JSON values)."""
        self.log(LogLevel.DEBUG, message, fields)

    def info(self, message: str, **fields: Any) -> None:
        """Log ``message`` at info level with ``fields`` (JSON values)."""
        self.log(LogLevel.INFO, message, fields)

    def warning(self, message: str, **fields: Any) -> None:
        """Log ``message`` at warning level with ``fields`` (JSON values)."""
        self.log(LogLevel.WARNING, message, fields)

    def error(self, message: str, **fields: Any) -> None:
        """Log ``message`` at error level with ``fields`` (JSON values)."""
        self.log(LogLevel.ERROR, message, fields)

    @abc.abstractmethod
    def log(self, level: LogLevel, message: str, fields: dict[str, Any]) -> None:
        """Log one line at ``level``; the methods above call this."""


class _Discard(RunLogger):
    def log(self, level: LogLevel, message: str, fields: dict[str, Any]) -> None:
        del level, message, fields


DISCARD = _Discard()
"""A :class:`RunLogger` that keeps nothing: the logger of a ``StepInfo`` built by hand."""
