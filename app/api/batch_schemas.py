"""Request and response models of the bulk actions and ``/batches`` (apart from ``schemas.py``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from app.api.instants import in_utc_range
from app.core.status import RunReason, RunStatus
from app.engine.batches import MAX_RUN_IDS

SignalName = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
]


class BulkFilter(BaseModel):
    """The ``GET /runs`` filters, as a JSON object (every given one must match)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"workflow": "orders", "version": "3", "labels": {"customer": "42"}}]
        },
    )

    workflow: str | None = Field(default=None, max_length=200)
    status: RunStatus | None = None
    reason: RunReason | None = None
    version: str | None = Field(default=None, max_length=64)
    created_after: Annotated[AwareDatetime, AfterValidator(in_utc_range)] | None = None
    created_before: Annotated[AwareDatetime, AfterValidator(in_utc_range)] | None = None
    finished_after: AwareDatetime | None = None
    finished_before: AwareDatetime | None = None
    idempotency_key: str | None = Field(default=None, max_length=255)
    waiting_on: str | None = Field(
        default=None, max_length=300, description="`<kind>[:<name>]`, as in `GET /runs`."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="`{key: value}` equality, or `{key: prefix*}` a prefix, as "
        "`label.<key>` in `GET /runs`.",
    )


class BulkRequest(BaseModel):
    """Body of ``POST /runs:cancel|retry|resume|pause|unpause``: ids or a filter."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"filter": {"workflow": "orders", "status": "waiting_signal"}, "dry_run": True},
                {"run_ids": ["01938f2e-0000-7000-8000-000000000001"], "reason": "INC-4521"},
            ]
        },
    )

    run_ids: list[uuid.UUID] | None = Field(
        default=None, max_length=MAX_RUN_IDS, description=f"At most {MAX_RUN_IDS} run ids."
    )
    filter: BulkFilter | None = Field(default=None, description="Or: the `GET /runs` filters.")
    dry_run: bool = Field(
        default=False, description="Only count the matching runs and sample 20 ids."
    )
    reason: str | None = Field(
        default=None, max_length=1000, description="Recorded with each run's action."
    )


class BulkSignalRequest(BulkRequest):
    """Body of ``POST /runs:signal``: a selection and the signal sent to each run."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "filter": {"workflow": "orders", "waiting_on": "signal:payment"},
                    "name": "payment",
                    "payload": {"status": "settled"},
                }
            ]
        },
    )

    name: SignalName = Field(description="The signal name.")
    payload: Any = Field(default=None, description="JSON delivered with each signal.")


class BulkDryRun(BaseModel):
    """What a bulk action would act on (``dry_run: true``; nothing is created)."""

    dry_run: Literal[True] = True
    matched: int = Field(description="Runs it would act on.")
    sample: list[uuid.UUID] = Field(description="Up to 20 of them, oldest first.")


BatchState = Literal["running", "completed", "cancelled"]


class Batch(BaseModel):
    """A bulk action's durable batch and its progress.

    ``done + skipped + failed`` reaches ``matched`` when it completes; ``skipped_reasons``
    counts the skipped runs by reason (``already_terminal``, ``not_paused``,
    ``not_waiting``, ``not_failed``, ``already_paused``, ``already_cancelling``,
    ``not_found``, ``invalid_state``).
    """

    batch_id: uuid.UUID
    action: str
    selection: dict[str, Any] = Field(description="`{run_ids}` or `{filter}` as requested.")
    params: dict[str, Any] = Field(description="The signal's `name` and `payload`, if any.")
    reason: str | None
    state: BatchState
    matched: int
    done: int
    skipped: int
    skipped_reasons: dict[str, int]
    failed: int
    failures: list[dict[str, Any]] = Field(description="The last 20 failures, with codes.")
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class BatchPage(BaseModel):
    """One page of ``GET /batches``, newest first."""

    items: list[Batch]
    next_page_token: str | None
