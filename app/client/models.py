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
    blocked_reason: str | None = None
    step_counts: dict[str, int] | None = None
    state: RunState | None = None
    created_by: str = ""
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
    """The operator's report: run, steps, timeline and dead letters (database time)."""

    generated_at: datetime
    run: Run
    steps: list[Step]
    events: list[Event]
    events_truncated: bool
    dead_letters: list[DeadLetter]


class SignalAccepted(_Model):
    """Answer of ``POST /runs/{run_id}/signals/{name}`` (202): the buffered signal's id."""

    run_id: uuid.UUID
    name: str
    signal_id: int


class ApprovalDecision(_Model):
    """Answer of ``POST /runs/{run_id}/approvals/{step_id}``."""

    run_id: uuid.UUID
    step_id: str
    decision: str
    decided_by: str
    resolved: bool


class WorkflowVersion(_Model):
    """One registered version of a workflow and the workers that run it now."""

    version: str
    kind: str
    input_schema: Any = None
    output_schema: Any = None
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
