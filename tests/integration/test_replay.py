"""Replay from the journal on both databases: journaled steps never re-run; divergence fails."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel
from sqlalchemy import insert, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import runs, steps
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import WorkflowContext, workflow
from app.worker.worker import Worker
from tests.helpers import wait_for

TENANT = "replay"
executed: list[str] = []


class Empty(BaseModel):
    pass


class Total(BaseModel):
    value: int


def load() -> Total:
    executed.append("load")
    return Total(value=1)


def bump(t: Total) -> Total:
    executed.append("bump")
    return Total(value=t.value + 1)


@workflow("replay-flow")
async def replay_flow(ctx: WorkflowContext, _: Empty) -> int:
    first = await ctx.step(load)
    # A replayed result is re-validated into the annotated type, exactly like a fresh one.
    assert isinstance(first, Total)
    second = await ctx.step(bump, first)
    return second.value


REGISTRY = Registry([replay_flow])


async def _seed_and_run(settings: Settings, db: Database, journal: list[dict[str, Any]]) -> Any:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    row, _ = await Submitter(db, settings).submit(
        SubmitRequest(workflow="replay-flow", input={}), tenant_id=TENANT, subject="t"
    )
    run_id = row["run_id"]
    now = row["created_at"]
    async with db.write() as conn:
        # As an earlier execution leaves them: claimed once (attempt and fence 1), its
        # steps journaled under that fence. (A run never claimed has no journal, and the
        # worker does not read one for it.)
        await conn.execute(runs.update().where(runs.c.run_id == run_id).values(attempt=1, fence=1))
        for entry in journal:
            await conn.execute(
                insert(steps).values(
                    run_id=run_id,
                    tenant_id=TENANT,
                    kind="step",
                    attempt=1,
                    max_attempts=3,
                    created_at=now,
                    started_at=now,
                    finished_at=now,
                    fence=1,
                    **entry,
                )
            )
    worker = Worker(settings, db, REGISTRY, concurrency=2)
    task = asyncio.create_task(worker.run())

    async def done() -> Any:
        async with db.read() as conn:
            r = await runs_q.get_run(conn, TENANT, run_id)
        return r if r["status"] in {"completed", "failed"} else None

    try:
        return await wait_for(done, what="run finished")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def test_journaled_step_is_not_rerun(settings: Settings, db: Database) -> None:
    executed.clear()
    journal = [
        {
            "step_id": "load",
            "seq": 0,
            "name": "load",
            "status": "succeeded",
            "output": '{"value":41}',
        },
    ]
    row = await _seed_and_run(settings, db, journal)
    assert (row["status"], row["output"]) == ("completed", "42")
    assert executed == ["bump"]  # load came from the journal


async def test_divergent_journal_fails_with_nondeterminism(
    settings: Settings, db: Database
) -> None:
    executed.clear()
    journal = [
        {
            "step_id": "charge_card",
            "seq": 0,
            "name": "charge_card",
            "status": "succeeded",
            "output": '"ch_1"',
        },
    ]
    row = await _seed_and_run(settings, db, journal)
    assert (row["status"], row["reason"]) == ("failed", "failure_nondeterminism")
    assert "charge_card" in row["error"]
    assert executed == []
    async with db.read() as conn:
        kept = (await conn.execute(select(steps.c.step_id))).scalars().all()
    assert kept == ["charge_card"]  # the journal is not corrupted


async def test_same_step_id_different_function_fails(settings: Settings, db: Database) -> None:
    executed.clear()
    journal = [
        {
            "step_id": "load",
            "seq": 0,
            "name": "old_module.load",
            "status": "succeeded",
            "output": '{"value":1}',
        },
    ]
    row = await _seed_and_run(settings, db, journal)
    assert (row["status"], row["reason"]) == ("failed", "failure_nondeterminism")
    assert executed == []
