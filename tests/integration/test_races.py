"""Races between concurrent actors, each ordered deterministically: both databases.

Each test pins the interleaving it is about with asyncio events, barriers or a database
lock held by the test (never sleeps), then checks that exactly one side won and the other
got the documented answer. ``uv run pytest tests/integration/test_races.py --count 50``
repeats each one 50 times.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import InvalidState, LeaseLost, RunFinished
from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import runs as runs_q
from app.db.tables import dead_letters, events, runs, signals, steps
from app.engine import control
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import Permanent, RetryPolicy, WaitTimedOut, WorkflowContext, workflow
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "races"
_ids = itertools.count()
gates: dict[str, asyncio.Event] = {}
calls: dict[str, int] = {}


class Job(BaseModel):
    key: str
    timeout: float = 60.0


def _gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


async def held(key: str) -> str:
    """Count the call; the first waits for ``<key>:release``; later calls return at once."""
    calls[key] = calls.get(key, 0) + 1
    nth = calls[key]
    if nth == 1:
        _gate(f"{key}:started").set()
        await _gate(f"{key}:release").wait()
    return f"call-{nth}"


@workflow("race-held")
async def held_flow(ctx: WorkflowContext, job: Job) -> str:
    return await ctx.step(held, job.key, retry=RetryPolicy(max_attempts=1))


@workflow("race-approval")
async def approval_flow(ctx: WorkflowContext, job: Job) -> str:
    try:
        decision = await ctx.approval("ok", timeout=job.timeout)
    except WaitTimedOut:
        return "timed_out"
    return "approved" if decision.approved else "rejected"


@workflow("race-signals")
async def signals_flow(ctx: WorkflowContext, job: Job) -> list[Any]:
    first = await ctx.signal("go", timeout=job.timeout)
    second = await ctx.signal("go", timeout=job.timeout)
    return [first, second]


def refuse() -> None:
    raise Permanent(ValueError("no"))


@workflow("race-fail")
async def fail_flow(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(refuse)


REGISTRY = Registry([held_flow, approval_flow, signals_flow, fail_flow])


@pytest.fixture
def rsettings(database_url: str, tmp_path: Path) -> Settings:
    # Long leases and heartbeats: no lease moves unless a test moves it.
    return make_settings(
        database_url,
        tmp_path,
        lease_ttl_seconds=60.0,
        heartbeat_interval_seconds=20.0,
        inline_retry_max_seconds=0.0,
    )


def worker(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, concurrency=4)


async def submit(db: Database, settings: Settings, name: str, **inp: Any) -> uuid.UUID:
    return await support.submit(db, settings, REGISTRY, TENANT, name, subject="submitter", **inp)


async def run_row(db: Database, run_id: uuid.UUID) -> Any:
    async with db.read() as conn:
        return await runs_q.get_run(conn, TENANT, run_id)


async def event_count(db: Database, run_id: uuid.UUID, kind: str) -> int:
    async with db.read() as conn:
        stmt = select(func.count()).where(events.c.run_id == run_id, events.c.kind == kind)
        return int((await conn.execute(stmt)).scalar_one())


async def outcome(call: Awaitable[Any]) -> Any:
    """The call's result, or the exception it raised (to compare racing calls)."""
    try:
        return await call
    except Exception as exc:  # noqa: BLE001 - the test inspects which error it was
        return exc


async def lock_waiters(db: Database) -> int:
    """PostgreSQL: sessions of this database blocked on a lock right now."""
    async with db.read() as conn:
        stmt = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int((await conn.execute(stmt)).scalar_one())


async def with_run_locked(
    db: Database, run_id: uuid.UUID, contenders: list[Callable[[], Awaitable[Any]]]
) -> list[Any]:
    """Start ``contenders`` while the test holds the run's row lock, then release it.

    PostgreSQL: every contender is parked on the lock before it is released, so all of
    them read the run only after the others started: the tightest interleaving. SQLite
    serialises writers with BEGIN IMMEDIATE anyway, so there they simply run concurrently.
    """
    if db.engine.dialect.name != "postgresql":
        return list(await asyncio.gather(*(outcome(c()) for c in contenders)))
    async with db.engine.connect() as holder:
        trans = await holder.begin()
        await holder.execute(select(runs.c.run_id).where(runs.c.run_id == run_id).with_for_update())
        tasks = [asyncio.create_task(outcome(c())) for c in contenders]

        async def parked() -> bool:
            return await lock_waiters(db) >= len(contenders)

        await wait_for(parked, timeout=20, what="contenders blocked on the run lock")
        await trans.rollback()
    return list(await asyncio.gather(*tasks))


