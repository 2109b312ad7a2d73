"""The text report's RUN and STEPS lines: total duration, human units, claims vs attempts.

Both databases, an in-process worker and the real API app: a run whose step fails once and
is retried after a delay longer than ``TREADLE_INLINE_RETRY_MAX_SECONDS`` is released and
claimed again, so it has two claims and its step two attempts, shown apart.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from pydantic import BaseModel

from app.db.database import Database
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "reports"
# A duration as human_duration spells it (app/core/text.py).
HUMAN = r"\d+(\.\d)? (ms|s)|\d+ min( \d+ s)?|\d+ h( \d+ min)?|\d+ d( \d+ h)?"


class Key(BaseModel):
    key: str


def flaky(key: str) -> str:
    if current_step().attempt == 1:
        raise ConnectionError("first attempt fails")
    return key


@workflow("report-retried")
async def retried_flow(ctx: WorkflowContext, k: Key) -> str:
    return await ctx.step(flaky, k.key, retry=RetryPolicy(max_attempts=3, delay=0.2))


@workflow("report-unstarted")
async def unstarted_flow(ctx: WorkflowContext, k: Key) -> str:
    return k.key


REGISTRY = Registry([retried_flow, unstarted_flow])


def line(text: str, prefix: str) -> str:
    (found,) = [x for x in text.splitlines() if x.startswith(prefix)]
    return found


async def test_the_report_names_claims_and_shows_durations(
    database_url: str, tmp_path: Path
) -> None:
    # Retries due later than 0.05 s release the run: the second attempt is a second claim.
    settings = make_settings(database_url, tmp_path, inline_retry_max_seconds=0.05)
    db = Database(settings)
    try:
        key = uuid.uuid4().hex[:8]
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "report-retried", key=key)
        async with support.workers(settings, db, REGISTRY):
            await support.reach(db, TENANT, run_id, "completed", "failed")
        # Submitted once no worker runs: it stays queued, unfinished.
        queued = await support.submit(db, settings, REGISTRY, TENANT, "report-unstarted", key=key)
        async with support.api_client(settings, db, TENANT) as client:
            done = (await client.get(f"/runs/{run_id}/report", params={"format": "text"})).text
            unfinished = (
                await client.get(f"/runs/{queued}/report", params={"format": "text"})
            ).text
    finally:
        await db.dispose()
    assert line(done, "status") == "status       completed (succeeded)", done
    assert line(done, "claims") == "claims       2 (executions: times a worker took the run)"
    assert "attempt      " not in done, "the run-level count is not called an attempt"
    assert re.fullmatch(rf"duration     ({HUMAN}) \(created to finished\)", line(done, "duration"))
    (step,) = [x for x in done.splitlines() if " flaky " in x]
    assert re.search(rf"succeeded +attempt 2/3  ({HUMAN})$", step), step
    # A run not finished yet: how long since it was created, said to be so far.
    assert line(unfinished, "claims") == "claims       0 (executions: times a worker took the run)"
    assert re.fullmatch(
        rf"duration     ({HUMAN}) so far \(created to this report\)", line(unfinished, "duration")
    ), unfinished
