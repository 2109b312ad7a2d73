"""Request and response models of the HTTP API (names chosen for generated SDKs)."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, WithJsonSchema

from app.api.log_schemas import LogLine
from app.core.labels import KEY_PATTERN, MAX_KEY_LENGTH, MAX_LABELS, MAX_VALUE_LENGTH
from app.core.limits import MAX_ACTION_REASON, MAX_APPROVAL_COMMENT
from app.core.text import TEXT_PATTERN, checked_text

NO_CONTROL_CHARS: dict[str, Any] = {"pattern": TEXT_PATTERN}
"""``json_schema_extra`` documenting :func:`app.core.text.checked_text` (identifiers end up
in indexed text columns and in front of readers) in the spec (the validator itself
gives the clearer message); clients and fuzzers then know these characters are refused."""

Identifier = Annotated[
    str,
    Field(min_length=1, max_length=255, json_schema_extra=NO_CONTROL_CHARS),
    AfterValidator(checked_text),
]
WorkflowName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")]


class SubmitRunRequest(BaseModel):
    """Body of ``POST /runs``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "workflow": "orders.fulfil",
                    "input": {"order_id": "A-1001", "items": [{"sku": "SKU-1", "qty": 2}]},
                    "idempotency_key": "order-A-1001",
                }
            ]
        },
    )

    workflow: WorkflowName = Field(description="Registered workflow name.")
    input: Any = Field(
        default_factory=dict,
        description="JSON input, validated against the workflow's registered input schema.",
    )
    version: (
        Annotated[
            str,
            Field(min_length=1, max_length=64, json_schema_extra=NO_CONTROL_CHARS),
            AfterValidator(checked_text),
        ]
        | int
        | None
    ) = Field(default=None, description="Pin a definition version; default the latest registered.")
    idempotency_key: Identifier | None = Field(
        default=None,
        description="Same key + same request returns the same run (or use the "
        "Idempotency-Key header).",
    )
    concurrency_key: Identifier | None = Field(
        default=None,
        description="At most `key_limit` (default 1) active (non-terminal) runs of the "
        "workflow per key: beyond it a submission is 409 naming an active run "
        "(`active_run_id`), or, when the workflow declares `on_limit: queue`, accepted "
        "`queued` and started in submission order as slots free. Required for state "
        "machines, where it names the parent entity.",
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Among runs due at the same time, higher priority is claimed first "
        "(-100..100, default 0). It does not reorder runs queued behind a busy concurrency "
        "key, which start in submission order.",
    )
    delay: float | None = Field(
        default=None,
        ge=0,
        le=366 * 86400,
        allow_inf_nan=False,
        description="Seconds before the run may start.",
    )
    labels: (
        Annotated[
            dict[str, str],
            # The rules are checked by app/core/labels.py (its messages name each rule);
            # this schema documents them for generated clients.
            WithJsonSchema(
                {
                    "type": "object",
                    "maxProperties": MAX_LABELS,
                    "propertyNames": {"pattern": KEY_PATTERN},
                    "additionalProperties": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_VALUE_LENGTH,
                    },
                }
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Labels to find the run by (`GET /runs?label.<key>=<value>`): at most "
        f"{MAX_LABELS}; keys 1..{MAX_KEY_LENGTH} characters of `A-Z a-z 0-9 _ . - /` "
        f"starting with a letter or digit; values 1..{MAX_VALUE_LENGTH} printable "
        "characters in Unicode NFC without `*`. A workflow adds more with `ctx.set_label`.",
    )


ActionReason = Annotated[
    str,
    Field(max_length=MAX_ACTION_REASON, json_schema_extra=NO_CONTROL_CHARS),
    AfterValidator(checked_text),
]
"""Why an operator acts on a run: at most 1000 printable characters (no control ones)."""


class SubmitBatchRequest(BaseModel):
    """Body of ``POST /runs:batch``: the runs to submit, each a ``POST /runs`` body.

    Items are checked one by one (a malformed item is that item's 422, not the
    request's); the list holds 1 to ``TREADLE_MAX_BATCH_RUNS`` (default 1,000) items.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "runs": [
                        {"workflow": "orders.fulfil", "input": {"order_id": "A-1001"}},
                        {
                            "workflow": "orders.fulfil",
                            "input": {"order_id": "A-1002"},
                            "idempotency_key": "order-A-1002",
                        },
                    ]
                }
            ]
        },
    )

    runs: list[Any] = Field(
        min_length=1,
        description="The runs, each a `POST /runs` body (SubmitRunRequest).",
        json_schema_extra={"items": {"$ref": "#/components/schemas/SubmitRunRequest"}},
    )


class BatchItemResult(BaseModel):
    """One item's outcome in a ``POST /runs:batch`` response (request order)."""

    index: int = Field(description="The item's position in the request's `runs` (from 0).")
    status: int = Field(
        description="What `POST /runs` would have answered for the item alone: 201 new "
        "run, 200 identical idempotent retry, else the problem's status (404, 409, 413, 422)."
    )
    run: Run | None = Field(default=None, description="The run (201 and 200), else null.")
    problem: Problem | None = Field(
        default=None, description="The item's problem details (any other status), else null."
    )


class SubmitBatchResponse(BaseModel):
    """``POST /runs:batch`` response (207 Multi-Status): one result per item."""

    results: list[BatchItemResult]
    created: int = Field(description="How many items created a run (status 201).")
    failed: int = Field(description="How many items failed (status 4xx).")


class _OptionalReasonRequest(BaseModel):
    """The optional body of a run action whose only field is an optional ``reason``.

    Cancel and pause take the same body; each subclass adds its own docstring and example
    (pydantic merges its ``model_config`` over this one).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    reason: ActionReason | None = None


class CancelRunRequest(_OptionalReasonRequest):
    """Body of ``POST /runs/{run_id}/cancel`` (optional)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"reason": "customer withdrew the order"}]}
    )