# --- concurrent keyed submissions ---------------------------------------------------------


async def test_concurrent_keyed_submissions_make_one_run(rsettings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    key = f"idem-{uuid.uuid4().hex}"
    barrier = asyncio.Barrier(20)

    async def client(i: int) -> tuple[uuid.UUID, bool]:
        submitter = Submitter(db, rsettings)
        await barrier.wait()  # all 20 leave together
        row, created = await submitter.submit(
            SubmitRequest(workflow="race-held", input={"key": key}, idempotency_key=key),
            tenant_id=TENANT,
            subject=f"client-{i}",
        )
        return row["run_id"], created

    results = await asyncio.gather(*(client(i) for i in range(20)))
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    async with db.read() as conn:
        stmt = select(func.count()).where(runs.c.idempotency_key == key)
        assert (await conn.execute(stmt)).scalar_one() == 1


# --- cancel racing completion --------------------------------------------------------------


@pytest.mark.parametrize("order", ["cancel_first", "completion_first", "together"])
async def test_cancel_racing_completion(rsettings: Settings, db: Database, order: str) -> None:
    key = f"cancel-{next(_ids)}-{uuid.uuid4().hex[:6]}"
    run_id = await submit(db, rsettings, "race-held", key=key)

    def cancel() -> Awaitable[Any]:
        return control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="race")

    async with worker(rsettings, db) as (w,):
        await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
        if order == "cancel_first":
            await support.start_recorded(db, run_id)  # so the cancel finds the step's row
            cancelled = await outcome(cancel())
            _gate(f"{key}:release").set()  # the step body ends after the cancel committed
        elif order == "completion_first":
            _gate(f"{key}:release").set()
            await support.reach(db, TENANT, run_id, "completed")
            cancelled = await outcome(cancel())
        else:
            _gate(f"{key}:release").set()
            cancelled = await outcome(cancel())  # races the worker's checkpoint commit

        async def idle() -> bool:
            return not w._active

        await wait_for(idle, timeout=30, what="worker idle")
    row = await run_row(db, run_id)
    if isinstance(cancelled, RunFinished):  # the documented 409: completion won
        assert order != "cancel_first"
        assert (row["status"], json.loads(row["output"])) == ("completed", "call-1")
        assert await event_count(db, run_id, "run_cancelled") == 0
    else:  # cancel won: the worker's late checkpoint was fenced off
        assert not isinstance(cancelled, Exception), repr(cancelled)
        assert order != "completion_first"
        assert (row["status"], row["reason"], row["output"]) == (
            "cancelled",
            "canceled_by_request",
            None,
        )
        assert await event_count(db, run_id, "run_completed") == 0
    if order == "cancel_first":
        assert row["status"] == "cancelled"
        async with db.read() as conn:
            step = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).one()
        assert step.status == "cancelled" and step.output is None
    assert row["lease_owner"] is None


# --- approval racing its timeout -----------------------------------------------------------


async def _deadline_passes(db: Database, run_id: uuid.UUID) -> None:
    """Model the approval's deadline passing while no worker runs.

    The approval was recorded with an hour's timeout (so no worker could time it out
    before the test is ready); its deadline, and the run's wake-up time, move to the
    database's now.
    """
    async with db.write() as conn:
        now = await _db_now(conn)
        await conn.execute(update(steps).where(steps.c.run_id == run_id).values(deadline=now))
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(available_at=now, waiting_deadline=now)
        )


async def _db_now(conn: AsyncConnection) -> datetime:
    return await fetch_now(conn, conn.dialect.name)


@pytest.mark.parametrize("order", ["timeout_first", "decision_first", "together"])
async def test_approval_racing_its_timeout(rsettings: Settings, db: Database, order: str) -> None:
    run_id = await submit(db, rsettings, "race-approval", key=f"a{next(_ids)}", timeout=3600)
    async with worker(rsettings, db):
        await support.reach(db, TENANT, run_id, "waiting_approval")
    # No worker runs now: the deadline passes with the approval still waiting.
    await _deadline_passes(db, run_id)

    def decide() -> Awaitable[Any]:
        return control.decide_approval(
            db,
            rsettings,
            tenant_id=TENANT,
            run_id=run_id,
            step_id="ok",
            subject="approver",
            groups=frozenset(),
            decision="approve",
            payload=None,
            comment=None,
        )

    if order == "decision_first":
        decided = await outcome(decide())
        async with worker(rsettings, db):
            row = await support.reach(db, TENANT, run_id, "completed")
    elif order == "timeout_first":
        async with worker(rsettings, db):
            row = await support.reach(db, TENANT, run_id, "completed")
        decided = await outcome(decide())
    else:
        async with worker(rsettings, db):
            decided = await outcome(decide())
            row = await support.reach(db, TENANT, run_id, "completed")
    result = json.loads(row["output"])
    if isinstance(decided, Exception):  # the documented 409: the timeout won
        assert isinstance(decided, (InvalidState, RunFinished)), repr(decided)
        assert order != "decision_first"
        assert result == "timed_out"
    else:  # a decision recorded before the worker saw the deadline settles the approval
        assert decided["resolved"] is True
        assert order != "timeout_first"
        assert result == "approved"


