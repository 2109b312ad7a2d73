"""Schedules on both databases: racing scheduler loops, overlap policies, catch-up.

Time is skipped with a :class:`VirtualClock`; runs are only inserted (no worker) unless
a test needs them to finish, so "open run" means a queued one.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import RowMapping, func, select

from app.core.errors import InvalidInput, ScheduleNameTaken, ScheduleNotFound, WorkflowNotFound
from app.core.settings import Settings
from app.core.status import RunStatus
from app.db.database import Database
from app.db.queries import schedules as sched_q
from app.db.tables import runs, schedule_fires
from app.engine import control
from app.engine import schedules as engine
from app.engine.registry import Registry
from app.engine.submit import Submitter
from app.sdk import WorkflowContext, workflow
from tests.conftest import make_settings
from tests.integration.support import reach, workers

TENANT = "acme"
T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


class Report(BaseModel):
    day: str = "today"


@workflow("sched-report")
async def report_flow(ctx: WorkflowContext, inp: Report) -> str:
    return inp.day


REGISTRY = Registry([report_flow])


async def _setup(db: Database, settings: Settings) -> Submitter:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    return Submitter(db, settings)


async def _create(db: Database, submitter: Submitter, now: datetime, **spec: Any) -> RowMapping:
    values: dict[str, Any] = {"name": "s", "workflow": "sched-report", "cron": "* * * * *"}
    values.update(spec)
    return await engine.create_schedule(
        db, submitter, engine.ScheduleSpec(**values), tenant_id=TENANT, subject="alice", now=now
    )


async def _fires(db: Database, schedule_id: uuid.UUID) -> list[RowMapping]:
    async with db.read() as conn:
        rows = await sched_q.list_fires(conn, TENANT, schedule_id, before_tick=None, limit=100_000)
    return sorted(rows, key=lambda r: r["tick"])


async def _run_rows(db: Database) -> list[RowMapping]:
    async with db.read() as conn:
        return list((await conn.execute(select(runs).order_by(runs.c.created_at))).mappings())


async def _row(db: Database, schedule_id: uuid.UUID) -> RowMapping:
    async with db.read() as conn:
        return await sched_q.get_schedule(conn, TENANT, schedule_id)


async def test_three_loops_race_one_schedule_for_200_ticks(
    settings: Settings, db: Database, database_url: str, tmp_path: Path
) -> None:
    submitter = await _setup(db, settings)
    sched = await _create(
        db, submitter, T0, catchup_window_seconds=3600, overlap=engine.Overlap.ALLOW_ALL
    )
    clock = engine.VirtualClock(T0)
    # Three loops, each with its own engine (its own connection pool), as three processes.
    dbs = [Database(make_settings(database_url, tmp_path)) for _ in range(3)]
    loops = [
        engine.Scheduler(d, settings, clock=clock, scheduler_id=f"loop-{i}")
        for i, d in enumerate(dbs)
    ]
    try:
        for _ in range(200):
            clock.advance(60)
            await asyncio.gather(*(loop.run_once() for loop in loops))
    finally:
        for d in dbs:
            await d.dispose()
    fires = await _fires(db, sched["schedule_id"])
    all_runs = await _run_rows(db)
    assert len(fires) == 200
    assert len(all_runs) == 200
    assert len({f["tick"] for f in fires}) == 200
    assert {f["run_id"] for f in fires} == {r["run_id"] for r in all_runs}
    # Each run records its schedule and nominal tick (fire row and idempotency key).
    expected = [T0.replace(second=0) + timedelta(minutes=i) for i in range(1, 201)]
    assert [f["tick"] for f in fires] == expected
    for f in fires:
        run = next(r for r in all_runs if r["run_id"] == f["run_id"])
        assert run["idempotency_key"] == f"schedule:{sched['schedule_id']}:{f['tick'].isoformat()}"
        assert run["created_by"] == "alice"
    # The work was shared out or raced: every tick was fired by exactly one loop.
    assert sum(loop.totals.started for loop in loops) == 200
    row = await _row(db, sched["schedule_id"])
    assert row["fired_count"] == 200
    assert row["missed_count"] == 0
    assert row["next_tick_at"] == expected[-1] + timedelta(minutes=1)


async def test_the_unique_key_refuses_a_second_fire_of_a_tick(
    settings: Settings, db: Database
) -> None:
    """Two passes that both believe a tick is due (stale rows, no lock): one run."""
    submitter = await _setup(db, settings)
    sched = await _create(db, submitter, T0, overlap=engine.Overlap.ALLOW_ALL)
    tick = sched["next_tick_at"]
    results = []
    for who in ("a", "b"):
        async with db.write() as conn:
            results.append(
                await engine.fire_tick(
                    conn,
                    submitter,
                    sched,  # the same stale row both times
                    tick,
                    kind=engine.FireKind.CRON,
                    now=tick,
                    fired_by=who,
                    buffer_free=True,
                )
            )
    assert results[0] is not None and results[0].outcome == engine.FireOutcome.STARTED
    assert results[1] is None
    assert len(await _run_rows(db)) == 1
    assert [f["fired_by"] for f in await _fires(db, sched["schedule_id"])] == ["a"]


async def _tick(scheduler: engine.Scheduler, clock: engine.VirtualClock) -> engine.PassResult:
    clock.advance(60)
    return await scheduler.run_once()


async def _status(db: Database, run_id: uuid.UUID | None) -> str:
    assert run_id is not None
    async with db.read() as conn:
        status = (await conn.execute(select(runs.c.status).where(runs.c.run_id == run_id))).scalar()
    return str(status)


@pytest.mark.parametrize("policy", list(engine.Overlap))
async def test_overlap_policy(settings: Settings, db: Database, policy: engine.Overlap) -> None:
    submitter = await _setup(db, settings)
    sched = await _create(db, submitter, T0, overlap=policy)
    sid = sched["schedule_id"]
    clock = engine.VirtualClock(T0)
    scheduler = engine.Scheduler(db, settings, clock=clock)
    for _ in range(3):  # three ticks while the first run stays open (no worker)
        await _tick(scheduler, clock)
    fires = await _fires(db, sid)
    outcomes = [f["outcome"] for f in fires]
    first = fires[0]["run_id"]
    if policy == engine.Overlap.SKIP:
        assert outcomes == ["started", "skipped", "skipped"]
        assert (await _row(db, sid))["skipped_count"] == 2
    elif policy == engine.Overlap.ALLOW_ALL:
        assert outcomes == ["started", "started", "started"]
        assert len(await _run_rows(db)) == 3
    elif policy == engine.Overlap.CANCEL_PREVIOUS:
        assert outcomes == ["started", "started", "started"]
        assert await _status(db, fires[0]["run_id"]) == RunStatus.CANCELLED
        assert await _status(db, fires[1]["run_id"]) == RunStatus.CANCELLED
        assert await _status(db, fires[2]["run_id"]) == RunStatus.QUEUED
    else:
        # One tick is held back, the next is dropped; the held one starts when the open
        # run finishes, recorded under its own nominal tick.
        assert outcomes == ["started", "buffered", "skipped"]
        row = await _row(db, sid)
        assert row["buffered_tick_at"] == fires[1]["tick"]
        await scheduler.run_once()  # the first run is still open: nothing happens
        assert len(await _run_rows(db)) == 1
        await control.cancel(db, tenant_id=TENANT, run_id=first, actor="op", reason=None)
        done = await scheduler.run_once()
        assert done.started == 1
        fires = await _fires(db, sid)
        assert [f["outcome"] for f in fires] == ["started", "started", "skipped"]
        assert fires[1]["run_id"] is not None
        assert await _status(db, fires[1]["run_id"]) == RunStatus.QUEUED
        assert (await _row(db, sid))["buffered_tick_at"] is None


async def test_catch_up_after_a_two_hour_outage(settings: Settings, db: Database) -> None:
    submitter = await _setup(db, settings)
    # Every 10 minutes, a 45-minute catch-up window.
    sched = await _create(
        db,
        submitter,
        T0,
        cron="*/10 * * * *",
        overlap=engine.Overlap.ALLOW_ALL,
        catchup_window_seconds=45 * 60,
    )
    sid = sched["schedule_id"]
    clock = engine.VirtualClock(T0)
    scheduler = engine.Scheduler(db, settings, clock=clock)
    clock.advance(2 * 3600)  # every scheduler is down for two hours
    done = await scheduler.run_once()
    # Ticks 12:10 … 14:00 (12 of them); now is 14:00:30. Inside 45 min: 13:20 … 14:00.
    assert done.started == 5
    assert done.missed == 7
    fires = await _fires(db, sid)
    base = datetime(2026, 6, 1, 13, 20, tzinfo=UTC)
    assert [f["tick"] for f in fires] == [base + timedelta(minutes=10 * i) for i in range(5)]
    row = await _row(db, sid)
    assert (row["fired_count"], row["missed_count"]) == (5, 7)
    assert row["next_tick_at"] == datetime(2026, 6, 1, 14, 10, tzinfo=UTC)
    assert (await scheduler.run_once()).started == 0  # nothing fires twice


async def test_jitter_delays_fires_deterministically(settings: Settings, db: Database) -> None:
    submitter = await _setup(db, settings)
    sched = await _create(db, submitter, T0, jitter_seconds=30)
    tick = sched["next_tick_at"]
    fire_at = sched["next_fire_at"]
    assert tick <= fire_at < tick + timedelta(seconds=30)
    assert fire_at == engine.fire_time(sched, tick)
    clock = engine.VirtualClock(tick)
    scheduler = engine.Scheduler(db, settings, clock=clock)
    if fire_at > tick:
        assert (await scheduler.run_once()).started == 0  # the tick is not due yet
    clock.current = fire_at
    assert (await scheduler.run_once()).started == 1
    assert [f["tick"] for f in await _fires(db, sched["schedule_id"])] == [tick]


async def test_one_off_pause_resume_trigger_and_validation(
    settings: Settings, db: Database
) -> None:
    submitter = await _setup(db, settings)
    once = await _create(db, submitter, T0, name="once", cron=None, at=T0 + timedelta(minutes=5))
    clock = engine.VirtualClock(T0 + timedelta(minutes=5))
    scheduler = engine.Scheduler(db, settings, clock=clock)
    assert (await scheduler.run_once()).started == 1
    row = await _row(db, once["schedule_id"])
    assert row["state"] == "completed" and row["next_tick_at"] is None
    assert (await scheduler.run_once()).started == 0

    hourly = await _create(db, submitter, T0, name="hourly", cron="0 * * * *")
    paused = await engine.set_paused(
        db, tenant_id=TENANT, schedule_id=hourly["schedule_id"], paused=True, now=T0
    )
    assert paused["state"] == "paused"
    clock.current = T0 + timedelta(hours=3)
    assert (await scheduler.run_once()).started == 0
    resumed = await engine.set_paused(
        db, tenant_id=TENANT, schedule_id=hourly["schedule_id"], paused=False, now=clock.current
    )
    # The ticks inside the pause are neither fired nor counted as missed.
    assert resumed["next_tick_at"] == datetime(2026, 6, 1, 16, 0, tzinfo=UTC)
    assert resumed["missed_count"] == 0
    fire = await engine.trigger_now(
        db, submitter, tenant_id=TENANT, schedule_id=hourly["schedule_id"], actor="bob"
    )
    assert fire.outcome == engine.FireOutcome.STARTED and fire.run_id is not None
    fires = await _fires(db, hourly["schedule_id"])
    assert [(f["kind"], f["fired_by"]) for f in fires] == [("manual", "bob")]

    with pytest.raises(ScheduleNameTaken):
        await _create(db, submitter, T0, name="hourly")
    with pytest.raises(InvalidInput, match="5 fields"):
        await _create(db, submitter, T0, name="bad", cron="* * * *")
    with pytest.raises(InvalidInput, match="time zone"):
        await _create(db, submitter, T0, name="bad", timezone="Mars/Olympus")
    with pytest.raises(InvalidInput, match="day-of-month"):
        await _create(db, submitter, T0, name="bad", cron="0 0 30 2 *")
    with pytest.raises(InvalidInput, match="in the past"):
        await _create(db, submitter, T0, name="bad", cron=None, at=T0 - timedelta(hours=1))
    with pytest.raises(InvalidInput):
        await _create(db, submitter, T0, name="bad", input={"day": 5})
    with pytest.raises(WorkflowNotFound):
        await _create(db, submitter, T0, name="bad", workflow="nope")
    with pytest.raises(ScheduleNotFound):
        await engine.set_paused(
            db, tenant_id="other", schedule_id=hourly["schedule_id"], paused=True
        )
    async with db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(schedule_fires))).scalar()
    assert count == 2


async def test_nightly_report_example_runs_from_its_schedule(
    settings: Settings, db: Database
) -> None:
    from examples import nightly_report

    registry = Registry([nightly_report.nightly_report])
    async with db.write() as conn:
        await registry.register(conn)
    submitter = Submitter(db, settings)
    sched = await engine.create_schedule(
        db,
        submitter,
        engine.ScheduleSpec(
            name="nightly-report-eu",
            workflow="nightly-report",
            input={"region": "eu"},
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            catchup_window_seconds=3600,
            jitter_seconds=60,
        ),
        tenant_id=TENANT,
        subject="alice",
        now=datetime(2026, 3, 28, 12, 0, tzinfo=UTC),
    )
    # The spring-forward night: 02:30 does not exist in Berlin, the report runs at 03:00.
    assert sched["next_tick_at"] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    clock = engine.VirtualClock(engine.fire_time(sched, sched["next_tick_at"]))
    async with workers(settings, db, registry):
        done = await engine.Scheduler(db, settings, clock=clock).run_once()
        assert done.started == 1
        (fire,) = await _fires(db, sched["schedule_id"])
        assert fire["run_id"] is not None
        row = await reach(db, TENANT, fire["run_id"], "completed", "failed")
    assert row["status"] == "completed", row["error"]
    assert "eu " in row["output"] and "orders" in row["output"]


async def test_update_recomputes_timing_and_refuses_a_taken_name(
    settings: Settings, db: Database
) -> None:
    submitter = await _setup(db, settings)
    first = await _create(db, submitter, T0, name="first")
    second = await _create(db, submitter, T0, name="second")
    with pytest.raises(ScheduleNameTaken):
        await engine.update_schedule(
            db,
            submitter,
            tenant_id=TENANT,
            schedule_id=second["schedule_id"],
            changes={"name": "first"},
            now=T0,
        )
    changed = await engine.update_schedule(
        db,
        submitter,
        tenant_id=TENANT,
        schedule_id=second["schedule_id"],
        changes={"cron": "0 9 * * *", "timezone": "Europe/Berlin", "overlap": "allow_all"},
        now=T0,
    )
    assert changed["name"] == "second" and changed["overlap"] == "allow_all"
    assert changed["next_tick_at"] == datetime(2026, 6, 2, 7, 0, tzinfo=UTC)  # 09:00 CEST
    once = await engine.update_schedule(
        db,
        submitter,
        tenant_id=TENANT,
        schedule_id=first["schedule_id"],
        changes={"at": T0 + timedelta(hours=1)},
        now=T0,
    )
    assert once["cron"] is None and once["next_tick_at"] == T0 + timedelta(hours=1)
    with pytest.raises(InvalidInput):
        await engine.update_schedule(
            db,
            submitter,
            tenant_id=TENANT,
            schedule_id=first["schedule_id"],
            changes={"state": "active"},
        )


# New York's repeated hour on 2026-11-01: 01:00-02:00 EDT, then 01:00-02:00 EST again.
_SECOND_PASS = datetime(2026, 11, 1, 6, 20, tzinfo=UTC)  # 01:20 EST, the second 01:20


@pytest.mark.parametrize("cron", ["30 1 * * *", "0 1 * * *", "*/30 * * * *", "45 * * * *"])
async def test_created_resumed_or_retimed_in_a_repeated_hour_fires_nothing_early(
    settings: Settings, db: Database, cron: str
) -> None:
    """Starting to count inside the second pass of a repeated hour fires no past tick."""
    submitter = await _setup(db, settings)
    zone = "America/New_York"
    created = await _create(db, submitter, _SECOND_PASS, cron=cron, timezone=zone)
    sid = created["schedule_id"]
    assert created["next_tick_at"] > _SECOND_PASS
    clock = engine.VirtualClock(_SECOND_PASS)
    scheduler = engine.Scheduler(db, settings, clock=clock)
    assert (await scheduler.run_once()) == engine.PassResult()
    # Paused before the repeated hour, resumed in its second pass.
    await engine.set_paused(db, tenant_id=TENANT, schedule_id=sid, paused=True, now=_SECOND_PASS)
    resumed_at = _SECOND_PASS + timedelta(minutes=5)
    resumed = await engine.set_paused(
        db, tenant_id=TENANT, schedule_id=sid, paused=False, now=resumed_at
    )
    assert resumed["next_tick_at"] > resumed_at
    clock.advance(5 * 60)
    assert (await scheduler.run_once()) == engine.PassResult()
    # Re-timed in the second pass (a new zone-local expression).
    retimed_at = resumed_at + timedelta(minutes=1)
    retimed = await engine.update_schedule(
        db,
        submitter,
        tenant_id=TENANT,
        schedule_id=sid,
        changes={"cron": "15 1 * * *"},
        now=retimed_at,
    )
    assert retimed["next_tick_at"] == datetime(2026, 11, 2, 6, 15, tzinfo=UTC)
    clock.advance(60)
    assert (await scheduler.run_once()) == engine.PassResult()
    assert await _fires(db, sid) == []
    row = await _row(db, sid)
    assert (row["fired_count"], row["missed_count"], row["skipped_count"]) == (0, 0, 0)
