"""Pause / unpause and rerun from a step with real workers, on both databases.

Claim exclusion while paused is checked deterministically by running the claim query
itself (a paused, due run must not come back), not by waiting and hoping.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, update

from app.core.errors import (
    IdempotencyConflict,
    InvalidInput,
    InvalidState,
    RunFinished,
    RunNotFound,
)
from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import events, workflow_definitions
from app.engine import control, rerun
from app.engine import journal as journal_module
from app.engine.registry import Registry
from app.engine.rerun import check_prefix
from app.sdk import Permanent, RetryPolicy, WorkflowContext, workflow
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "pause"
OTHER = "pause-other"
executed: Counter[str] = Counter()
gates: dict[str, asyncio.Event] = {}
fail_third = {"on": True}


class Job(BaseModel):
    key: str


async def slow_first(key: str) -> str:
    executed[f"{key}:first"] += 1
    gates[f"{key}:started"].set()
    await gates[f"{key}:go"].wait()
    return "first done"


def second(key: str) -> str:
    executed[f"{key}:second"] += 1
    return "second done"


def third(key: str) -> str:
    executed[f"{key}:third"] += 1
    if fail_third["on"]:
        raise RuntimeError("bug in step three")
    return "third done"


@workflow("p-two-steps")
async def two_steps(ctx: WorkflowContext, job: Job) -> list[str]:
    return [await ctx.step(slow_first, job.key), await ctx.step(second, job.key)]


@workflow("p-timer")
async def timer_flow(ctx: WorkflowContext, job: Job) -> str:
    await ctx.sleep(0.5)
    return await ctx.step(second, job.key)


@workflow("p-signal")
async def signal_flow(ctx: WorkflowContext, job: Job) -> Any:
    got = await ctx.signal("go")
    await ctx.step(second, job.key)
    return got


@workflow("r-chain")
async def chain(ctx: WorkflowContext, job: Job) -> list[str]:
    one = await ctx.step(second, f"{job.key}-1")
    two = await ctx.step(second, f"{job.key}-2")
    three = await ctx.step(third, job.key, retry=RetryPolicy(max_attempts=1))
    return [one, two, three]


def book(what: str) -> str:
    return f"{what}-booking"


def unbook(booking: str) -> None:
    executed[f"undo:{booking}"] += 1


def decline() -> None:
    raise Permanent(ValueError("card declined"))


@workflow("r-saga")
async def saga(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(book, f"{job.key}-flight", name="flight", compensate=unbook)
    await ctx.step(decline, name="charge")


REGISTRY = Registry([two_steps, timer_flow, signal_flow, chain, saga])


@pytest.fixture
def psettings(database_url: str, tmp_path: Path) -> Settings:
    # Timers release the run, so a timer falls due while the run is not leased.
    return make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)


def key() -> str:
    return uuid.uuid4().hex[:10]


async def submit(db: Database, settings: Settings, name: str, k: str) -> uuid.UUID:
    return await support.submit(db, settings, REGISTRY, TENANT, name, key=k)


async def row_of(db: Database, run_id: uuid.UUID) -> Any:
    async with db.read() as conn:
        return await runs_q.get_run(conn, TENANT, run_id)


async def claimable(db: Database, run_id: uuid.UUID) -> bool:
    """Whether the claim query would lease the run now (rolled back: nothing claimed)."""
    async with db.engine.connect() as conn:
        trans = await conn.begin()
        try:
            rows = await runs_q.claim_runs(
                conn,
                worker_id="probe",
                definition_keys=REGISTRY.keys,
                limit=100,
                lease_ttl=30,
            )
        finally:
            await trans.rollback()
    return any(r["run_id"] == run_id for r in rows)


async def kinds(db: Database, run_id: uuid.UUID) -> list[str]:
    async with db.read() as conn:
        found = await conn.execute(
            select(events.c.kind).where(events.c.run_id == run_id).order_by(events.c.event_id)
        )
        return list(found.scalars())


async def due_passed(db: Database, run_id: uuid.UUID) -> bool:
    async with db.read() as conn:
        now = await fetch_now(conn, db.dialect)
        row = await runs_q.get_run(conn, TENANT, run_id)
    return row["available_at"] is not None and row["available_at"] <= now


@pytest.mark.parametrize("fresh", [True, False], ids=["news", "stale"])
async def test_pause_points_read_paused_at_only_without_fresh_news(
    psettings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch, fresh: bool
) -> None:
    """A pause point takes the claim's or the last step result's reading of ``paused_at``.

    docs/adr/0044-pause-news.md: on PostgreSQL the claim (which never takes a paused
    run) and each step's result statement report the pause, so a run's pause points
    read nothing while that news is younger than ``PAUSE_NEWS_SECONDS``; older news is
    read again, one primary-key read per pause point.
    """
    if db.dialect != "postgresql":
        pytest.skip("the step results' statements read paused_at on PostgreSQL only")
    monkeypatch.setattr(journal_module, "PAUSE_NEWS_SECONDS", 3600.0 if fresh else 0.0)
    k = key()
    gates[f"{k}:started"] = asyncio.Event()
    gates[f"{k}:go"] = asyncio.Event()
    gates[f"{k}:go"].set()
    reads: list[tuple[str, Any]] = []
    stop = support.record_statements(db, re.compile(r"^SELECT runs\.paused_at"), reads)
    try:
        run_id = await submit(db, psettings, "p-two-steps", k)
        async with support.workers(psettings, db, REGISTRY):
            await support.reach(db, TENANT, run_id, "completed")
    finally:
        stop()
    # Two pause points: before each step.
    assert len(reads) == (0 if fresh else 2), reads


async def test_pause_mid_step_finishes_attempt_then_releases(
    psettings: Settings, db: Database
) -> None:
    k = key()
    gates[f"{k}:started"] = asyncio.Event()
    gates[f"{k}:go"] = asyncio.Event()
    run_id = await submit(db, psettings, "p-two-steps", k)
    async with support.workers(psettings, db, REGISTRY):
        await asyncio.wait_for(gates[f"{k}:started"].wait(), 30)
        paused, changed = await control.pause(
            db, tenant_id=TENANT, run_id=run_id, actor="ops", reason="bank adapter down"
        )
        assert changed
        assert paused["status"] == "running"
        assert (paused["paused_by"], paused["pause_reason"]) == ("ops", "bank adapter down")
        assert paused["paused_at"] is not None
        gates[f"{k}:go"].set()  # the attempt in flight finishes and checkpoints

        async def released() -> Any:
            row = await row_of(db, run_id)
            return row if row["lease_owner"] is None and row["status"] == "queued" else None

        row = await wait_for(released, timeout=30, what="paused run released")
        assert row["waiting_kind"] == "pause"
        async with db.read() as conn:
            journal = {
                s["step_id"]: s["status"]
                for s in await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
            }
        assert journal == {"slow_first": "succeeded"}
        assert executed[f"{k}:second"] == 0
        # Due (available_at now) yet never claimed while paused.
        assert await due_passed(db, run_id)
        assert not await claimable(db, run_id)
        again, changed = await control.pause(
            db, tenant_id=TENANT, run_id=run_id, actor="x", reason="y"
        )
        assert again["paused_by"] == "ops" and not changed  # the first pause is kept
        await control.unpause(db, tenant_id=TENANT, run_id=run_id, actor="ops")
        done = await support.reach(db, TENANT, run_id, "completed")
    assert done["paused_at"] is None
    assert executed[f"{k}:first"] == 1 and executed[f"{k}:second"] == 1
    timeline = await kinds(db, run_id)
    assert timeline.count("run_paused") == 1 and timeline.count("run_unpaused") == 1
    assert timeline.index("run_paused") < timeline.index("run_released")
    started = [i for i, kind in enumerate(timeline) if kind == "step_started"]
    assert len(started) == 2 and timeline.index("run_unpaused") < started[1]


async def test_no_step_taken_while_paused_and_timer_fires_on_unpause(
    psettings: Settings, db: Database
) -> None:
    k = key()
    run_id = await submit(db, psettings, "p-timer", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_timer")
        await control.pause(db, tenant_id=TENANT, run_id=run_id, actor="ops", reason=None)
        await wait_for(lambda: due_passed(db, run_id), timeout=30, what="timer due")
        assert not await claimable(db, run_id)
        row = await row_of(db, run_id)
        assert row["status"] == "waiting_timer" and executed[f"{k}:second"] == 0
        assert "timer_fired" not in await kinds(db, run_id)
        await control.unpause(db, tenant_id=TENANT, run_id=run_id, actor="ops")
        await support.reach(db, TENANT, run_id, "completed")
    timeline = await kinds(db, run_id)
    assert timeline.index("run_unpaused") < timeline.index("timer_fired")
    assert executed[f"{k}:second"] == 1


async def test_signal_sent_while_paused_is_delivered_after_unpause(
    psettings: Settings, db: Database
) -> None:
    k = key()
    run_id = await submit(db, psettings, "p-signal", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
        await control.pause(db, tenant_id=TENANT, run_id=run_id, actor="ops", reason="hold")
        await control.send_signal(
            db, psettings, tenant_id=TENANT, run_id=run_id, name="go", payload={"n": 7}, actor="e"
        )
        # Accepted and stored; the run is due but not claimable while paused.
        assert await due_passed(db, run_id)
        assert not await claimable(db, run_id)
        assert (await row_of(db, run_id))["status"] == "waiting_signal"
        await control.unpause(db, tenant_id=TENANT, run_id=run_id, actor="ops")
        done = await support.reach(db, TENANT, run_id, "completed")
    assert json.loads(done["output"]) == {"n": 7}
    timeline = await kinds(db, run_id)
    assert timeline.index("run_unpaused") < timeline.index("signal_consumed")


async def test_cancel_of_paused_run_and_errors(psettings: Settings, db: Database) -> None:
    k = key()
    run_id = await submit(db, psettings, "p-signal", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
        with pytest.raises(InvalidState, match="not paused"):
            await control.unpause(db, tenant_id=TENANT, run_id=run_id, actor="ops")
        await control.pause(db, tenant_id=TENANT, run_id=run_id, actor="ops", reason=None)
        with pytest.raises(RunNotFound):  # another tenant's run does not exist for it
            await control.pause(db, tenant_id=OTHER, run_id=run_id, actor="x", reason=None)
        with pytest.raises(RunNotFound):
            await control.unpause(db, tenant_id=OTHER, run_id=run_id, actor="x")
        assert (await row_of(db, run_id))["paused_by"] == "ops"
        cancelled = await control.cancel(
            db, tenant_id=TENANT, run_id=run_id, actor="ops", reason="no longer needed"
        )
        assert cancelled["status"] == "cancelled" and cancelled["paused_at"] is None
        with pytest.raises(RunFinished, match="already finished"):
            await control.pause(db, tenant_id=TENANT, run_id=run_id, actor="ops", reason=None)
        with pytest.raises(RunFinished):
            await control.unpause(db, tenant_id=TENANT, run_id=run_id, actor="ops")
    assert executed[f"{k}:second"] == 0


async def test_pause_over_http(psettings: Settings, db: Database) -> None:
    k = key()
    run_id = await submit(db, psettings, "p-signal", k)
    async with support.api_client(psettings, db, OTHER) as other:
        missing = await other.post(f"/runs/{run_id}/pause", json={"reason": "x"})
        assert missing.status_code == 404
    async with support.api_client(psettings, db, TENANT, subject="alice") as client:
        bad = await client.post(f"/runs/{run_id}/pause", json={"reason": 5})
        assert bad.status_code == 422
        not_paused = await client.post(f"/runs/{run_id}/unpause")
        assert not_paused.status_code == 409 and "not paused" in not_paused.json()["detail"]
        got = await client.post(f"/runs/{run_id}/pause", json={"reason": "maintenance"})
        assert got.status_code == 200
        body = got.json()
        assert (body["paused_by"], body["pause_reason"]) == ("alice", "maintenance")
        view = (await client.get(f"/runs/{run_id}")).json()
        assert view["paused_at"] is not None and view["status"] == "queued"
        report = (await client.get(f"/runs/{run_id}/report")).json()
        assert report["run"]["pause_reason"] == "maintenance"
        text = (await client.get(f"/runs/{run_id}/report.txt")).text
        assert "paused" in text and "by alice: maintenance" in text
        listed = (await client.get("/runs", params={"workflow": "p-signal"})).json()["items"]
        assert any(r["run_id"] == str(run_id) and r["paused_by"] == "alice" for r in listed)
        un = await client.post(f"/runs/{run_id}/unpause")
        assert un.status_code == 200 and un.json()["paused_at"] is None
        await client.post(f"/runs/{run_id}/cancel", json={})
        finished = await client.post(f"/runs/{run_id}/pause", json={})
        assert finished.status_code == 409 and "already finished" in finished.json()["detail"]


async def test_rerun_replays_prefix_without_reexecuting(psettings: Settings, db: Database) -> None:
    k = key()
    fail_third["on"] = True
    run_id = await submit(db, psettings, "r-chain", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "failed")
        assert executed[f"{k}-1:second"] == 1 and executed[f"{k}:third"] == 1
        fail_third["on"] = False
        with pytest.raises(InvalidInput, match="not a journaled step"):
            await rerun.rerun(
                db,
                psettings,
                tenant_id=TENANT,
                run_id=run_id,
                from_step="nope",
                subject="ops",
                api_key_id=None,
            )
        with pytest.raises(RunNotFound):
            await rerun.rerun(
                db,
                psettings,
                tenant_id=OTHER,
                run_id=run_id,
                from_step="third",
                subject="ops",
                api_key_id=None,
            )
        new, created = await rerun.rerun(
            db,
            psettings,
            tenant_id=TENANT,
            run_id=run_id,
            from_step="third",
            subject="ops",
            api_key_id=None,
            idempotency_key=f"rerun-{k}",
        )
        assert created and new["rerun_of"] == run_id and new["rerun_from_step"] == "third"
        same, again = await rerun.rerun(
            db,
            psettings,
            tenant_id=TENANT,
            run_id=run_id,
            from_step="third",
            subject="ops",
            api_key_id=None,
            idempotency_key=f"rerun-{k}",
        )
        assert same["run_id"] == new["run_id"] and not again
        with pytest.raises(IdempotencyConflict):
            await rerun.rerun(
                db,
                psettings,
                tenant_id=TENANT,
                run_id=run_id,
                from_step="second#2",
                subject="ops",
                api_key_id=None,
                idempotency_key=f"rerun-{k}",
            )
        done = await support.reach(db, TENANT, new["run_id"], "completed")
    assert json.loads(done["output"]) == ["second done", "second done", "third done"]
    # The prefix replayed: steps one and two ran once in all, step three twice.
    assert executed[f"{k}-1:second"] == 1 and executed[f"{k}-2:second"] == 1
    assert executed[f"{k}:third"] == 2
    assert "run_rerun" in await kinds(db, run_id)


async def test_rerun_refusals(psettings: Settings, db: Database) -> None:
    k = key()
    run_id = await submit(db, psettings, "p-signal", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
        with pytest.raises(InvalidState, match="once it has finished"):
            await rerun.rerun(
                db,
                psettings,
                tenant_id=TENANT,
                run_id=run_id,
                from_step="go",
                subject="ops",
                api_key_id=None,
            )
        await control.send_signal(
            db, psettings, tenant_id=TENANT, run_id=run_id, name="go", payload=1, actor="e"
        )
        await support.reach(db, TENANT, run_id, "completed")
    async with support.api_client(psettings, db, TENANT) as client:
        bad = await client.post(f"/runs/{run_id}/rerun", json={"from_step": "missing"})
        assert bad.status_code == 422 and "not a journaled step" in bad.json()["detail"]
        ok = await client.post(f"/runs/{run_id}/rerun", json={"from_step": "second"})
        assert ok.status_code == 201 and ok.json()["rerun_of"] == str(run_id)
        assert ok.headers["Location"] == f"/runs/{ok.json()['run_id']}"
        async with db.write() as conn:
            await conn.execute(
                update(workflow_definitions)
                .where(workflow_definitions.c.name == "p-signal")
                .values(version="gone")
            )
        gone = await client.post(f"/runs/{run_id}/rerun", json={"from_step": "second"})
        assert gone.status_code == 409 and "no longer registered" in gone.json()["detail"]


def _entry(step_id: str, seq: int, kind: str = "step", status: str = "succeeded") -> Any:
    return {"step_id": step_id, "seq": seq, "kind": kind, "status": status}


def test_check_prefix_refuses_what_cannot_replay() -> None:
    journal = [
        _entry("a", 0),
        _entry("patch:x", 1, kind="patch"),
        _entry("b", 2, status="compensated"),
        _entry("c", 3),
        _entry("b__compensate", 4, kind="compensation"),
    ]
    assert check_prefix(journal, "a") == 0
    assert check_prefix(journal, "b") == 2
    with pytest.raises(InvalidState, match=r"'b'.*'compensated'"):
        check_prefix(journal, "c")
    with pytest.raises(InvalidState, match="is a compensation"):
        check_prefix(journal, "b__compensate")
    with pytest.raises(InvalidInput):
        check_prefix(journal, "patch:x")


async def test_rerun_refused_when_the_prefix_was_undone(psettings: Settings, db: Database) -> None:
    k = key()
    run_id = await submit(db, psettings, "r-saga", k)
    async with support.workers(psettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "compensated")
    assert executed[f"undo:{k}-flight-booking"] == 1
    # The flight was undone: its result no longer stands, so nothing after it may replay it.
    with pytest.raises(InvalidState, match=r"'flight'.*'compensated'"):
        await rerun.rerun(
            db,
            psettings,
            tenant_id=TENANT,
            run_id=run_id,
            from_step="charge",
            subject="ops",
            api_key_id=None,
        )
    async with support.api_client(psettings, db, TENANT) as client:
        undo_step = await client.post(
            f"/runs/{run_id}/rerun", json={"from_step": "flight__compensate"}
        )
        assert undo_step.status_code == 409 and "is a compensation" in undo_step.json()["detail"]
        # From the first step nothing is replayed: allowed, and it runs (and undoes) anew.
        fresh = await client.post(f"/runs/{run_id}/rerun", json={"from_step": "flight"})
        assert fresh.status_code == 201, fresh.text
