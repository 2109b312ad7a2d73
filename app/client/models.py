"""Typed answers of the Treadle API, as the client returns them (docs/clients.md).

These mirror the response schemas of ``openapi/openapi.json`` (the API's own pydantic
models live in ``app.api.schemas``, which the client must not import: a client is
installed and run far from the server's code). Unknown members a newer server adds are
kept (``extra="allow"``), so an older client keeps working.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.core.status import RunReason, RunStatus


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class WaitingOn(_Model):
    """What a waiting run waits for: ``kind`` (approval, signal, timer, child), name, deadline."""

    kind: str
    name: str | None = None
    deadline: datetime | None = None


class RunState(_Model):
    """A state machine's current state: variant ``name`` and its typed ``fields``."""

    name: str
    fields: dict[str, Any]


class Run(_Model):
    """Snapshot of one run (``GET /runs/{run_id}``; also the answer of submit and cancel)."""

    run_id: uuid.UUID
    workflow: str
    version: str
    status: RunStatus
    reason: RunReason | None = None
    input: Any = None
    output: Any = None
    error: Any = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    concurrency_slot: int | None = None
    priority: int = 0
    attempt: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    waiting_on: WaitingOn | None = None
    labels: dict[str, str] = {}
    blocked_reason: str | None = None
    step_counts: dict[str, int] | None = None
    state: RunState | None = None
    created_by: str = ""
    parent_run_id: uuid.UUID | None = None
    redacted: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    rerun_of: uuid.UUID | None = None
    rerun_from_step: str | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RunPage(_Model):
    """One page of ``GET /runs``; pass ``next_page_token`` back for the next (None: last)."""

    items: list[Run]
    next_page_token: str | None = None


class RunResult(_Model):
    """``GET /runs/{run_id}/result``: ``done`` once terminal, with output or error."""

    run_id: uuid.UUID
    done: bool
    status: RunStatus
    reason: RunReason | None = None
    output: Any = None
    error: Any = None

    @property
    def succeeded(self) -> bool:
        """True when the run ended ``completed`` (reason ``succeeded``)."""
        return self.status is RunStatus.COMPLETED


class Step(_Model):
    """One journaled step with its attempts, timings and error."""

    step_id: str
    seq: int
    kind: str
    name: str
    status: str
    reason: str | None = None
    attempt: int
    max_attempts: int
    output: Any = None
    error: Any = None
    next_attempt_at: datetime | None = None
    deadline: datetime | None = None
    detail: Any = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: float | None = None


class StepPage(_Model):
    """One page of ``GET /runs/{run_id}/steps``."""

    items: list[Step]
    next_page_token: str | None = None


class Event(_Model):
    """One row of a run's append-only timeline."""

    event_id: int
    at: datetime
    kind: str
    step_id: str | None = None
    actor: str | None = None
    data: Any = None


class EventPage(_Model):
    """One page of ``GET /runs/{run_id}/events``."""

    items: list[Event]
    next_page_token: str | None = None


class LogLine(_Model):
    """One line handler code logged with ``ctx.logger`` (``step_id`` None in workflow code).

    ``message`` and ``fields`` are None on a redacted run; the "N lines dropped" summary
    of a run that logged past its cap is last, with ``seq`` 2147483647.
    """

    seq: int
    at: datetime
    level: str
    message: str | None = None
    fields: dict[str, Any] | None = None
    step_id: str | None = None
    attempt: int | None = None


class LogPage(_Model):
    """One page of ``GET /runs/{run_id}/logs``."""

    items: list[LogLine]
    next_page_token: str | None = None
    redacted: bool = False


class DeadLetter(_Model):
    """A terminal failure awaiting an operator (``status`` pending or requeued)."""

    dead_letter_id: uuid.UUID
    run_id: uuid.UUID
    workflow: str
    reason: str
    error: Any = None
    status: str
    created_at: datetime
    requeued_at: datetime | None = None
    requeued_by: str | None = None
    requeue_reason: str | None = None
    correlation_id: str | None = None


class DeadLetterPage(_Model):
    """One page of ``GET /dead-letters``."""

    items: list[DeadLetter]
    next_page_token: str | None = None


class RunReport(_Model):
    """The operator's report: run, steps, timeline, last log lines, dead letters (DB time)."""

    generated_at: datetime
    run: Run
    steps: list[Step]
    events: list[Event]
    events_truncated: bool
    dead_letters: list[DeadLetter]
    logs: list[LogLine] = []
    logs_total: int = 0


class SignalAccepted(_Model):
    """Answer of ``POST /runs/{run_id}/signals/{name}`` (202): the buffered signal's id."""

    run_id: uuid.UUID
    name: str
    signal_id: int


class InboundEvent(_Model):
    """A posted event (``POST /events``, ``GET /events/{event_id}``).

    Not a run timeline :class:`Event`: ``started_run_ids`` are the runs its triggers
    started, ``resumed_run_ids`` the runs it was delivered to in ``ctx.wait_for_event``.
    """

    event_id: uuid.UUID
    name: str
    key: str | None = None
    data: Any = None
    sent_by: str
    received_at: datetime
    started_run_ids: list[uuid.UUID]
    resumed_run_ids: list[uuid.UUID]


