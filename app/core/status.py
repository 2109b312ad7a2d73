"""Run and step statuses and terminal reasons (DESIGN §2); one vocabulary everywhere."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Lifecycle of a run. Terminal: completed, failed, cancelled, compensated."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_SIGNAL = "waiting_signal"
    WAITING_TIMER = "waiting_timer"
    WAITING_CHILD = "waiting_child"
    # ctx.wait_for_event (docs/adr/0029-event-triggers.md).
    WAITING_EVENT = "waiting_event"
    COMPENSATING = "compensating"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPENSATED = "compensated"

    @property
    def is_terminal(self) -> bool:
        """True for statuses a run never leaves."""
        return self in TERMINAL_RUN_STATUSES


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED}
)


class RunReason(StrEnum):
    """Why a terminal run ended the way it did; also how a step ended (docs/api.md).

    Two values are only ever a step's, never a run's: ``canceled_by_failure`` (the step
    was unfinished when its run failed: a parallel branch or the body failed, and the
    step was cancelled with it) and ``rejected_by_approver`` (an approval step whose
    decision was a rejection; its status is ``failed``).
    """

    SUCCEEDED = "succeeded"
    CANCELED_BY_REQUEST = "canceled_by_request"
    FAILURE_NON_RETRYABLE = "failure_non_retryable"
    FAILURE_ATTEMPTS_EXHAUSTED = "failure_attempts_exhausted"
    FAILURE_TIMED_OUT = "failure_timed_out"
    FAILURE_NONDETERMINISM = "failure_nondeterminism"
    FAILURE_TRANSITIONS_EXHAUSTED = "failure_transitions_exhausted"
    FAILURE_AUTHORIZATION = "failure_authorization"
    FAILURE_CORRUPT_STATE = "failure_corrupt_state"
    CANCELED_BY_FAILURE = "canceled_by_failure"
    REJECTED_BY_APPROVER = "rejected_by_approver"


class AccessPolicy(StrEnum):
    """Who may see and act on a run or schedule of a definition (docs/security.md).

    ``tenant``: any subject of its tenant holding the scope. ``owner``: only the subject
    it acts for (``created_by``) and ``admin`` principals; for everyone else it does not
    exist (404).
    """

    TENANT = "tenant"
    OWNER = "owner"

    @staticmethod
    def stricter(*policies: str) -> AccessPolicy:
        """The strictest of ``policies``: ``owner`` if any is, else ``tenant``.

        Work started on someone's behalf (a child, a schedule's run) is never visible to
        more subjects than the work or schedule that started it.
        """
        if any(AccessPolicy(p) == AccessPolicy.OWNER for p in policies):
            return AccessPolicy.OWNER
        return AccessPolicy.TENANT


class StepStatus(StrEnum):
    """Lifecycle of one journaled step."""

    PENDING = "pending"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


class EventKind(StrEnum):
    """Kinds of rows in a run's append-only timeline."""

    RUN_SUBMITTED = "run_submitted"
    RUN_CLAIMED = "run_claimed"
    RUN_RELEASED = "run_released"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    RUN_CANCEL_REQUESTED = "run_cancel_requested"
    RUN_COMPENSATED = "run_compensated"
    STEP_STARTED = "step_started"
    STEP_SUCCEEDED = "step_succeeded"
    STEP_FAILED = "step_failed"
    STEP_RETRY_SCHEDULED = "step_retry_scheduled"
    STEP_TIMED_OUT = "step_timed_out"
    DEAD_LETTER_WRITTEN = "dead_letter_written"
    DEAD_LETTER_REQUEUED = "dead_letter_requeued"
    WAIT_STARTED = "wait_started"
    WAIT_TIMED_OUT = "wait_timed_out"
    TIMER_FIRED = "timer_fired"
    SIGNAL_RECEIVED = "signal_received"
    SIGNAL_CONSUMED = "signal_consumed"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_RESOLVED = "approval_resolved"
    RUN_RESUMED = "run_resumed"
    CHILD_FINISHED = "child_finished"
    RUN_MIGRATED = "run_migrated"
    # A run that waited for a slot of its concurrency key was given one (now claimable).
    RUN_ADMITTED = "run_admitted"
    # An operator paused / unpaused the run (docs/adr/0021-pause-is-a-flag-beside-the-status.md).
    RUN_PAUSED = "run_paused"
    RUN_UNPAUSED = "run_unpaused"
    # A rerun of this run was started (data: the new run's id and from_step), on the original.
    RUN_RERUN = "run_rerun"
    # A posted event (POST /events) was delivered to one of the run's ctx.wait_for_event.
    EVENT_DELIVERED = "event_delivered"
    # Progress or partial output from handler code (ctx.emit): data {name, data, attempt}.
    EMITTED = "emitted"


STATE_MACHINE_KIND = "state_machine"
"""Definition kind of a bounded state machine (DESIGN §1c)."""

TRANSITION_STEP_PREFIX = "transition-"
"""Journal step ids of a state machine's transitions: ``transition-<n>:<from state>``."""


class LogLevel(StrEnum):
    """Severity of a line a handler logs with ``ctx.logger`` (kept in ``run_logs``)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """0 (debug) .. 3 (error): a ``?level=`` filter keeps lines of this rank or more."""
        return _LOG_RANKS[self]


_LOG_RANKS = {LogLevel.DEBUG: 0, LogLevel.INFO: 1, LogLevel.WARNING: 2, LogLevel.ERROR: 3}


class StreamEnd(StrEnum):
    """Why a long-lived response ended: the ``cause`` of an event stream's ``end`` message.

    Two say the run is done (``run_ended``: terminal, every event sent; ``run_gone``:
    archived or deleted meanwhile). Three say the credential that opened the stream is no
    longer accepted, which every long-lived response re-checks while it stays open
    (docs/adr/0051-long-lived-responses-recheck-their-credential.md): the client must get
    a new credential, not reconnect with the old one.
    """

    RUN_ENDED = "run_ended"
    RUN_GONE = "run_gone"
    CREDENTIAL_EXPIRED = "credential_expired"
    CREDENTIAL_REVOKED = "credential_revoked"
    TENANT_SUSPENDED = "tenant_suspended"

    @property
    def is_credential(self) -> bool:
        """True for the causes that say the credential lapsed (not the run)."""
        return self not in (StreamEnd.RUN_ENDED, StreamEnd.RUN_GONE)
