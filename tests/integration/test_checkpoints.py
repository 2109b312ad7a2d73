"""Single-statement writes (PostgreSQL): checkpoints, a run's completion, a submission.

The start and the result of a plain step, and the completion of a run with no slot and
no parent, are each one statement of data-modifying CTEs in autocommit
(app/db/queries/checkpoints.py). These tests pin the contract the multi-statement path
had: with the current fence, the rows and their event are written together; with a
stale fence (a claim took the run over), ``LeaseLost`` is raised and nothing changes.
A submission without a concurrency key is one statement too (app/db/queries/submits.py):
the run, its event and the NOTIFY together, and nothing at all for an idempotent replay.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
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
from app.engine.submit import SubmitRequest, Submitter
from app.engine.wakeup import NOTIFY_CHANNEL
from app.sdk import WorkflowContext, workflow
from tests.conftest import WITH_PGBOUNCER
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


@WITH_PGBOUNCER
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
        "tenant_id": TENANT,
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
                conn,
                run_id=run_id,
                tenant_id=TENANT,
                fence=fence,
                step_id="s",
                output="1",
                event_data="{}",
            )
    assert await _counts(db, run_id) == (1, before[1] + 1, [("running", fence)])

    async with db.autocommit() as conn:
        await checkpoints_q.record_success(
            conn,
            run_id=run_id,
            tenant_id=TENANT,
            fence=fence + 1,
            step_id="s",
            output="1",
            event_data="{}",
        )
    assert await _counts(db, run_id) == (1, before[1] + 2, [("succeeded", fence + 1)])


@WITH_PGBOUNCER
async def test_stale_fence_does_not_complete(settings: Settings, db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("single-statement completion is the PostgreSQL path")
    registry = Registry([plain])
    run_id = await submit(db, settings, registry, TENANT, "cp-plain")
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn, worker_id="w1", definition_keys=[("cp-plain", "1")], limit=1, lease_ttl=30
        )
    fence = int(claimed["fence"])
    before = await _counts(db, run_id)
    with pytest.raises(LeaseLost):
        async with db.autocommit() as conn:
            await checkpoints_q.complete_run(
                conn, run_id=run_id, tenant_id=TENANT, fence=fence - 1, output="1"
            )
    async with db.read() as conn:
        row = await runs_q.get_run(conn, TENANT, run_id)
    assert row is not None and row["status"] == "running" and row["output"] is None
    assert await _counts(db, run_id) == before

    async with db.autocommit() as conn:
        await checkpoints_q.complete_run(
            conn, run_id=run_id, tenant_id=TENANT, fence=fence, output='{"n":1}'
        )
    async with db.read() as conn:
        row = await runs_q.get_run(conn, TENANT, run_id)
        kinds = (
            await conn.execute(
                select(events.c.kind).where(events.c.run_id == run_id).order_by(events.c.event_id)
            )
        ).scalars()
        last_kind = list(kinds)[-1]
    assert row is not None
    assert (row["status"], row["reason"], row["output"]) == ("completed", "succeeded", '{"n":1}')
    assert row["lease_owner"] is None and row["available_at"] is None
    assert row["finished_at"] is not None
    assert last_kind == "run_completed"
    assert await _counts(db, run_id) == (0, before[1] + 1, [])

    # Completed is not a leased status: the same fence cannot complete it twice.
    with pytest.raises(LeaseLost):
        async with db.autocommit() as conn:
            await checkpoints_q.complete_run(
                conn, run_id=run_id, tenant_id=TENANT, fence=fence, output="2"
            )


@WITH_PGBOUNCER
async def test_submit_statement_writes_run_event_then_wakes(
    settings: Settings, db: Database
) -> None:
    if db.dialect != "postgresql":
        pytest.skip("the single-statement submission is the PostgreSQL path")
    async with db.write() as conn:
        await Registry([plain]).register(conn)
    heard: asyncio.Queue[str] = asyncio.Queue()
    assert settings.listen_url is not None  # a direct connection, also behind PgBouncer
    listener = await asyncpg.connect(settings.listen_url.replace("+asyncpg", ""))
    await listener.add_listener(NOTIFY_CHANNEL, lambda *args: heard.put_nowait(args[3]))
    try:
        submitter = Submitter(db, settings)
        request = SubmitRequest(
            workflow="cp-plain", input={}, idempotency_key="k-1", delay=30.0, priority=7
        )
        row, created = await submitter.submit(request, tenant_id=TENANT, subject="alice")
        assert created
        assert await asyncio.wait_for(heard.get(), 10) == ""  # workers are woken

        assert (row["status"], row["workflow"], row["version"]) == ("queued", "cp-plain", "1")
        assert (row["created_by"], row["priority"], row["access"]) == ("alice", 7, "tenant")
        assert row["idempotency_key"] == "k-1" and row["request_hash"] == request.fingerprint()
        assert row["concurrency_key"] is None and row["fence"] == 0 and row["attempt"] == 0
        # The delay is on the database clock, relative to the same statement's now().
        assert (row["available_at"] - row["created_at"]).total_seconds() == 30.0
        assert row["created_at"].tzinfo is not None
        async with db.read() as conn:
            stored = await runs_q.get_run(conn, TENANT, row["run_id"])
            timeline = (
                await conn.execute(select(events).where(events.c.run_id == row["run_id"]))
            ).all()
        assert stored is not None and dict(stored) == dict(row)
        assert [(e.kind, e.actor, e.tenant_id) for e in timeline] == [
            ("run_submitted", "alice", TENANT)
        ]
        assert timeline[0].data == '{"workflow":"cp-plain","version":"1","parent_run_id":null}'
        assert timeline[0].at == row["created_at"]

        # An identical retry is the same run: no second row, event or wake-up.
        again, created = await submitter.submit(request, tenant_id=TENANT, subject="alice")
        assert not created and again["run_id"] == row["run_id"]
        other, created = await submitter.submit(
            SubmitRequest(workflow="cp-plain", input={}), tenant_id=TENANT, subject="alice"
        )
        assert created and other["available_at"] == other["created_at"]
        assert db.wakeups is not None
        await db.wakeups.flush()  # its wake-up is sent after commit, by the coalescer
        # Notifications arrive in commit order (PostgreSQL NOTIFY): everything heard
        # before our own marker, sent after the three submissions, is theirs.
        await listener.execute("SELECT pg_notify($1, 'marker')", NOTIFY_CHANNEL)
        after_first: list[str] = []
        while (payload := await asyncio.wait_for(heard.get(), 10)) != "marker":
            after_first.append(payload)
        assert after_first == [""]  # the third submission's only
        async with db.read() as conn:
            n_runs = (await conn.execute(select(func.count()).select_from(runs))).scalar_one()
            n_events = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        assert (n_runs, n_events) == (2, 2)
    finally:
        await listener.close()
