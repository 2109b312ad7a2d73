"""Response models of ``GET /runs/{run_id}/logs`` (lines kept from ``ctx.logger``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.core.status import LogLevel


class LogLine(BaseModel):
    """One line handler code logged with ``ctx.logger`` (docs/adr/0027-run-logs.md)."""

    seq: int = Field(
        description="Order within the run (1, 2, …); the 'N lines dropped' summary, when "
        "the run logged past TREADLE_RUN_LOG_MAX_LINES, is last with seq 2147483647."
    )
    at: datetime = Field(description="When it was logged (database clock, UTC).")
    level: LogLevel
    message: str | None = Field(
        description="The message (cut with '… [N more characters]' past the line bound); "
        "null on a redacted run."
    )
    fields: dict[str, Any] | None = Field(
        description="The fields logged with it (JSON), null if none or on a redacted run."
    )
    step_id: str | None = Field(
        description="The step whose attempt logged it; null in workflow code."
    )
    attempt: int | None = Field(description="That attempt's number (1-based).")


class LogPage(BaseModel):
    """One page of ``GET /runs/{run_id}/logs``."""

    items: list[LogLine]
    next_page_token: str | None
    redacted: bool = Field(
        description="True when the run failed its authorization re-check: lines keep their "
        "time, level, step and attempt, but no message or fields."
    )
