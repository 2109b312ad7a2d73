"""Child runs: fan-out joined across two workers, detached children, cancel cascades."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select

from app.core import json
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import runs
from app.engine import control
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration import support

TENANT = "family"


class N(BaseModel):
    n: int


def square(n: int) -> int:
    return n * n


@workflow("kid-square")
async def kid(ctx: WorkflowContext, x: N) -> int:
    return await ctx.step(square, x.n)


@workflow("kid-waits")
async def kid_waits(ctx: WorkflowContext, x: N) -> None:
    await ctx.signal("never")


@workflow("parent-fanout")
async def fanout(ctx: WorkflowContext, x: N) -> dict[str, Any]:
    results = await asyncio.gather(*(ctx.child(kid, N(n=i)) for i in range(x.n)))
    detached = await ctx.start_child("kid-square", {"n": 100})
    return {"sum": sum(results), "detached": detached}


@workflow("parent-waits")
async def parent_waits(ctx: WorkflowContext, x: N) -> None:
    await ctx.child("kid-waits", {"n": 1})


REGISTRY = Registry([kid, kid_waits, fanout, parent_waits])


def two_workers(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, count=2)


async def submit(db: Database, settings: Settings, name: str, **inp: Any) -> Any:
    return await support.submit(db, settings, REGISTRY, TENANT, name, **inp)


async def reach(db: Database, run_id: Any, *statuses: str) -> Any:
    return await support.reach(db, TENANT, run_id, *statuses, timeout=60)


async def test_fan_out_twenty_children_across_two_workers(settings: Settings, db: Database) -> None:
    parent = await submit(db, settings, "parent-fanout", n=20)
    async with two_workers(settings, db) as workers:
        row = await reach(db, parent, "completed", "failed")
    assert row["status"] == "completed", row["error"]
    out = json.loads(row["output"])
    assert out["sum"] == sum(i * i for i in range(20))
    async with db.read() as conn:
        kids = (
            await conn.execute(
                select(runs.c.status, func.count())
                .where(runs.c.parent_run_id == parent)
                .group_by(runs.c.status)
            )
        ).all()
        detached = await runs_q.get_run(conn, TENANT, uuid.UUID(out["detached"]))
    assert {k[0]: k[1] for k in kids}.get("completed", 0) >= 20
    assert detached["parent_run_id"] == parent
    # Both workers did some of the work.
    assert all(w.stats.claimed > 0 for w in workers)


async def test_cancelling_a_parent_cancels_its_joined_child(
    settings: Settings, db: Database
) -> None:
    parent = await submit(db, settings, "parent-waits", n=1)
    async with two_workers(settings, db):
        await reach(db, parent, "waiting_child")
        async with db.read() as conn:
            child_id = (
                await conn.execute(select(runs.c.run_id).where(runs.c.parent_run_id == parent))
            ).scalar_one()
        await reach(db, child_id, "waiting_signal")
        await control.cancel(db, tenant_id=TENANT, run_id=parent, actor="op", reason="stop")
        assert (await reach(db, parent, "cancelled"))["reason"] == "canceled_by_request"
        assert (await reach(db, child_id, "cancelled"))["reason"] == "canceled_by_request"
