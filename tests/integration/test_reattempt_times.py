"""A step attempted again keeps no finish time of an earlier attempt, and reports render.

A step that failed and is attempted again (its run requeued from the dead letter, a
rerun, a lost attempt) starts a new attempt on the same ``steps`` row. The start used to
move ``started_at`` and leave the earlier attempt's ``finished_at``, so while the new
attempt ran its duration was negative and ``GET /runs/{id}/report?format=text`` answered
500 (found by the console's Retry flow). Each way an attempt's start is written is
checked here on both databases, and a row already holding an inverted pair (written
before the fix) still renders.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import select, update

from app.core.settings import Settings
from app.core.status import StepStatus
from app.db.database import Database
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import steps
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import api_client, submit

TENANT = "reattempt"


class In(BaseModel):
    """Empty input."""


@workflow("reattempt-plain")
async def plain(ctx: WorkflowContext, input: In) -> None:
    """Never executed: the test writes the attempts itself."""


async def _claimed(db: Database, settings: Settings) -> tuple[uuid.UUID, int]:
    run_id = await submit(db, settings, Registry([plain]), TENANT, "reattempt-plain")
    async with db.write() as conn:
        (row,) = await runs_q.claim_runs(
            conn,
            worker_id="w1",
            definition_keys=[("reattempt-plain", "1")],
            limit=1,
            lease_ttl=60,
        )
    return run_id, int(row["fence"])


async def _start(db: Database, run_id: uuid.UUID, fence: int, attempt: int, path: str) -> None:
    if path == "single-statement":
        async with db.autocommit() as conn:
            await checkpoints_q.start_attempt(
                conn,
                run_id=run_id,
                tenant_id=TENANT,
                fence=fence,
                step_id="s",
                seq=0,
                kind="step",
                name="s",
                attempt=attempt,
                max_attempts=1,
                detail=None,
                event_data="{}",
            )
        return
    async with db.write() as conn:
        await steps_q.start_attempt(
            conn,
            run_id=run_id,
            tenant_id=TENANT,
            step_id="s",
            seq=0,
            detail=None,
            kind="step",
            name="s",
            attempt=attempt,
            max_attempts=1,
            fence=fence,
        )


async def _step(db: Database, run_id: uuid.UUID) -> tuple[str, object, object]:
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(steps.c.status, steps.c.started_at, steps.c.finished_at).where(
                    steps.c.run_id == run_id
                )
            )
        ).one()
    return str(row[0]), row[1], row[2]


@pytest.mark.parametrize("path", ["single-statement", "transaction"])
async def test_a_new_attempt_clears_the_earlier_finish(
    settings: Settings, db: Database, path: str
) -> None:
    if path == "single-statement" and db.dialect != "postgresql":
        pytest.skip("single-statement checkpoints are the PostgreSQL path")
    run_id, fence = await _claimed(db, settings)
    await _start(db, run_id, fence, 1, path)
    async with db.write() as conn:
        await steps_q.finish_attempt(
            conn,
            run_id=run_id,
            tenant_id=TENANT,
            step_id="s",
            status=StepStatus.FAILED,
            output=None,
            error='{"type": "Boom", "message": "boom"}',
            fence=fence,
        )
    status, _, finished = await _step(db, run_id)
    assert status == "failed" and finished is not None

    await _start(db, run_id, fence, 2, path)
    status, started, finished = await _step(db, run_id)
    assert (status, finished) == ("running", None) and started is not None
    async with api_client(settings, db, TENANT) as api:
        text = await api.get(f"/runs/{run_id}/report", params={"format": "text"})
        assert text.status_code == 200, text.text
        assert "attempt 2/1" in text.text
        report = await api.get(f"/runs/{run_id}/report")
        assert report.status_code == 200, report.text
        (step,) = report.json()["steps"]
        assert (step["status"], step["finished_at"], step["duration_ms"]) == (
            "running",
            None,
            None,
        )


async def test_a_finish_older_than_the_start_renders(settings: Settings, db: Database) -> None:
    """A row already holding an earlier attempt's finish (before the fix) still renders."""
    run_id, fence = await _claimed(db, settings)
    await _start(db, run_id, fence, 1, "transaction")
    _, started, _ = await _step(db, run_id)
    assert started is not None
    async with db.write() as conn:
        await conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id)
            .values(finished_at=started - timedelta(seconds=3))  # type: ignore[operator]
        )
    async with api_client(settings, db, TENANT) as api:
        text = await api.get(f"/runs/{run_id}/report", params={"format": "text"})
        assert text.status_code == 200, text.text
        (step,) = (await api.get(f"/runs/{run_id}/report")).json()["steps"]
        assert step["finished_at"] is None and step["duration_ms"] is None
        listed = await api.get(f"/runs/{run_id}/steps")
        assert listed.status_code == 200, listed.text
        (item,) = listed.json()["items"]
        assert item["finished_at"] is None and item["duration_ms"] is None
