"""Request and response models of the HTTP API (names chosen for generated SDKs)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _printable(value: str) -> str:
    # Identifiers end up in indexed text columns: refuse control characters (NUL cannot be
    # stored by PostgreSQL at all) and lone surrogates (not encodable as UTF-8).
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("control characters are not allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("not valid unicode (lone surrogate)") from exc
    return value


NO_CONTROL_CHARS: dict[str, Any] = {"pattern": r"^[^\x00-\x1f\x7f]*$"}
"""``json_schema_extra`` documenting :func:`_printable` in the spec (the validator itself
gives the clearer message); clients and fuzzers then know control characters are refused."""

Identifier = Annotated[
    str,
    Field(min_length=1, max_length=255, json_schema_extra=NO_CONTROL_CHARS),
    AfterValidator(_printable),
]
WorkflowName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")]


class SubmitRunRequest(BaseModel):
    """Body of ``POST /runs``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    workflow: WorkflowName = Field(description="Registered workflow name.")
    input: Any = Field(
        default_factory=dict,
        description="JSON input, validated against the workflow's registered input schema.",
    )
    version: (
        Annotated[
            str,
            Field(min_length=1, max_length=64, json_schema_extra=NO_CONTROL_CHARS),
            AfterValidator(_printable),
        ]
        | int
        | None
    ) = Field(default=None, description="Pin a definition version; default the latest registered.")
    idempotency_key: Identifier | None = Field(
        default=None,
        description="Same key + same request returns the same run (or use the "
        "Idempotency-Key header).",
    )
    concurrency_key: Identifier | None = None
    delay: float | None = Field(
        default=None, ge=0, le=366 * 86400, description="Seconds before the run may start."
    )


class CancelRunRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/cancel`` (optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    reason: (
        Annotated[
            str,
            Field(max_length=1000, json_schema_extra=NO_CONTROL_CHARS),
            AfterValidator(_printable),
        ]
        | None
    ) = None


class WaitingOn(BaseModel):
    """What a waiting run waits for."""

    kind: str
    name: str | None = None
    deadline: datetime | None = None


class Run(BaseModel):
    """A run snapshot. Timestamps are UTC (ISO 8601)."""

    run_id: uuid.UUID
    workflow: str
    version: str
    status: str
    reason: str | None
    input: Any
    output: Any | None
    error: Any | None
    idempotency_key: str | None
    concurrency_key: str | None
    attempt: int = Field(description="How many times a worker has claimed the run.")
    lease_owner: str | None
    lease_expires_at: datetime | None
    waiting_on: WaitingOn | None
    blocked_reason: str | None
    step_counts: dict[str, int] | None = Field(
        default=None, description="Steps by status (detail view only)."
    )
    created_by: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class RunPage(BaseModel):
    """One page of ``GET /runs``."""

    items: list[Run]
    next_page_token: str | None


class RunResult(BaseModel):
    """``GET /runs/{run_id}/result``: ``done`` tells whether the run is terminal."""

    run_id: uuid.UUID
    done: bool
    status: str
    reason: str | None
    output: Any | None
    error: Any | None


class Step(BaseModel):
    """One journaled step."""

    step_id: str
    seq: int
    kind: str
    name: str
    status: str
    attempt: int
    max_attempts: int
    output: Any | None
    error: Any | None
    next_attempt_at: datetime | None
    deadline: datetime | None = Field(description="When a wait times out or a timer fires.")
    detail: Any | None = Field(description="A wait's settings (approval group, payload, …).")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: float | None = Field(description="Last attempt's duration in milliseconds.")


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
    data: Any | None


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
    error: Any | None
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


class WorkflowVersion(BaseModel):
    """One registered version of a workflow."""

    version: str
    kind: str
    input_schema: Any
    output_schema: Any
    first_registered_at: datetime
    last_registered_at: datetime
    live_workers: list[str]


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


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    code: str


StepKey = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.\-#:]+$")]


class SendSignalRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/signals/{name}`` (optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    payload: Any = Field(default=None, description="JSON delivered to the waiting workflow.")


class SignalAccepted(BaseModel):
    """A buffered signal: consumed, in order, by the run's next wait for its name."""

    run_id: uuid.UUID
    name: str
    signal_id: int


class ApprovalDecisionRequest(BaseModel):
    """Body of ``POST /runs/{run_id}/approvals/{step_id}``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    decision: Literal["approve", "reject"]
    payload: Any = None
    comment: (
        Annotated[
            str,
            Field(max_length=2000, json_schema_extra=NO_CONTROL_CHARS),
            AfterValidator(_printable),
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

    model_config = ConfigDict(extra="forbid", strict=True)

    reason: Annotated[
        str,
        Field(min_length=1, max_length=1000, json_schema_extra=NO_CONTROL_CHARS),
        AfterValidator(_printable),
    ]
    correlation_id: Identifier | None = None


class DeadLetterPage(BaseModel):
    """One page of ``GET /dead-letters``."""

    items: list[DeadLetter]
    next_page_token: str | None