# --- two signals racing one wait -----------------------------------------------------------


async def test_two_signals_racing_one_wait(rsettings: Settings, db: Database) -> None:
    run_id = await submit(db, rsettings, "race-signals", key=f"s{next(_ids)}")
    async with worker(rsettings, db):
        await support.reach(db, TENANT, run_id, "waiting_signal")
        barrier = asyncio.Barrier(2)

        async def send(n: int) -> Any:
            await barrier.wait()
            return await control.send_signal(
                db,
                rsettings,
                tenant_id=TENANT,
                run_id=run_id,
                name="go",
                payload={"n": n},
                actor=f"sender-{n}",
            )

        await asyncio.gather(send(1), send(2))
        row = await support.reach(db, TENANT, run_id, "completed")
    async with db.read() as conn:
        stmt = select(signals).where(signals.c.run_id == run_id).order_by(signals.c.signal_id)
        sent = (await conn.execute(stmt)).mappings().all()
    # Both delivered, each exactly once, in the order they were recorded.
    assert json.loads(row["output"]) == [json.loads(s["payload"]) for s in sent]
    assert sorted(p["n"] for p in json.loads(row["output"])) == [1, 2]
    assert len({s["consumed_step_id"] for s in sent}) == 2
    assert all(s["consumed_at"] is not None for s in sent)


# --- requeue racing requeue ----------------------------------------------------------------


async def test_requeue_racing_requeue(rsettings: Settings, db: Database) -> None:
    run_id = await submit(db, rsettings, "race-fail", key=f"f{next(_ids)}")
    async with worker(rsettings, db):
        await support.reach(db, TENANT, run_id, "failed")
    async with db.read() as conn:
        stmt = select(dead_letters.c.dead_letter_id).where(dead_letters.c.run_id == run_id)
        dead_letter_id = (await conn.execute(stmt)).scalar_one()

    def requeue(who: str) -> Callable[[], Awaitable[Any]]:
        return lambda: control.requeue_dead_letter(
            db,
            tenant_id=TENANT,
            dead_letter_id=dead_letter_id,
            actor=who,
            reason="race",
            correlation_id=who,
        )

    results = await with_run_locked(db, run_id, [requeue("op-1"), requeue("op-2")])
    won = [r for r in results if not isinstance(r, Exception)]
    lost = [r for r in results if isinstance(r, Exception)]
    assert len(won) == 1 and len(lost) == 1, results
    assert isinstance(lost[0], InvalidState), repr(lost[0])  # the documented 409
    assert won[0]["status"] == "requeued"
    assert await event_count(db, run_id, "dead_letter_requeued") == 1
    assert (await run_row(db, run_id))["status"] == "queued"


# --- lease expiry racing a heartbeat -------------------------------------------------------


async def _expire_lease(db: Database, run_id: uuid.UUID) -> None:
    """Model a worker paused past its TTL: its lease is due for takeover now."""
    async with db.write() as conn:
        now = await _db_now(conn)
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(lease_expires_at=now, available_at=now)
        )


async def test_expired_lease_cannot_commit_and_the_new_holder_can(
    rsettings: Settings, db: Database
) -> None:
    key = f"lease-{next(_ids)}-{uuid.uuid4().hex[:6]}"
    run_id = await submit(db, rsettings, "race-held", key=key)
    async with worker(rsettings, db) as (old,):
        await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
        old_fence = (await run_row(db, run_id))["fence"]
        await _expire_lease(db, run_id)
        # A second worker takes the run over and completes it (its call returns at once).
        async with worker(rsettings, db):
            row = await support.reach(db, TENANT, run_id, "completed")
        assert json.loads(row["output"]) == "call-2"
        assert row["fence"] > old_fence
        # The old holder's step body now ends: its checkpoint must be refused.
        _gate(f"{key}:release").set()

        async def idle() -> bool:
            return not old._active

        await wait_for(idle, timeout=30, what="old worker gave up")
    row = await run_row(db, run_id)
    assert (row["status"], json.loads(row["output"])) == ("completed", "call-2")
    async with db.read() as conn:
        step = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).one()
    assert json.loads(step.output) == "call-2"
    assert await event_count(db, run_id, "run_completed") == 1
    # Any write under the old fence is refused.
    async with db.write() as conn:
        with pytest.raises(LeaseLost):
            await runs_q.check_fence(conn, run_id, old_fence, tenant_id=TENANT)