class PauseRunRequest(_OptionalReasonRequest):
    """Body of ``POST /runs/{run_id}/pause`` (optional)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"reason": "bank adapter outage, INC-4411"}]}
    )


class RerunRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/rerun``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"from_step": "charge#1", "idempotency_key": "fix-77"}]},
    )

    from_step: Identifier = Field(
        description="A journaled step id of the original run (`GET /runs/{id}/steps`): "
        "the rerun replays every entry before it and executes from it on.",
    )
    idempotency_key: Identifier | None = Field(
        default=None,
        description="Same key + same rerun returns the same new run (200), as for POST /runs.",
    )


class WaitingOn(BaseModel):
    """What a waiting run waits for."""

    kind: str
    name: str | None = None
    deadline: datetime | None = None


class RunState(BaseModel):
    """The typed current state of a state-machine run."""

    name: str = Field(description="The state (variant) name.")
    fields: dict[str, Any] = Field(description="The state's typed fields.")


class Run(BaseModel):
    """A run snapshot. Timestamps are UTC (ISO 8601)."""

    run_id: uuid.UUID
    workflow: str
    version: str
    status: str
    reason: str | None
    input: Any
    output: Any
    error: Any
    idempotency_key: str | None
    concurrency_key: str | None
    concurrency_slot: int | None = Field(
        default=None,
        description="Which of its concurrency key's `key_limit` slots (1..N) the run holds "
        "while active; null without a key or while it waits for a slot (see "
        "`blocked_reason`).",
    )
    priority: int = Field(default=0, description="Claim priority chosen at submit (-100..100).")
    attempt: int = Field(description="How many times a worker has claimed the run.")
    lease_owner: str | None
    lease_expires_at: datetime | None
    waiting_on: WaitingOn | None
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="The run's labels: those submitted, then those its workflow set with "
        "`ctx.set_label` (or inherited from its parent).",
    )
    blocked_reason: str | None = Field(
        description="Why the run cannot start: it waits for a slot of its concurrency key "
        "(`on_limit: queue`), or no live worker registered its version (detail view only)."
    )
    step_counts: dict[str, int] | None = Field(
        default=None, description="Steps by status (detail view only)."
    )
    state: RunState | None = Field(
        default=None,
        description="State machines: the last committed state, from the journal (the "
        "initial state before the first transition). Detail view only; null otherwise.",
    )
    created_by: str
    parent_run_id: uuid.UUID | None = Field(
        default=None, description="The run that started this one as a child (`ctx.child`)."
    )
    access: Literal["tenant", "owner"] = Field(
        default="tenant",
        description="Who may see the run: any subject of the tenant, or only its submitter.",
    )
    redacted: bool = Field(
        default=False,
        description="Payloads withheld: the run failed its authorization re-check "
        "(reason failure_authorization).",
    )
    paused_at: datetime | None = Field(
        default=None,
        description="Set while an operator has the run paused (`POST /runs/{id}/pause`): "
        "it takes no new step and is not claimed until unpaused; `status` keeps what it "
        "waits on (docs/adr/0021-pause-is-a-flag-beside-the-status.md).",
    )
    paused_by: str | None = Field(default=None, description="Who paused the run.")
    pause_reason: str | None = Field(default=None, description="Why, as given to pause.")
    rerun_of: uuid.UUID | None = Field(
        default=None,
        description="The run this one reruns (`POST /runs/{id}/rerun`), else null.",
    )
    rerun_from_step: str | None = Field(
        default=None,
        description="The step of the original this rerun executes from; the entries "
        "before it were copied from the original's journal and replay.",
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    compacted_at: datetime | None = Field(
        default=None,
        description="Set once maintenance compaction cleared this finished run's payloads: "
        "input, output, step outputs and event data then read as null (statuses, errors and "
        "timings are kept).",
    )


class RunPage(BaseModel):
    """One page of ``GET /runs``."""

    items: list[Run]
    next_page_token: str | None


class RunResult(BaseModel):
    """``GET /runs/{run_id}/result``: ``done`` tells whether the run is terminal."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "run_id": "0193a5f2-7c1e-7b3a-9f00-2b8c4d1e5a6f",
                    "done": True,
                    "status": "completed",
                    "reason": "succeeded",
                    "output": {"shipment_id": "S-77"},
                    "error": None,
                }
            ]
        }
    )

    run_id: uuid.UUID
    done: bool
    status: str
    reason: str | None
    # Defaults, so that examples stay valid: FastAPI drops null members from the spec.
    output: Any = Field(default=None, description="The workflow's result once completed.")
    error: Any = Field(default=None, description="Why it failed (type, message), else null.")