class ApprovalDecision(_Model):
    """Answer of ``POST /runs/{run_id}/approvals/{step_id}``."""

    run_id: uuid.UUID
    step_id: str
    decision: str
    decided_by: str
    resolved: bool


class DagNode(_Model):
    """One node of a DAG: its step id and the nodes whose results feed it."""

    name: str
    after: list[str] = []


class WorkflowVersion(_Model):
    """One registered version of a workflow and the workers that run it now.

    ``graph``: a DAG's nodes in execution order (None for other kinds).
    """

    version: str
    kind: str
    input_schema: Any = None
    output_schema: Any = None
    graph: list[DagNode] | None = None
    live_workers: list[str] = []
    open_runs: int = 0
    blocked_runs: int = 0


class Workflow(_Model):
    """A registered workflow and its versions."""

    name: str
    versions: list[WorkflowVersion]


class WorkflowList(_Model):
    """``GET /workflows``."""

    items: list[Workflow]


class WhoAmI(_Model):
    """``GET /whoami``: who the token authenticates as."""

    tenant_id: str
    subject: str
    scopes: list[str]
    groups: list[str]
    api_key: bool = False


class RunCounts(_Model):
    """``GET /runs/counts``: runs per status (every status present, 0 included).

    A status in ``at_least`` has more runs than its count (``count_limit``); ``total`` is
    then a lower bound and ``total_at_least`` is true.
    """

    counts: dict[str, int]
    total: int
    total_at_least: bool = False
    at_least: list[str] = []
    count_limit: int | None = None


class PendingApproval(_Model):
    """A waiting approval the caller may decide (``GET /approvals``)."""

    run_id: uuid.UUID
    step_id: str
    name: str
    workflow: str
    version: str
    group: str | None = None
    payload: Any = None
    approvals_needed: int
    approvals_given: int
    remaining: int
    self_approval: bool
    submitted_by: str
    deadline: datetime | None = None
    waiting_since: datetime


class ApprovalPage(_Model):
    """One page of ``GET /approvals``, oldest waiting first."""

    items: list[PendingApproval]
    next_page_token: str | None = None


class Batch(_Model):
    """A bulk action's durable batch and its progress (``GET /batches/{id}``).

    ``done + skipped + failed`` reaches ``matched`` once ``state`` is ``completed``;
    ``skipped_reasons`` counts skipped runs by reason (``already_terminal``, …).
    """

    batch_id: uuid.UUID
    action: str
    selection: dict[str, Any]
    params: dict[str, Any]
    reason: str | None = None
    state: str
    matched: int
    done: int
    skipped: int
    skipped_reasons: dict[str, int]
    failed: int
    failures: list[dict[str, Any]]
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class SubmittedItem(_Model):
    """One item's outcome in :class:`SubmittedBatch` (``POST /runs:batch``).

    ``status`` is what ``POST /runs`` would have answered for the item alone: 201 new
    run, 200 identical idempotent retry (``run`` set), else a 4xx with ``problem`` (the
    problem+json members: ``code``, ``detail``, …).
    """

    index: int
    status: int
    run: Run | None = None
    problem: dict[str, Any] | None = None


class SubmittedBatch(_Model):
    """``POST /runs:batch``'s answer: one :class:`SubmittedItem` per run, request order."""

    results: list[SubmittedItem]
    created: int
    failed: int


class BatchPage(_Model):
    """One page of ``GET /batches``, newest first."""

    items: list[Batch]
    next_page_token: str | None = None


class Webhook(_Model):
    """A webhook endpoint (``GET /webhooks/{id}``), without its secret."""

    webhook_id: uuid.UUID
    url: str
    events: list[str]
    workflow: str | None = None
    created_by: str
    created_at: datetime


class CreatedWebhook(Webhook):
    """The answer of ``POST /webhooks``: the endpoint and its signing secret, shown once."""

    secret: str


class WebhookList(_Model):
    """The tenant's webhook endpoints, oldest first."""

    items: list[Webhook]


class WebhookAttempt(_Model):
    """One POST of a delivery: when, and the HTTP status or the error (None: interrupted)."""

    attempt: int
    started_at: datetime
    finished_at: datetime | None = None
    http_status: int | None = None
    error: str | None = None


class WebhookDelivery(_Model):
    """One terminal state of a run delivered to an endpoint: pending, delivered or failed."""

    delivery_id: uuid.UUID
    run_id: uuid.UUID
    workflow: str
    run_status: str
    run_reason: str | None = None
    finished_at: datetime
    state: str
    attempts: list[WebhookAttempt]
    next_attempt_at: datetime | None = None
    created_at: datetime


class WebhookDeliveryPage(_Model):
    """One page of ``GET /webhooks/{id}/deliveries``, newest first."""

    items: list[WebhookDelivery]
    next_page_token: str | None = None


class BulkDryRun(_Model):
    """A bulk action's dry run: how many runs it would act on and up to 20 of their ids."""

    dry_run: bool
    matched: int
    sample: list[uuid.UUID]
