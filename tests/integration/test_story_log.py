"""The worker's story lines for the outcomes the HTTP story test does not reach.

Failures (a permanent error, exhausted retries) and an attempt cut short by its sibling's
failure, on a real database with an in-process worker, read back through the real log
pipeline (``configure_logging`` in JSON onto a stream; every line parsed).
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

from app.core.logging import configure_logging
from app.core.settings import LogFormat, Settings
from app.db.database import Database
from tests.integration.test_engine import _ids, finished, gates, running_worker, submit


async def _story(settings: Settings, db: Database, workflow: str, **inp: Any) -> list[Any]:
    stream = io.StringIO()
    configure_logging(settings.model_copy(update={"log_format": LogFormat.JSON}), stream=stream)
    run_id = await submit(db, settings, workflow, **inp)
    async with running_worker(settings, db):
        await finished(db, run_id)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    story = ("treadle.run", "treadle.steps")
    return [r for r in records if r.get("run_id") == str(run_id) and r["logger"] in story]


async def test_a_permanent_error_is_a_failed_attempt_and_a_failed_run(
    settings: Settings, db: Database
) -> None:
    story = await _story(settings, db, "it-permanent", a=0, b=0)
    finished_step = next(r for r in story if r["event"] == "step finished")
    assert finished_step["outcome"] == "failed"
    assert finished_step["reason"] == "failure_non_retryable"
    assert finished_step["error_type"] == "ValueError"
    assert finished_step["message"] == "card declined"
    assert (finished_step["step_id"], finished_step["attempt"]) == ("declined", 1)
    run = next(r for r in story if r["event"] == "run finished")
    assert (run["status"], run["reason"], run["error_type"], run["failed_step"]) == (
        "failed",
        "failure_non_retryable",
        "StepFailed",
        "declined",
    )
    assert not [r for r in story if r["event"] == "step retry scheduled"]


async def test_exhausted_retries_log_each_schedule_then_the_failure(
    settings: Settings, db: Database
) -> None:
    n = next(_ids)
    story = await _story(settings, db, "it-retry", a=2, b=n)
    steps = [(r["event"], r["attempt"], r.get("outcome")) for r in story if "step_id" in r]
    assert steps == [
        ("step started", 1, None),
        ("step retry scheduled", 1, None),
        ("step finished", 1, "retry"),
        ("step started", 2, None),
        ("step finished", 2, "failed"),
    ]
    failed = next(r for r in story if r.get("outcome") == "failed")
    assert failed["reason"] == "failure_attempts_exhausted"
    assert failed["error_type"] == "ConnectionError"
    assert next(r for r in story if r["event"] == "run finished")["status"] == "failed"


async def test_a_sibling_cut_short_by_a_failure_is_interrupted(
    settings: Settings, db: Database
) -> None:
    n = next(_ids)
    gates[f"bf-{n}"] = asyncio.Event()
    story = await _story(settings, db, "it-branch-fails", a=n, b=0)
    outcomes = {r["step_id"]: r for r in story if r["event"] == "step finished"}
    assert outcomes["fail"]["outcome"] == "failed"
    assert outcomes["slow"]["outcome"] == "interrupted"
    assert outcomes["slow"]["error_type"] == "CancelledError"