class Step(BaseModel):
    """One journaled step."""

    step_id: str
    seq: int
    kind: str
    name: str
    status: str
    reason: str | None = Field(
        description="How the step ended, a RunReason: succeeded, failure_… (failed or "
        "timed out), rejected_by_approver (a rejected approval, status failed), "
        "canceled_by_request (the run was cancelled) or canceled_by_failure (the run "
        "failed while the step was unfinished, e.g. a parallel branch failed); null while "
        "it has not ended."
    )
    attempt: int
    max_attempts: int
    output: Any
    error: Any
    next_attempt_at: datetime | None
    deadline: datetime | None = Field(description="When a wait times out or a timer fires.")
    detail: Any = Field(description="A wait's settings (approval group, payload, …).")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: float | None = Field(
        description="Last finished attempt's duration in milliseconds; null while an attempt "
        "runs (``finished_at`` is then null too) or before the first one."
    )


class StepPage(BaseModel):
    """One page of ``GET /runs/{run_id}/steps``."""

    items: list[Step]
    next_page_token: str | None


class Event(BaseModel):
    """One timeline entry."""

    event_id: int
    at: datetime
    kind: str
    step_id: str | None
    actor: str | None
    data: Any


class EventPage(BaseModel):
    """One page of ``GET /runs/{run_id}/events``."""

    items: list[Event]
    next_page_token: str | None


class DeadLetter(BaseModel):
    """A terminal failure awaiting an operator."""

    dead_letter_id: uuid.UUID
    run_id: uuid.UUID
    workflow: str
    reason: str
    error: Any
    status: str
    created_at: datetime
    requeued_at: datetime | None
    requeued_by: str | None
    requeue_reason: str | None
    correlation_id: str | None


class RunReport(BaseModel):
    """``GET /runs/{run_id}/report`` in JSON form."""

    generated_at: datetime
    run: Run
    steps: list[Step]
    events: list[Event]
    events_truncated: bool
    dead_letters: list[DeadLetter]
    logs: list[LogLine] = Field(
        default_factory=list, description="The run's last ``logs_limit`` ctx.logger lines."
    )
    logs_total: int = Field(default=0, description="Lines the run keeps in all.")


class MachineState(BaseModel):
    """One state of a registered state machine (``GET /workflows``)."""

    name: str
    fields: Any = Field(description="JSON Schema of the state's fields.")
    initial: bool
    terminal: bool
    timer_seconds: float | None = Field(
        description="Seconds waited in this state (database time) before the next transition."
    )