@pytest.mark.parametrize("order", ["heartbeat_first", "takeover_first", "together"])
async def test_heartbeat_racing_a_takeover_leaves_one_holder(
    rsettings: Settings, db: Database, order: str
) -> None:
    run_id = await submit(db, rsettings, "race-held", key=f"hb-{next(_ids)}")
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn, worker_id="old", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
        )
    await _expire_lease(db, run_id)

    async def heartbeat() -> dict[uuid.UUID, int]:
        async with db.write() as conn:
            return await runs_q.renew_leases(conn, worker_id="old", run_ids=[run_id], lease_ttl=60)

    async def takeover() -> Any:
        async with db.write() as conn:
            return await runs_q.claim_runs(
                conn, worker_id="new", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
            )

    if order == "heartbeat_first":
        renewed = await outcome(heartbeat())
        taken = await outcome(takeover())
    elif order == "takeover_first":
        taken = await outcome(takeover())
        renewed = await outcome(heartbeat())
    else:  # one round trip each, concurrently: the row lock orders them
        renewed, taken = await asyncio.gather(outcome(heartbeat()), outcome(takeover()))
    assert not isinstance(renewed, Exception) and not isinstance(taken, Exception)
    row = await run_row(db, run_id)
    if taken:  # the takeover won: the old holder's heartbeat renewed nothing
        assert order != "heartbeat_first"
        assert renewed == {}
        assert (row["lease_owner"], row["fence"]) == ("new", claimed["fence"] + 1)
    else:  # the heartbeat won: the lease is live again, nothing to take over
        assert order != "takeover_first"
        assert renewed == {run_id: claimed["fence"]}
        assert (row["lease_owner"], row["fence"]) == ("old", claimed["fence"])
    # Exactly one fence is current: the other holder can never commit.
    stale = claimed["fence"] if taken else claimed["fence"] + 1
    async with db.write() as conn:
        with pytest.raises(LeaseLost):
            await runs_q.check_fence(conn, run_id, stale, tenant_id=TENANT)


async def test_a_worker_past_its_lease_never_claims_its_own_run_again(
    rsettings: Settings, db: Database
) -> None:
    """A worker paused past its lease resumes: its own run in flight is not claimed again.

    The lease of a run the worker is executing expires (what a GC pause, a VM freeze or
    SIGSTOP does). The worker's next claim rounds must skip that run, although it is due:
    claiming it would start a second execution in the same process, count the first
    one's attempt as lost, and let the first one's cleanup drop the second's bookkeeping
    (unheartbeated, it would be lost and claimed again, until ``WorkerLost``). A second
    run submitted after the expiry proves a claim round ran with the first one due (it
    is older in claim order, so that round would have taken it first).
    """
    first = f"own-{next(_ids)}-{uuid.uuid4().hex[:6]}"
    second = f"own-{next(_ids)}-{uuid.uuid4().hex[:6]}"
    run_id = await submit(db, rsettings, "race-held", key=first)
    async with worker(rsettings, db) as (w,):
        await asyncio.wait_for(_gate(f"{first}:started").wait(), 30)
        claimed = await run_row(db, run_id)
        execution = w._active[run_id]
        await _expire_lease(db, run_id)
        later = await submit(db, rsettings, "race-held", key=second)
        await asyncio.wait_for(_gate(f"{second}:started").wait(), 30)
        row = await run_row(db, run_id)
        assert (row["fence"], row["attempt"]) == (claimed["fence"], claimed["attempt"])
        assert w._active[run_id] is execution  # still the one execution, still heartbeated
        assert await event_count(db, run_id, "run_claimed") == 1
        _gate(f"{first}:release").set()
        _gate(f"{second}:release").set()
        row = await support.reach(db, TENANT, run_id, "completed", "failed")
        await support.reach(db, TENANT, later, "completed", "failed")
        assert w.stats.lease_lost == 0
    assert (row["status"], json.loads(row["output"]), row["attempt"]) == ("completed", "call-1", 1)
    assert calls[first] == 1  # the step ran once
    async with db.read() as conn:
        letters = await conn.execute(select(func.count()).where(dead_letters.c.run_id == run_id))
        step = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).one()
    assert letters.scalar_one() == 0
    assert (step.status, step.attempt) == ("succeeded", 1)
