"""Child runs: fan-out joined across two workers, detached children, cancel cascades."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, text, update

from app.core import json
from app.core.settings import Settings
from app.core.status import RunStatus
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import events, runs, steps
from app.engine import control
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.helpers import wait_for
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


@workflow("parent-parallel-waits")
async def parallel_waits(ctx: WorkflowContext, x: N) -> None:
    # Waits of every kind side by side, with values journaled between them.
    await asyncio.gather(
        ctx.child("kid-waits", {"n": 1}),
        ctx.signal("go"),
        ctx.now(),
        ctx.sleep(3600),
        ctx.approval("ok", group="ops"),
        ctx.uuid(),
        ctx.child("kid-waits", {"n": 2}),
    )


REGISTRY = Registry([kid, kid_waits, fanout, parent_waits, parallel_waits])


def two_workers(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, count=2)


async def submit(db: Database, settings: Settings, name: str, **inp: Any) -> Any:
    return await support.submit(db, settings, REGISTRY, TENANT, name, **inp)


async def reach(db: Database, run_id: Any, *statuses: str) -> Any:
    return await support.reach(db, TENANT, run_id, *statuses, timeout=60)


async def test_parallel_waits_are_all_journaled_by_the_execution_that_reaches_them(
    settings: Settings, db: Database
) -> None:
    # The first branch to park must not release the run while the other branches are
    # still writing their journal entries (or creating their child): otherwise the run
    # waits on one thing per execution, and parallel children start one after another.
    parent = await submit(db, settings, "parent-parallel-waits", n=0)
    async with two_workers(settings, db):
        await reach(db, parent, "waiting_timer")
        async with db.read() as conn:
            kinds = sorted(
                (await conn.execute(select(steps.c.kind).where(steps.c.run_id == parent)))
                .scalars()
                .all()
            )
            claims = (
                await conn.execute(
                    select(func.count()).where(
                        events.c.run_id == parent, events.c.kind == "run_claimed"
                    )
                )
            ).scalar_one()
            children = (
                await conn.execute(select(func.count()).where(runs.c.parent_run_id == parent))
            ).scalar_one()
    assert kinds == ["approval", "child", "child", "signal", "timer", "value", "value"]
    assert (claims, children) == (1, 2)


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


@pytest.mark.parametrize("first", ["child-ends-first", "parent-releases-first"])
async def test_a_child_ending_while_its_parent_is_being_released_always_wakes_it(
    settings: Settings, db: Database, first: str
) -> None:
    # The two transactions a worker runs, interleaved statement by statement on two
    # connections: a child's finalize (status, then the parent's wake-up) and its
    # parent's release (status, then the wake check). Whichever order the statements
    # take, the parent ends due; a parent left waiting here would wait forever.
    if db.dialect != "postgresql":
        pytest.skip("SQLite runs one writer at a time: the statements cannot interleave")
    parent = await submit(db, settings, "parent-waits", n=1)
    child = await submit(db, settings, "kid-waits", n=1)
    async with db.write() as conn:
        held = {"status": "running", "lease_owner": "w", "fence": 1, "available_at": None}
        await conn.execute(update(runs).where(runs.c.run_id == parent).values(**held))
        await conn.execute(
            update(runs).where(runs.c.run_id == child).values(**held, parent_run_id=parent)
        )

    async def release_parent() -> None:
        async with db.engine.connect() as conn, conn.begin():
            await runs_q.release_run(
                conn,
                run_id=parent,
                tenant_id=TENANT,
                fence=1,
                status=RunStatus.WAITING_CHILD,
                delay=None,
            )
            row = await runs_q.get_run_any_tenant(conn, child)
            assert row is not None
            if RunStatus(row["status"]).is_terminal:
                await runs_q.make_due(conn, run_id=parent, tenant_id=TENANT)

    async with db.engine.connect() as child_conn:
        await child_conn.begin()
        await child_conn.execute(
            update(runs).where(runs.c.run_id == child).values(status="completed")
        )
        if first == "child-ends-first":
            await runs_q.wake_parent(child_conn, parent_run_id=parent, tenant_id=TENANT)
            releasing = asyncio.create_task(release_parent())
            # The release must wait for the child's transaction (it holds the parent's
            # row) or, with no lock taken, finish having missed the child.
            await wait_for(
                lambda: _blocked_or_done(db, releasing), timeout=30, what="release to block"
            )
            await child_conn.commit()
            await releasing
        else:
            await release_parent()
            await runs_q.wake_parent(child_conn, parent_run_id=parent, tenant_id=TENANT)
            await child_conn.commit()
    async with db.read() as conn:
        row = await runs_q.get_run_any_tenant(conn, parent)
    assert row is not None
    assert (row["status"], row["available_at"] is not None) == ("waiting_child", True)


async def _blocked_or_done(db: Database, task: asyncio.Task[None]) -> bool:
    if task.done():
        return True
    async with db.read() as conn:
        waiting = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
        ).scalar_one()
    return bool(waiting)
