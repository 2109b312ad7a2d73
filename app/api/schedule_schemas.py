"""Request and response models of ``/schedules`` (kept apart from ``schemas.py``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.api.instants import Instant
from app.api.schemas import WorkflowName
from app.core.text import checked_text
from app.engine.schedules import MAX_CATCHUP_WINDOW_SECONDS, MAX_JITTER_SECONDS

OverlapPolicy = Literal["skip", "buffer_one", "allow_all", "cancel_previous"]
ScheduleName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")]
CronText = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(checked_text)]
ZoneName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(checked_text)]
VersionText = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(checked_text)] | int
CatchupWindow = Annotated[int, Field(ge=0, le=MAX_CATCHUP_WINDOW_SECONDS)]
Jitter = Annotated[int, Field(ge=0, le=MAX_JITTER_SECONDS)]

_CRON_DOC = (
    "Standard 5-field cron (minute hour day-of-month month day-of-week), evaluated in "
    "`timezone`. Give `cron` or `at`, not both."
)


class CreateScheduleRequest(BaseModel):
    """Body of ``POST /schedules``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ScheduleName = Field(description="Unique within the tenant.")
    workflow: WorkflowName = Field(description="Registered workflow name.")
    input: Any = Field(default_factory=dict, description="JSON input of every run.")
    version: VersionText | None = Field(
        default=None, description="Pin a definition version; default the latest at each fire."
    )
    cron: CronText | None = Field(default=None, description=_CRON_DOC)
    timezone: ZoneName = Field(default="UTC", description="IANA time zone of `cron`.")
    at: Instant | None = Field(
        default=None, strict=False, description="One-off fire time (with a timezone)."
    )
    overlap: OverlapPolicy = Field(
        default="skip", description="What a tick does while an earlier run is still open."
    )
    catchup_window_seconds: CatchupWindow = Field(
        default=60, description="Ticks later than this (after downtime) are skipped and counted."
    )
    jitter_seconds: Jitter = Field(
        default=0, description="Each tick fires up to this much later (deterministic per tick)."
    )
    paused: bool = Field(default=False, description="Create paused.")


class UpdateScheduleRequest(BaseModel):
    """Body of ``PATCH /schedules/{schedule_id}``: only the fields given change.

    Setting ``cron`` clears ``at`` and vice versa; changing the timing recomputes the next
    tick from now.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ScheduleName | None = None
    workflow: WorkflowName | None = None
    input: Any = None
    version: VersionText | None = None
    cron: CronText | None = None
    timezone: ZoneName | None = None
    at: Instant | None = Field(default=None, strict=False)
    overlap: OverlapPolicy | None = None
    catchup_window_seconds: CatchupWindow | None = None
    jitter_seconds: Jitter | None = None


class UpcomingTick(BaseModel):
    """A future tick: its nominal time and when it fires (with jitter)."""

    tick: datetime
    fire_at: datetime


class Schedule(BaseModel):
    """A schedule. Timestamps are UTC."""

    schedule_id: uuid.UUID
    name: str
    workflow: str
    version: str | None
    input: Any
    cron: str | None
    timezone: str
    at: datetime | None
    overlap: OverlapPolicy
    catchup_window_seconds: int
    jitter_seconds: int
    state: Literal["active", "paused", "completed"]
    next_fire_times: list[UpcomingTick] = Field(
        description="The next ticks (up to `next` of them in the detail view; 1 in lists)."
    )
    last_tick_at: datetime | None
    buffered_tick_at: datetime | None = Field(
        description="buffer_one: the tick held back until the open run finishes."
    )
    fired_count: int = Field(description="Runs started by this schedule.")
    missed_count: int = Field(description="Ticks skipped as older than the catch-up window.")
    skipped_count: int = Field(description="Ticks skipped by the overlap policy.")
    last_error: str | None
    blocked_reason: str | None = Field(
        default=None,
        description="Why the principal the schedule acts for may not act now: the API "
        "key it was created with is revoked, or its tenant is suspended. Its ticks then "
        "start nothing and are recorded `failed` with this sentence as `error`. Null when "
        "it can fire.",
    )
    access: Literal["tenant", "owner"] = Field(
        default="tenant",
        description="The access policy of its workflow: `owner` schedules are visible to "
        "their creator (and `admin`) only.",
    )
    created_by: str = Field(
        description="The subject the schedule acts for: its runs are created in this name."
    )
    created_at: datetime
    updated_at: datetime


class SchedulePage(BaseModel):
    """One page of ``GET /schedules``."""

    items: list[Schedule]
    next_page_token: str | None


class ScheduleFire(BaseModel):
    """One fired tick and what it did."""

    tick: datetime = Field(description="The nominal tick (for manual triggers: the time).")
    kind: Literal["cron", "once", "manual"]
    outcome: Literal["started", "skipped", "buffered", "failed"]
    run_id: uuid.UUID | None
    fired_at: datetime
    fired_by: str
    error: str | None


class ScheduleFirePage(BaseModel):
    """One page of ``GET /schedules/{schedule_id}/fires``, newest tick first."""

    items: list[ScheduleFire]
    next_page_token: str | None
