"""The domain error tree.

Every error Treadle raises on purpose derives from :class:`TreadleError`, carries a stable
``code`` and structured ``data``, and is mapped to an RFC 9457 problem response in exactly
one place (``app.api.problems``). Control signals that user code must not swallow
(:class:`LeaseLost`) derive from ``BaseException`` so ``except Exception`` cannot eat them.
"""

from __future__ import annotations

from typing import Any


class TreadleError(Exception):
    """Base of every deliberate Treadle error.

    Attributes:
        code: stable machine-readable identifier (snake_case), part of the API contract.
        detail: human-readable explanation.
        data: extra JSON-serialisable members added to the problem body.
    """

    code = "treadle_error"

    def __init__(self, detail: str, **data: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.data = data


class NotFoundError(TreadleError):
    """The named resource does not exist *for this tenant* (404)."""

    code = "not_found"


class RunNotFound(NotFoundError):
    """No run with this id is visible to the caller's tenant."""

    code = "run_not_found"


class BatchNotFound(NotFoundError):
    """No bulk-action batch with this id in the caller's tenant (404)."""

    code = "batch_not_found"


class EventNotFound(NotFoundError):
    """No posted event with this id in the caller's tenant (404, ``GET /events/{id}``)."""

    code = "event_not_found"


class RunArchived(RunNotFound):
    """The run was moved to the archive by maintenance (404, code ``run_archived``).

    Only its summary survives (``data``: ``run_status``, ``reason``, ``finished_at``,
    ``archived_at``); steps, events and dead letters were dropped.
    """

    code = "run_archived"


class WorkflowNotFound(NotFoundError):
    """No worker has registered this workflow (or this version of it)."""

    code = "workflow_not_found"


class StepNotFound(NotFoundError):
    """The run has no step (or approval) with this id."""

    code = "step_not_found"


class DeadLetterNotFound(NotFoundError):
    """No dead letter with this id is visible to the caller's tenant."""

    code = "dead_letter_not_found"


class ApiKeyNotFound(NotFoundError):
    """No API key with this id belongs to the tenant."""

    code = "api_key_not_found"


class ScheduleNotFound(NotFoundError):
    """No schedule with this id is visible to the caller's tenant."""

    code = "schedule_not_found"


class WebhookNotFound(NotFoundError):
    """No webhook endpoint with this id in the caller's tenant (404)."""

    code = "webhook_not_found"


class ConflictError(TreadleError):
    """The request conflicts with the current state (409)."""

    code = "conflict"


class IdempotencyConflict(ConflictError):
    """An idempotency key was reused with a different workflow, version or input."""

    code = "idempotency_key_reused"


class ConcurrencyKeyBusy(ConflictError):
    """Another run of the workflow holds this concurrency key and is not terminal (409).

    ``data["active_run_id"]`` names the run holding the key; a run holds its key from
    submission until it is terminal (DESIGN §1, queue controls).
    """

    code = "concurrency_key_busy"


class RunFinished(ConflictError):
    """The run is terminal and the operation needs a live run."""

    code = "run_finished"


class InvalidState(ConflictError):
    """The run or approval is not in a state that allows this operation (409)."""

    code = "invalid_state"


class ScheduleNameTaken(ConflictError):
    """The tenant already has a schedule with this name."""

    code = "schedule_name_taken"


class InvalidInput(TreadleError):
    """A payload is valid JSON but not valid for its schema (422).

    ``data["errors"]`` lists ``{"path": "items.0.sku", "message": …}`` entries.
    """

    code = "invalid_input"


class WebhookTargetRefused(InvalidInput):
    """A webhook URL is refused for its form or where it resolves (422).

    Not http/https, malformed, or resolving to an address the SSRF guard forbids
    (docs/security.md, outbound webhooks).

    ``data["errors"]`` holds one ``{"path": "url", "message": …}`` entry.
    """

    code = "webhook_target_refused"


class InvalidRequest(InvalidInput):
    """One item of a batch request does not match the API schema (422, per item).

    The item-level twin of the request-level ``invalid_request`` problem: ``POST
    /runs:batch`` checks each item separately so one bad item fails alone.
    """

    code = "invalid_request"


class BadRequest(TreadleError):
    """The request itself is malformed: bad JSON, a bad page token (400)."""

    code = "bad_request"


class PayloadTooLarge(TreadleError):
    """A payload exceeds ``TREADLE_MAX_PAYLOAD_BYTES`` (413)."""

    code = "payload_too_large"


class Unauthenticated(TreadleError):
    """No valid bearer token (401, with ``WWW-Authenticate`` per RFC 6750)."""

    code = "unauthenticated"


class IdentityProviderUnavailable(TreadleError):
    """The identity provider's keys (JWKS) cannot be loaded right now (503, Retry-After).

    Raised instead of a 401 when a token cannot be checked because the JWKS URL is
    unreachable or answers garbage and no key set that could check it is cached: the
    token may well be valid, so the client should retry, not re-authenticate.
    """

    code = "identity_provider_unavailable"


class Forbidden(TreadleError):
    """The principal lacks a required scope (403); ``data["required_scope"]`` names it."""

    code = "forbidden"


class TenantSuspended(Forbidden):
    """The caller's tenant is suspended by an operator (403, code ``tenant_suspended``).

    ``data["tenant"]`` names the tenant; the operator's reason is never shown to the tenant
    (it may be about them). Principals holding ``admin`` are exempt (DESIGN §4, issue #5).
    """

    code = "tenant_suspended"


class SchemaVersionMismatch(TreadleError):
    """The database schema is behind or ahead of this code's Alembic head."""

    code = "schema_version_mismatch"


class DatabaseUnreachableAtStart(TreadleError):
    """The database stayed unreachable for ``TREADLE_DB_START_TIMEOUT_SECONDS`` at start.

    Raised by :func:`app.db.faults.wait_out_faults` when given a deadline (``treadle
    serve``, ``treadle worker``): the process logged each failed attempt and now gives
    up; the CLI prints :attr:`detail` as one line and exits 1 (docs/operations.md,
    "Start-up without a database").
    """

    code = "database_unreachable_at_start"


class DatabaseMisconfigured(TreadleError):
    """The database answers in a way only a configuration mistake explains.

    E.g. a transaction-mode PgBouncer in front of it without ``TREADLE_DB_POOLER=
    transaction`` (:func:`app.db.faults.pooler_mistake`). Raised at start-up, not
    retried: no wait makes it go away. The CLI prints ``refusing to start:``
    :attr:`detail` and exits 2.
    """

    code = "database_misconfigured"


class HandlersNotLoaded(TreadleError):
    """A ``--handlers`` module could not be imported or defines no workflow.

    Raised at a worker's (or ``treadle dev``'s) start, before it touches the database;
    ``data["module"]`` names the module. The CLI prints :attr:`detail` as one line.
    """

    code = "handlers_not_loaded"


class AuthModeRequired(TreadleError):
    """Dev-mode auth was not chosen explicitly outside the embedded SQLite database.

    Raised at start-up (``create_app``, ``treadle serve``), never in a request: dev tokens
    are signed with a shared secret and name any tenant, so on a shared database they
    must be an explicit ``TREADLE_AUTH_MODE=dev`` (docs/security.md).
    """

    code = "auth_mode_required"


class CeilingExceeded(TreadleError):
    """A configured ceiling (steps per run, …) was hit; ``data["ceiling"]`` names it."""

    code = "ceiling_exceeded"


class TooManyRequests(TreadleError):
    """A per-tenant bound on concurrent work (open event streams) is reached.

    ``data["retry_after_seconds"]`` becomes the ``Retry-After`` header of the 429.
    """

    code = "too_many_requests"


class LeaseLost(BaseException):
    """The worker's lease (fence) on a run is gone: it must stop without committing.

    Raised by every fenced write that affects zero rows. Derives from ``BaseException`` so
    handler code cannot swallow it with ``except Exception``.
    """

    def __init__(self, run_id: object) -> None:
        super().__init__(f"lease lost on run {run_id}")
        self.run_id = run_id


class CheckpointFault(BaseException):
    """A worker could not write a checkpoint of a run it holds: a transient database fault.

    Raised by the executor's checkpoint writes when the database is unreachable, no pooled
    connection came free in time, PostgreSQL's ``statement_timeout`` cancelled a statement,
    a deadlock / serialization failure / SQLite lock outlasted
    ``TREADLE_DB_RETRY_ATTEMPTS``, or any other fault :func:`app.db.faults.classify` names
    (lock timeout, disk full, a system error, an unlisted SQLSTATE); and by a transactional
    step meeting a fault its own queries cannot cause. Nothing of that write was kept. Like
    :class:`LeaseLost` it derives from ``BaseException`` so workflow code cannot swallow
    it with ``except Exception``, and the fault never fails the run: the worker gives the
    run back and it resumes later from its journal.

    Attributes:
        run_id: the run whose checkpoint failed.
        fault: the fault's name (``app.db.faults.DbFault`` value, e.g. ``statement_timeout``).
    """

    def __init__(self, run_id: object, fault: str) -> None:
        super().__init__(f"checkpoint of run {run_id} failed: database {fault}")
        self.run_id = run_id
        self.fault = fault