class RateLimitView(BaseModel):
    """A declared rate limit on run starts (GCRA; app/sdk/queue.py)."""

    per_second: float = Field(description="Sustained run starts per second.")
    burst: int = Field(description="Starts allowed at once after an idle period.")
    by: Literal["workflow", "key"] = Field(
        description="One budget for the whole workflow, or one per concurrency key."
    )


class QueueControlsView(BaseModel):
    """The queue controls a workflow version declares (``GET /workflows``)."""

    key_limit: int = Field(description="Active runs allowed per concurrency key.")
    on_limit: Literal["reject", "queue"] = Field(
        description="Beyond `key_limit`: 409 (`reject`) or wait `queued` in order (`queue`)."
    )
    concurrency_limit: int | None = Field(
        description="Runs executing at once across all workers and tenants (null: no limit)."
    )
    rate_limit: RateLimitView | None


class DagNode(BaseModel):
    """One node of a DAG: its step id and the nodes whose results feed it."""

    name: str = Field(description="The node's name, which is its step id in a run.")
    after: list[str] = Field(description="Parent nodes (empty for a root, fed the input).")


class WorkflowVersion(BaseModel):
    """One registered version of a workflow."""

    version: str
    kind: str = Field(description="`workflow`, `dag` or `state_machine`.")
    access: Literal["tenant", "owner"] = "tenant"
    input_schema: Any
    output_schema: Any
    states: list[MachineState] | None = Field(
        default=None, description="A state machine's states (null for other kinds)."
    )
    graph: list[DagNode] | None = Field(
        default=None,
        description="A DAG's nodes in execution order, each with its parents (null for "
        "other kinds, and for a DAG not registered again since this field was added).",
    )
    queue_controls: QueueControlsView = Field(
        description="Per-key limit, global concurrency limit and rate limit it declares."
    )
    on_event: str | None = Field(
        default=None,
        description="The event name `POST /events` starts it on (when this is the latest "
        "version), null if none (docs/adr/0029-event-triggers.md).",
    )
    event_filter: dict[str, Any] | None = Field(
        default=None,
        description="With `on_event`: `{dotted path: value}` exact matches on the event data.",
    )
    first_registered_at: datetime
    last_registered_at: datetime
    live_workers: list[str]
    open_runs: int = Field(
        default=0, description="The caller's runs of this version not yet finished."
    )
    blocked_runs: int = Field(
        default=0,
        description="Of those, runs a worker must pick up while no live worker registered "
        "this version (see blocked_reason on the run; POST /runs/{run_id}/migrate).",
    )
    queued_for_slot: int = Field(
        default=0,
        description="Of the open runs, those waiting for a slot of their concurrency key "
        "(`on_limit: queue`); they start in submission order as active runs finish.",
    )


class Workflow(BaseModel):
    """A workflow and its registered versions (latest first)."""

    name: str
    versions: list[WorkflowVersion]


class WorkflowList(BaseModel):
    """``GET /workflows``."""

    items: list[Workflow]


class Health(BaseModel):
    """``GET /healthz`` / ``GET /readyz``."""

    status: Literal["ok", "unavailable"]
    detail: str | None = None


class ProblemFieldError(BaseModel):
    """One invalid field of a 422 problem."""

    path: str = Field(description="Dotted path of the field, e.g. ``body.input.items.0.qty``.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``).

    ``code`` is the stable machine-readable identifier to branch on (``run_not_found``,
    ``run_archived``, ``idempotency_key_reused``, ``payload_too_large``,
    ``ceiling_exceeded``, …); further members carry the error's data (``required_scope``,
    ``ceiling``, ``limit``, ``limit_bytes``, ``archived_at``, …).
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "urn:treadle:problem:run_not_found",
                    "title": "Not Found",
                    "status": 404,
                    "detail": "run 0193a5f2-7c1e-7b3a-9f00-2b8c4d1e5a6f not found",
                    "instance": "/runs/0193a5f2-7c1e-7b3a-9f00-2b8c4d1e5a6f",
                    "code": "run_not_found",
                }
            ]
        },
    )

    type: str = Field(description="``urn:treadle:problem:<code>``.")
    title: str
    status: int
    detail: str = Field(description="Human-readable explanation.")
    instance: str | None = Field(default=None, description="The request path.")
    code: str = Field(description="Stable error code to branch on.")
    errors: list[ProblemFieldError] | None = Field(
        default=None, description="Invalid fields (422 responses)."
    )


