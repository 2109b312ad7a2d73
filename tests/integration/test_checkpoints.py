"""Single-statement step checkpoints (PostgreSQL): a moved fence writes nothing.

The start and the result of a plain step are each one statement of data-modifying CTEs
in autocommit (app/db/queries/checkpoints.py). These tests pin the contract the
multi-statement path had: with the current fence, the journal row and its event are
written together; with a stale fence (a claim took the run over), ``LeaseLost`` is raised
and no row of steps or events changes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries import runs as runs_q
from app.db.tables import events, runs, steps
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import submit

TENANT = "cp"


class In(BaseModel):
    """Empty input."""


@workflow("cp-plain")
async def plain(ctx: WorkflowContext, input: In) -> None:
    """Never executed: the test drives the checkpoints itself."""


async def _counts(db: Database, run_id: uuid.UUID) -> tuple[int, int, list[tuple[str, int]]]:
    async with db.read() as conn:
        n_steps = (
            await conn.execute(select(func.count()).where(steps.c.run_id == run_id))
        ).scalar_one()
        n_events = (
            await conn.execute(select(func.count()).where(events.c.run_id == run_id))
        ).scalar_one()
        rows = (
            await conn.execute(
                select(steps.c.status, steps.c.fence).where(steps.c.run_id == run_id)
            )
        ).all()
    return int(n_steps), int(n_events), [(r[0], int(r[1])) for r in rows]


async def test_stale_fence_writes_nothing(settings: Settings, db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("single-statement checkpoints are the PostgreSQL path")
    registry = Registry([plain])
    run_id = await submit(db, settings, registry, TENANT, "cp-plain")
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn,
            worker_id="w1",
            definition_keys=[("cp-plain", "1")],
            limit=1,
            lease_ttl=30,
        )
    fence = int(claimed["fence"])
    before = await _counts(db, run_id)
    args: dict[str, Any] = {
        "run_id": run_id,
        "step_id": "s",
        "seq": 0,
        "kind": "step",
        "name": "s",
        "attempt": 1,
        "max_attempts": 3,
        "detail": None,
        "event_data": '{"attempt":1}',
    }
    with pytest.raises(LeaseLost):
        async with db.autocommit() as conn:
            await checkpoints_q.start_attempt(conn, fence=fence - 1, **args)
    assert await _counts(db, run_id) == before

    async with db.autocommit() as conn:
        await checkpoints_q.start_attempt(conn, fence=fence, **args)
    n_steps, n_events, rows = await _counts(db, run_id)
    assert (n_steps, n_events, rows) == (1, before[1] + 1, [("running", fence)])

    # Another worker claims the run (its lease expired, say): the fence moves on.
    async with db.write() as conn:
        await conn.execute(runs.update().where(runs.c.run_id == run_id).values(fence=fence + 1))
    with pytest.raises(LeaseLost):
        async with db.autocommit() as conn:
            await checkpoints_q.record_success(
                conn, run_id=run_id, fence=fence, step_id="s", output="1", event_data="{}"
            )
    assert await _counts(db, run_id) == (1, before[1] + 1, [("running", fence)])

    async with db.autocommit() as conn:
        await checkpoints_q.record_success(
            conn, run_id=run_id, fence=fence + 1, step_id="s", output="1", event_data="{}"
        )
    assert await _counts(db, run_id) == (1, before[1] + 2, [("succeeded", fence + 1)])
