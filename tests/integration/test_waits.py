"""Timers, signals, approvals, journaled values, dead-letter requeue: both databases."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from app.core.errors import Forbidden, InvalidState, RunFinished, StepNotFound
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import dead_letters, signals, steps
from app.engine import control
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import ApprovalDecision, WorkflowContext, workflow
from app.worker.worker import Worker
from tests.conftest import WITH_PGBOUNCER, make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "waits"
_ids = itertools.count()
rejections: list[str] = []
flaky_fail = {"on": True}


class Job(BaseModel):
    key: str
    timeout: float = 30.0


@workflow("w-all")
async def all_waits(ctx: WorkflowContext, job: Job) -> dict[str, Any]:
    started = await ctx.now()
    await ctx.sleep(0.3)
    first = await ctx.signal("go", timeout=job.timeout)
    second = await ctx.signal("go", timeout=job.timeout)
    decision = await ctx.approval(
        "boss", group="managers", payload={"key": job.key}, timeout=job.timeout
    )
    token = await ctx.uuid()
    return {
        "signals": [first, second],
        "approved": decision.approved,
        "by": decision.decided_by,
        "started": started.isoformat(),
        "token": str(token),
    }


def note_rejection(decision: ApprovalDecision) -> str:
    rejections.append(",".join(decision.decided_by))
    return "noted"


@workflow("w-reject-handled")
async def reject_handled(ctx: WorkflowContext, job: Job) -> bool:
    decision = await ctx.approval("boss", on_reject=note_rejection, approvals=2)
    return decision.approved


@workflow("w-reject")
async def reject_unhandled(ctx: WorkflowContext, job: Job) -> bool:
    decision = await ctx.approval("boss")
    return decision.approved


def maybe_fail() -> str:
    if flaky_fail["on"]:
        raise RuntimeError("downstream is down")
    return "fine"


@workflow("w-requeue")
async def requeue_flow(ctx: WorkflowContext, job: Job) -> str:
    from app.sdk import RetryPolicy

    return await ctx.step(maybe_fail, retry=RetryPolicy(max_attempts=1))


def second_time_lucky() -> str:
    from app.sdk import current_step

    if current_step().attempt == 1:
        raise ConnectionError("try again in an hour")
    return "lucky"


@workflow("w-backoff")
async def backoff_flow(ctx: WorkflowContext, job: Job) -> str:
    from app.sdk import RetryPolicy

    policy = RetryPolicy(max_attempts=2, backoff="fixed", delay=3600)
    return await ctx.step(second_time_lucky, retry=policy)


REGISTRY = Registry([all_waits, reject_handled, reject_unhandled, requeue_flow, backoff_flow])


@pytest.fixture
def wsettings(database_url: str, tmp_path: Path) -> Settings:
    # Timers longer than 0 s release the run, so the suspend/wake path is exercised.
    return make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)


def worker(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, concurrency=4)


async def submit(db: Database, settings: Settings, name: str, **inp: Any) -> Any:
    return await support.submit(db, settings, REGISTRY, TENANT, name, subject="submitter", **inp)


async def status_is(db: Database, run_id: Any, *statuses: str) -> Any:
    return await support.reach(db, TENANT, run_id, *statuses)


@WITH_PGBOUNCER
async def test_timer_signals_approval_and_values(wsettings: Settings, db: Database) -> None:
    run_id = await submit(db, wsettings, "w-all", key=f"k{next(_ids)}")
    # Sent before the run waits: buffered, consumed in order, each exactly once.
    await control.send_signal(
        db, wsettings, tenant_id=TENANT, run_id=run_id, name="go", payload={"n": 1}, actor="ext"
    )
    await control.send_signal(
        db, wsettings, tenant_id=TENANT, run_id=run_id, name="go", payload={"n": 2}, actor="ext"
    )
    async with worker(wsettings, db):
        row = await status_is(db, run_id, "waiting_approval")
        assert (row["waiting_kind"], row["waiting_name"]) == ("approval", "boss")
        with pytest.raises(StepNotFound):
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=run_id,
                step_id="nope",
                subject="mgr",
                groups=frozenset({"managers"}),
                decision="approve",
                payload=None,
                comment=None,
            )
        with pytest.raises(Forbidden):  # outside the group
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=run_id,
                step_id="boss",
                subject="intern",
                groups=frozenset({"interns"}),
                decision="approve",
                payload=None,
                comment=None,
            )
        with pytest.raises(Forbidden):  # the submitter may not approve its own run
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=run_id,
                step_id="boss",
                subject="submitter",
                groups=frozenset({"managers"}),
                decision="approve",
                payload=None,
                comment=None,
            )
        result = await control.decide_approval(
            db,
            wsettings,
            tenant_id=TENANT,
            run_id=run_id,
            step_id="boss",
            subject="mgr",
            groups=frozenset({"managers"}),
            decision="approve",
            payload={"ok": True},
            comment="fine",
        )
        assert result["resolved"] is True
        with pytest.raises(InvalidState):  # a second decision on a decided approval
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=run_id,
                step_id="boss",
                subject="mgr2",
                groups=frozenset({"managers"}),
                decision="reject",
                payload=None,
                comment=None,
            )
        row = await status_is(db, run_id, "completed")
    from app.core import json

    out = json.loads(row["output"])
    assert out["signals"] == [{"n": 1}, {"n": 2}]
    assert (out["approved"], out["by"]) == (True, ["mgr"])
    async with db.read() as conn:
        kinds = (
            await conn.execute(
                select(steps.c.step_id, steps.c.kind, steps.c.status).order_by(steps.c.seq)
            )
        ).all()
        consumed = (await conn.execute(select(signals.c.consumed_step_id))).scalars().all()
    assert [tuple(k) for k in kinds] == [
        ("now", "value", "succeeded"),
        ("sleep", "timer", "succeeded"),
        ("signal:go", "signal", "succeeded"),
        ("signal:go#2", "signal", "succeeded"),
        ("boss", "approval", "succeeded"),
        ("uuid", "value", "succeeded"),
    ]
    assert consumed == ["signal:go", "signal:go#2"]
    with pytest.raises(RunFinished):
        await control.send_signal(
            db, wsettings, tenant_id=TENANT, run_id=run_id, name="go", payload=None, actor="ext"
        )


@WITH_PGBOUNCER
async def test_signal_sent_while_waiting_wakes_the_run(wsettings: Settings, db: Database) -> None:
    run_id = await submit(db, wsettings, "w-all", key=f"k{next(_ids)}")
    async with worker(wsettings, db):
        row = await status_is(db, run_id, "waiting_signal")
        assert (row["waiting_kind"], row["waiting_name"]) == ("signal", "go")
        assert row["available_at"] is not None  # the 30 s timeout is the wake-up
        for n in (1, 2):
            await control.send_signal(
                db, wsettings, tenant_id=TENANT, run_id=run_id, name="go", payload=n, actor="ext"
            )
        await status_is(db, run_id, "waiting_approval")


async def test_wait_timeout_fails_the_run(wsettings: Settings, db: Database) -> None:
    run_id = await submit(db, wsettings, "w-all", key=f"k{next(_ids)}", timeout=0.5)
    async with worker(wsettings, db):
        row = await status_is(db, run_id, "failed")
    assert row["reason"] == "failure_timed_out"
    assert "WaitTimedOut" in row["error"]


async def test_rejection_with_and_without_handler(wsettings: Settings, db: Database) -> None:
    rejections.clear()
    handled = await submit(db, wsettings, "w-reject-handled", key="a")
    unhandled = await submit(db, wsettings, "w-reject", key="b")
    async with worker(wsettings, db):
        await status_is(db, handled, "waiting_approval")
        await status_is(db, unhandled, "waiting_approval")
        first = await control.decide_approval(
            db,
            wsettings,
            tenant_id=TENANT,
            run_id=handled,
            step_id="boss",
            subject="ann",
            groups=frozenset(),
            decision="approve",
            payload=None,
            comment=None,
        )
        assert first["resolved"] is False  # needs two approvers
        with pytest.raises(InvalidState):  # ann cannot count twice
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=handled,
                step_id="boss",
                subject="ann",
                groups=frozenset(),
                decision="approve",
                payload=None,
                comment=None,
            )
        await control.decide_approval(
            db,
            wsettings,
            tenant_id=TENANT,
            run_id=handled,
            step_id="boss",
            subject="bob",
            groups=frozenset(),
            decision="reject",
            payload=None,
            comment="no budget",
        )
        await control.decide_approval(
            db,
            wsettings,
            tenant_id=TENANT,
            run_id=unhandled,
            step_id="boss",
            subject="bob",
            groups=frozenset(),
            decision="reject",
            payload=None,
            comment="no",
        )
        done = await status_is(db, handled, "completed")
        failed = await status_is(db, unhandled, "failed")
    assert done["output"] == "false"
    assert rejections == ["ann,bob"]
    assert failed["reason"] == "failure_non_retryable"
    assert "ApprovalRejected" in failed["error"]


async def test_dead_letter_requeue(wsettings: Settings, db: Database) -> None:
    flaky_fail["on"] = True
    run_id = await submit(db, wsettings, "w-requeue", key="r")
    async with worker(wsettings, db):
        await status_is(db, run_id, "failed")
        async with db.read() as conn:
            dl_id = (
                await conn.execute(
                    select(dead_letters.c.dead_letter_id).where(dead_letters.c.run_id == run_id)
                )
            ).scalar_one()
        flaky_fail["on"] = False
        assert await control.pending_dead_letter_id(db, tenant_id=TENANT, run_id=run_id) == dl_id
        dl = await control.requeue_dead_letter(
            db,
            tenant_id=TENANT,
            dead_letter_id=dl_id,
            actor="op",
            reason="fixed downstream",
            correlation_id="INC-42",
        )
        assert (dl["status"], dl["requeued_by"], dl["correlation_id"]) == (
            "requeued",
            "op",
            "INC-42",
        )
        with pytest.raises(InvalidState):
            await control.requeue_dead_letter(
                db,
                tenant_id=TENANT,
                dead_letter_id=dl_id,
                actor="op",
                reason="again",
                correlation_id=None,
            )
        row = await status_is(db, run_id, "completed")
    assert row["output"] == '"fine"'


async def test_resume_skips_a_retry_backoff(wsettings: Settings, db: Database) -> None:
    flaky_fail["on"] = True
    run_id = await submit(db, wsettings, "w-backoff", key="b")
    async with worker(wsettings, db):
        row = await status_is(db, run_id, "retrying")
        assert row["waiting_kind"] == "retry"
        with pytest.raises(InvalidState):  # only waiting runs can be resumed
            other = await submit(db, wsettings, "w-requeue", key="x")
            await status_is(db, other, "failed")
            await control.resume(db, tenant_id=TENANT, run_id=other, actor="op")
        await control.resume(db, tenant_id=TENANT, run_id=run_id, actor="op")
        row = await status_is(db, run_id, "completed")
    assert row["output"] == '"lucky"'


@workflow("w-two-approvals")
async def two_approvals(ctx: WorkflowContext, job: Job) -> list[str]:
    first = await ctx.approval("manager")
    second = await ctx.approval("manager")
    return [*first.decided_by, *second.decided_by]


async def test_the_same_approval_name_twice_replays(wsettings: Settings, db: Database) -> None:
    registry = Registry([two_approvals])
    async with db.write() as conn:
        await registry.register(conn)
    row, _ = await Submitter(db, wsettings).submit(
        SubmitRequest(workflow="w-two-approvals", input={"key": "two"}),
        tenant_id=TENANT,
        subject="submitter",
    )
    run_id = row["run_id"]
    w = Worker(wsettings, db, registry, concurrency=2)
    task = asyncio.create_task(w.run())
    try:
        for step_id, who in (("manager", "ann"), ("manager#2", "bob")):
            await status_is(db, run_id, "waiting_approval")

            async def recorded(sid: str = step_id) -> bool:
                return await _has_step(db, run_id, sid)

            await wait_for(recorded, what=f"approval {step_id} recorded")
            await control.decide_approval(
                db,
                wsettings,
                tenant_id=TENANT,
                run_id=run_id,
                step_id=step_id,
                subject=who,
                groups=frozenset(),
                decision="approve",
                payload=None,
                comment=None,
            )
        done = await status_is(db, run_id, "completed", "failed")
    finally:
        w.stop()
        await asyncio.wait_for(task, 30)
    assert (done["status"], done["output"]) == ("completed", '["ann","bob"]'), done["error"]


async def _has_step(db: Database, run_id: Any, step_id: str) -> bool:
    async with db.read() as conn:
        found = (
            await conn.execute(
                select(steps.c.status).where(steps.c.run_id == run_id, steps.c.step_id == step_id)
            )
        ).scalar()
    return found == "waiting"