StepKey = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.\-#:]+$")]


class SendSignalRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/signals/{name}`` (optional)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"payload": {"tracking": "1Z999"}}]},
    )

    payload: Any = Field(default=None, description="JSON delivered to the waiting workflow.")


class SignalAccepted(BaseModel):
    """A buffered signal: consumed, in order, by the run's next wait for its name."""

    run_id: uuid.UUID
    name: str
    signal_id: int


class ApprovalDecisionRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/approvals/{step_id}``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"decision": "approve", "comment": "looks right"}]},
    )

    decision: Literal["approve", "reject"]
    payload: Any = None
    comment: (
        Annotated[
            str,
            Field(max_length=MAX_APPROVAL_COMMENT, json_schema_extra=NO_CONTROL_CHARS),
            AfterValidator(checked_text),
        ]
        | None
    ) = None


class ApprovalDecisionResult(BaseModel):
    """A recorded decision; ``resolved`` tells whether it settled the approval."""

    run_id: uuid.UUID
    step_id: str
    decision: str
    decided_by: str
    resolved: bool


class RequeueRequest(BaseModel):
    """Body of ``POST /dead-letters/{id}/requeue`` and ``POST /runs/{id}/retry``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"reason": "payment provider fixed", "correlation_id": "INC-4521"}]
        },
    )

    reason: Annotated[
        str,
        Field(min_length=1, max_length=MAX_ACTION_REASON, json_schema_extra=NO_CONTROL_CHARS),
        AfterValidator(checked_text),
    ]
    correlation_id: Identifier | None = None


class DeadLetterPage(BaseModel):
    """One page of ``GET /dead-letters``."""

    items: list[DeadLetter]
    next_page_token: str | None


ScopeName = Literal[
    "runs:write",
    "runs:read",
    "runs:cancel",
    "approvals:write",
    "signals:write",
    "events:write",
    "webhooks:manage",
    "admin",
]
TenantName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]


class CreateApiKeyRequest(BaseModel):
    """Body of ``POST /admin/api-keys``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(checked_text)] = Field(
        description="What the key is for (shown in lists)."
    )
    scopes: list[ScopeName] = Field(min_length=1, max_length=len(get_args(ScopeName)))
    tenant: TenantName | None = Field(
        default=None, description="The key's tenant; default the caller's."
    )


class ApiKey(BaseModel):
    """An API key's metadata; the secret is never shown again after creation."""

    key_id: uuid.UUID
    tenant: str
    name: str
    prefix: str = Field(description="Public part of the key: `trd_<prefix>_…`.")
    scopes: list[str]
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    last_used_at: datetime | None = Field(description="Refreshed at most once a minute.")


class ApiKeyCreated(ApiKey):
    """A new key, with its secret ``api_key``: store it now, it is shown only once."""

    api_key: str


class ApiKeyList(BaseModel):
    """``GET /admin/api-keys``."""

    items: list[ApiKey]


class TenantStatus(StrEnum):
    """Whether a tenant may act: ``active`` or ``suspended`` (by an operator)."""

    ACTIVE = "active"
    SUSPENDED = "suspended"


class SuspendTenantRequest(BaseModel):
    """Body of ``POST /admin/tenants/{tenant}/suspend``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"reason": "invoice 2026-11 unpaid (INC-4521)"}]},
    )

    reason: Annotated[
        str,
        Field(min_length=1, max_length=MAX_ACTION_REASON, json_schema_extra=NO_CONTROL_CHARS),
        AfterValidator(checked_text),
    ] = Field(description="Why, for operators; never shown to the tenant.")


class Tenant(BaseModel):
    """A tenant's suspension state. A tenant nobody acted on is active, with no history."""

    tenant: str
    status: TenantStatus
    reason: str | None = Field(description="Why it is suspended; null when active.")
    changed_by: str | None = Field(description="Subject of the last suspend or resume.")
    changed_at: datetime | None = Field(description="When (UTC, database clock).")
    created_at: datetime | None = Field(description="When an operator first acted on it.")


class TenantPage(BaseModel):
    """One page of ``GET /admin/tenants``."""

    items: list[Tenant]
    next_page_token: str | None


class MigrateRunRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/migrate``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    version: (
        Annotated[str, Field(min_length=1, max_length=64), AfterValidator(checked_text)] | int
    ) = Field(description="A registered version of the run's workflow, newer than its own.")
    reason: (
        Annotated[str, Field(max_length=MAX_ACTION_REASON), AfterValidator(checked_text)] | None
    ) = Field(default=None, description="Why (recorded in the run_migrated event).")


class MaintenanceTier(StrEnum):
    """A maintenance tier (see docs/operations.md)."""

    COMPACTION = "compaction"
    ARCHIVAL = "archival"
    AUDIT = "audit"


class MaintenanceRequest(BaseModel):
    """Body of ``POST /admin/maintenance``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"dry_run": True, "tiers": ["compaction", "archival"]}]},
    )

    dry_run: bool = Field(
        default=False,
        description="Do the work in one transaction, roll it back, and report the counts.",
    )
    # Not strict: JSON carries the tier as a string, which strict mode would refuse.
    tiers: list[Annotated[MaintenanceTier, Strict(False)]] = Field(
        default_factory=lambda: list(MaintenanceTier),
        min_length=1,
        max_length=3,
        description="Tiers to run (always applied compaction, archival, audit); default all.",
    )


class MaintenanceTierReport(BaseModel):
    """What one maintenance tier touched (or would touch, in a dry run)."""

    tier: MaintenanceTier
    window_days: float = Field(description="The tier's retention window from settings.")
    cutoff: datetime = Field(description="Rows older than this (database clock) were eligible.")
    batches: int = Field(description="Transactions used (TREADLE_MAINTENANCE_BATCH_SIZE each).")
    touched: dict[str, int] = Field(
        description="Rows changed, moved or deleted per table; ``partitions``: whole time "
        "partitions dropped (PostgreSQL), whose rows are counted under their table."
    )


class MaintenanceReport(BaseModel):
    """Result of ``POST /admin/maintenance``."""

    dry_run: bool
    started_at: datetime
    duration_seconds: float
    tiers: list[MaintenanceTierReport]
    partitions_created: list[str] = Field(
        default_factory=list,
        description="PostgreSQL time partitions created ahead by this run "
        "(docs/adr/0036-time-partitions.md); always empty on SQLite and in a dry run.",
    )


class WhoAmI(BaseModel):
    """``GET /whoami``: the principal the bearer token authenticates as."""

    tenant_id: str
    subject: str
    scopes: list[str] = Field(description="Granted scopes, sorted (`admin` implies all).")
    groups: list[str] = Field(description="Group claims, sorted (approvals may need one).")
    api_key: bool = Field(description="True when the token is a per-tenant API key.")


class RunCounts(BaseModel):
    """``GET /runs/counts``: how many of the listed runs are in each status."""

    counts: dict[str, int] = Field(
        description="Every run status, with 0 for those no matching run is in. A status "
        "named in ``at_least`` has more runs than this (it reports ``count_limit``)."
    )
    total: int = Field(description="The sum of ``counts``: a lower bound if ``total_at_least``.")
    total_at_least: bool = Field(
        default=False,
        description="True when some status reached ``count_limit``: ``total`` is then the "
        "least number of matching runs, not their exact number.",
    )
    at_least: list[str] = Field(
        default_factory=list,
        description="The statuses whose count stopped at ``count_limit`` (more runs match).",
    )
    count_limit: int = Field(
        description="The most runs counted per status (``TREADLE_RUN_COUNT_LIMIT``)."
    )


class PendingApproval(BaseModel):
    """One waiting approval the caller may decide (``GET /approvals``)."""

    run_id: uuid.UUID
    step_id: str
    name: str = Field(description="The approval's name, as the workflow passed it.")
    workflow: str
    version: str
    group: str | None = Field(description="Group whose members may decide; null: anyone.")
    payload: Any = Field(description="What the approver is asked about (null if redacted).")
    approvals_needed: int = Field(description="Approvals the approval needs in all (N of M).")
    approvals_given: int = Field(description="Approvals recorded so far.")
    remaining: int = Field(description="Approvals still needed before it is approved.")
    self_approval: bool = Field(description="Whether the run's submitter may decide it.")
    submitted_by: str = Field(description="Subject that submitted the run.")
    deadline: datetime | None = Field(description="When the approval times out (null: never).")
    waiting_since: datetime


class ApprovalPage(BaseModel):
    """One page of ``GET /approvals``, oldest waiting first."""

    items: list[PendingApproval]
    next_page_token: str | None = None
