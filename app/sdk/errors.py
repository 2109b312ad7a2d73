"""Errors that handler code raises or catches.

Taxonomy (after Temporal's): an exception raised by a step is *retryable* unless it is a
:class:`Permanent`; when a step gives up, the workflow sees :class:`StepFailed`.
"""

from __future__ import annotations


class Permanent(Exception):
    """Raise from a step (or a workflow body) to stop retrying at once.

    Args:
        error: the underlying exception or a message.

    Example: ``raise Permanent(CardDeclined("insufficient funds"))``.
    """

    def __init__(self, error: BaseException | str) -> None:
        self.error = error
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(message)

    @property
    def error_type(self) -> str:
        """The wrapped error's class name (``"Permanent"`` for a plain message)."""
        return "Permanent" if isinstance(self.error, str) else type(self.error).__name__


NonRetryable = Permanent
"""Alias of :class:`Permanent`."""


class StepFailed(Exception):
    """A step gave up: raised inside the workflow at the ``await ctx.step(...)``.

    Attributes:
        step_id: the journaled step id.
        reason: ``failure_non_retryable``, ``failure_attempts_exhausted`` or
            ``failure_timed_out``; becomes the run's reason if the workflow lets it escape.
        error_type: class name of the last error.
        message: its message.
        attempts: how many attempts were made.
    """

    def __init__(
        self, step_id: str, reason: str, error_type: str, message: str, attempts: int
    ) -> None:
        super().__init__(
            f"step {step_id!r} failed ({reason}) after {attempts} attempt(s): "
            f"{error_type}: {message}"
        )
        self.step_id = step_id
        self.reason = reason
        self.error_type = error_type
        self.message = message
        self.attempts = attempts


class NondeterminismError(Exception):
    """Replay reached a different step than the journal recorded (run fails, never retried)."""


class EmitRefused(ValueError):
    """``ctx.emit`` refused an emit: a bad name, data that is not JSON, or a bound reached.

    The bounds are ``TREADLE_EMIT_MAX_BYTES`` (one emit) and ``TREADLE_EMIT_MAX_PER_RUN``
    (emits a run keeps). Nothing of the refused emit is kept; the run goes on unless the
    error escapes (in a step it fails the attempt like any error).
    """


class TransientError(Exception):
    """Convenience base for errors a step wants retried (any non-Permanent error is)."""


class WaitTimedOut(StepFailed):
    """A signal or approval wait passed its timeout (reason ``failure_timed_out``)."""

    def __init__(self, step_id: str, kind: str, timeout_at: str) -> None:
        super().__init__(
            step_id,
            "failure_timed_out",
            "WaitTimedOut",
            f"{kind} wait timed out at {timeout_at}",
            1,
        )
        self.kind = kind


class ApprovalRejected(StepFailed):
    """An approval was rejected and the workflow gave no ``on_reject`` handler.

    Attributes:
        decided_by: who rejected.
        comment: the rejecting approver's comment, if any.
    """

    def __init__(self, step_id: str, decided_by: str, comment: str | None) -> None:
        message = f"approval {step_id!r} rejected by {decided_by}"
        if comment:
            message += f": {comment}"
        super().__init__(step_id, "failure_non_retryable", "ApprovalRejected", message, 1)
        self.decided_by = decided_by
        self.comment = comment
