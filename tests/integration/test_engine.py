"""Engine end to end on both databases: submit → in-process worker → terminal state."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import dead_letters, steps
from app.engine import control
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import Permanent, RetryPolicy, WorkflowContext, current_step, workflow
from app.worker.worker import Worker
from tests.conftest import WITH_PGBOUNCER
from tests.helpers import wait_for
from tests.integration import support

TENANT = "acme"


class Numbers(BaseModel):
    a: int
    b: int


calls: dict[str, int] = {}


def count(name: str) -> int:
    calls[name] = calls.get(name, 0) + 1
    return calls[name]


def add(a: int, b: int) -> int:
    count("add")
    return a + b


async def double(x: int) -> int:
    count("double")
    return 2 * x


@workflow("it-sum")
async def sum_flow(ctx: WorkflowContext, n: Numbers) -> dict[str, int]:
    total = await ctx.step(add, n.a, n.b)
    doubled = await ctx.step(double, total)
    return {"total": total, "doubled": doubled}


def flaky(key: str) -> str:
    # Fails on attempts 1 and 2, succeeds on 3.
    attempt = current_step().attempt
    count(key)
    if attempt < 3:
        raise ConnectionError(f"transient failure {attempt}")
    return f"ok after {attempt}"


@workflow("it-retry")
async def retry_flow(ctx: WorkflowContext, n: Numbers) -> str:
    policy = RetryPolicy(max_attempts=n.a, backoff="fixed", delay=0.01)
    return await ctx.step(flaky, f"retry-{n.b}", retry=policy)


def declined() -> None:
    count("declined")
    raise Permanent(ValueError("card declined"))


@workflow("it-permanent")
async def permanent_flow(ctx: WorkflowContext, n: Numbers) -> None:
    await ctx.step(declined, retry=RetryPolicy(max_attempts=5, delay=0.01))


started = asyncio.Event
gates: dict[str, asyncio.Event] = {}


async def slow(key: str) -> str:
    gates[key + ":started"].set()
    await gates[key + ":release"].wait()
    return "done"


@workflow("it-slow")
async def slow_flow(ctx: WorkflowContext, n: Numbers) -> str:
    return await ctx.step(slow, f"slow-{n.a}-{n.b}")


async def branch(label: str, key: str) -> str:
    # Both branches must be in flight at once: each waits for the other to start.
    gates[f"{key}:{label}"].set()
    other = "right" if label == "left" else "left"
    await asyncio.wait_for(gates[f"{key}:{other}"].wait(), 10)
    return label


@workflow("it-parallel")
async def parallel_flow(ctx: WorkflowContext, n: Numbers) -> list[str]:
    key = f"par-{n.a}-{n.b}"
    results = await asyncio.gather(
        ctx.step(branch, "left", key, name="left"), ctx.step(branch, "right", key, name="right")
    )
    return list(results)


@workflow("it-once")
async def once_flow(ctx: WorkflowContext, n: Numbers) -> int:
    return await ctx.step(add, n.a, n.b, retry=RetryPolicy(max_attempts=1))


@workflow("it-timeout")
async def timeout_flow(ctx: WorkflowContext, n: Numbers) -> None:
    await ctx.step(asyncio.sleep, 5, timeout=0.05, retry=RetryPolicy(max_attempts=2, delay=0.01))


async def never_finishes(key: str) -> None:
    gates[key].set()
    await asyncio.Event().wait()


async def wait_then_fail(key: str) -> None:
    await gates[key].wait()
    raise Permanent(RuntimeError("boom"))


@workflow("it-branch-fails")
async def branch_fails_flow(ctx: WorkflowContext, n: Numbers) -> None:
    key = f"bf-{n.a}"
    await asyncio.gather(
        ctx.step(never_finishes, key, name="slow"),
        ctx.step(wait_then_fail, key, name="fail", retry=RetryPolicy(max_attempts=1)),
    )


REGISTRY = Registry(
    [
        sum_flow,
        retry_flow,
        permanent_flow,
        slow_flow,
        parallel_flow,
        timeout_flow,
        once_flow,
        branch_fails_flow,
    ]
)
_ids = itertools.count()


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, db: Database) -> AsyncIterator[Worker]:
    worker = Worker(settings, db, REGISTRY, concurrency=8)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def submit(db: Database, settings: Settings, workflow_name: str, **inp: Any) -> Any:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    row, created = await Submitter(db, settings).submit(
        SubmitRequest(workflow=workflow_name, input=inp), tenant_id=TENANT, subject="tester"
    )
    assert created
    return row["run_id"]


async def finished(db: Database, run_id: Any) -> Any:
    async def probe() -> Any:
        async with db.read() as conn:
            row = await runs_q.get_run(conn, TENANT, run_id)
        return row if row["status"] in {"completed", "failed", "cancelled"} else None

    return await wait_for(probe, timeout=30, what=f"run {run_id} to finish")


@WITH_PGBOUNCER
async def test_submit_to_completion(settings: Settings, db: Database) -> None:
    calls.clear()
    run_id = await submit(db, settings, "it-sum", a=2, b=3)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["reason"]) == ("completed", "succeeded")
    assert row["output"] == '{"total":5,"doubled":10}'
    assert calls == {"add": 1, "double": 1}
    async with db.read() as conn:
        statuses = (await conn.execute(select(steps.c.step_id, steps.c.status))).all()
    assert sorted(statuses) == [("add", "succeeded"), ("double", "succeeded")]


@WITH_PGBOUNCER
async def test_retries_then_success(settings: Settings, db: Database) -> None:
    calls.clear()
    n = next(_ids)
    run_id = await submit(db, settings, "it-retry", a=5, b=n)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["reason"]) == ("completed", "succeeded")
    assert row["output"] == '"ok after 3"'
    assert calls[f"retry-{n}"] == 3


async def test_retries_exhausted(settings: Settings, db: Database) -> None:
    calls.clear()
    n = next(_ids)
    run_id = await submit(db, settings, "it-retry", a=2, b=n)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    assert calls[f"retry-{n}"] == 2
    async with db.read() as conn:
        dl = (await conn.execute(select(dead_letters.c.reason))).scalars().all()
    assert dl == ["failure_attempts_exhausted"]


async def test_permanent_fails_at_once(settings: Settings, db: Database) -> None:
    calls.clear()
    run_id = await submit(db, settings, "it-permanent", a=0, b=0)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["reason"]) == ("failed", "failure_non_retryable")
    assert calls["declined"] == 1
    assert "card declined" in row["error"]


async def test_step_timeout(settings: Settings, db: Database) -> None:
    run_id = await submit(db, settings, "it-timeout", a=0, b=0)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["reason"]) == ("failed", "failure_timed_out")
    async with db.read() as conn:
        step = (await conn.execute(select(steps.c.status, steps.c.attempt))).one()
    assert tuple(step) == ("timed_out", 2)


@WITH_PGBOUNCER
async def test_cancel_while_running(settings: Settings, db: Database) -> None:
    n = next(_ids)
    key = f"slow-{n}-0"
    gates[key + ":started"] = asyncio.Event()
    gates[key + ":release"] = asyncio.Event()
    run_id = await submit(db, settings, "it-slow", a=n, b=0)
    async with running_worker(settings, db) as worker:
        await asyncio.wait_for(gates[key + ":started"].wait(), 30)

        # Held while the attempt is younger than TREADLE_STEP_START_RECORD_AFTER_SECONDS
        # (ADR 0040), then written while the step still runs.
        await support.start_recorded(db, run_id)
        row = await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="test")
        assert (row["status"], row["reason"]) == ("cancelled", "canceled_by_request")
        # The worker notices at its next heartbeat and stops the execution.
        await wait_for(lambda: _no_active(worker), timeout=10, what="execution stopped")
        # Idempotent.
        again = await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason=None)
        assert again["status"] == "cancelled"
    async with db.read() as conn:
        row = await runs_q.get_run(conn, TENANT, run_id)
        step_status = (await conn.execute(select(steps.c.status))).scalar_one()
    assert row["status"] == "cancelled"
    assert row["lease_owner"] is None
    assert step_status == "cancelled"


async def _no_active(worker: Worker) -> bool:
    return not worker._active


async def test_cancel_finished_run_conflicts(settings: Settings, db: Database) -> None:
    from app.core.errors import RunFinished

    run_id = await submit(db, settings, "it-sum", a=1, b=1)
    async with running_worker(settings, db):
        await finished(db, run_id)
    with pytest.raises(RunFinished):
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason=None)


@WITH_PGBOUNCER
async def test_parallel_steps_overlap(settings: Settings, db: Database) -> None:
    n = next(_ids)
    key = f"par-{n}-0"
    gates[f"{key}:left"] = asyncio.Event()
    gates[f"{key}:right"] = asyncio.Event()
    run_id = await submit(db, settings, "it-parallel", a=n, b=0)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["output"]) == ("completed", '["left","right"]')
    async with db.read() as conn:
        seqs = (
            await conn.execute(select(steps.c.step_id, steps.c.seq).order_by(steps.c.seq))
        ).all()
    assert [tuple(s) for s in seqs] == [("left", 0), ("right", 1)]


async def test_other_tenant_cannot_see_run(settings: Settings, db: Database) -> None:
    from app.core.errors import RunNotFound

    run_id = await submit(db, settings, "it-sum", a=1, b=1)
    async with db.read() as conn:
        with pytest.raises(RunNotFound):
            await runs_q.get_run(conn, "other-tenant", run_id)
    with pytest.raises(RunNotFound):
        await control.cancel(db, tenant_id="other-tenant", run_id=run_id, actor="x", reason=None)
    async with db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(dead_letters))).scalar() == 0
        row = await runs_q.get_run(conn, TENANT, run_id)
    assert row["status"] == "queued"


async def test_heartbeat_renews_only_runs_being_executed(settings: Settings, db: Database) -> None:
    first = await submit(db, settings, "it-sum", a=1, b=2)
    second = await submit(db, settings, "it-sum", a=3, b=4)
    async with db.write() as conn:
        claimed = await runs_q.claim_runs(
            conn, worker_id="w1", definition_keys=REGISTRY.keys, limit=10, lease_ttl=60
        )
    assert {r["run_id"] for r in claimed} == {first, second}
    fences = {r["run_id"]: r["fence"] for r in claimed}
    async with db.write() as conn:
        held = await runs_q.renew_leases(conn, worker_id="w1", run_ids=[first], lease_ttl=120)
        assert held == {first: fences[first]}
        # Another worker's id renews nothing.
        assert await runs_q.renew_leases(conn, worker_id="w2", run_ids=[second], lease_ttl=1) == {}
    async with db.read() as conn:
        a = await runs_q.get_run(conn, TENANT, first)
        b = await runs_q.get_run(conn, TENANT, second)
    assert a["lease_expires_at"] > b["lease_expires_at"]


async def test_long_retry_releases_the_run_until_due(
    database_url: str, tmp_path: Any, db: Database
) -> None:
    from app.db.queries import events as events_q
    from tests.conftest import make_settings

    calls.clear()
    n = next(_ids)
    # Every retry is "long": the run is released and re-claimed instead of waiting inline.
    settings = make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)
    run_id = await submit(db, settings, "it-retry", a=5, b=n)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert (row["status"], row["output"]) == ("completed", '"ok after 3"')
    assert calls[f"retry-{n}"] == 3
    assert row["attempt"] == 3  # claimed once per attempt
    async with db.read() as conn:
        events = await events_q.list_events(conn, TENANT, run_id, after_id=None, limit=100)
    released = [e for e in events if e["kind"] == "run_released"]
    assert len(released) == 2
    assert all('"waiting_on":"retry"' in e["data"] for e in released)
    claims = [json.loads(e["data"]) for e in events if e["kind"] == "run_claimed"]
    assert [(c["attempt"], c["fence"]) for c in claims] == [(1, 1), (2, 2), (3, 3)]
    assert all(c["worker_id"].count(":") == 2 for c in claims)


async def test_failed_branch_cancels_its_sibling(settings: Settings, db: Database) -> None:
    n = next(_ids)
    gates[f"bf-{n}"] = asyncio.Event()
    run_id = await submit(db, settings, "it-branch-fails", a=n, b=0)
    async with running_worker(settings, db) as worker:
        row = await finished(db, run_id)
        await wait_for(lambda: _no_active(worker), timeout=10, what="execution over")
    assert (row["status"], row["reason"]) == ("failed", "failure_non_retryable")
    async with db.read() as conn:
        statuses = dict((await conn.execute(select(steps.c.step_id, steps.c.status))).all())
    assert statuses == {"slow": "cancelled", "fail": "failed"}


async def test_lost_attempts_do_not_use_the_retry_budget(
    database_url: str, tmp_path: Any, db: Database
) -> None:
    from sqlalchemy import update

    from app.db.queries import steps as steps_q
    from app.db.tables import runs
    from tests.conftest import make_settings

    settings = make_settings(database_url, tmp_path, max_lost_attempts=2)

    async def crash_mid_attempt(run_id: Any) -> None:
        # What a kill -9 leaves behind: the attempt recorded as running, the lease gone.
        async with db.write() as conn:
            claimed = await runs_q.claim_runs(
                conn, worker_id="dead", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
            )
            assert [r["run_id"] for r in claimed] == [run_id]
            prior = (
                await conn.execute(
                    select(steps.c.attempt, steps.c.detail).where(steps.c.run_id == run_id)
                )
            ).first()
            detail = prior[1] if prior else None
            lost = 0 if detail is None else json_loads(detail).get("lost_attempts", 0)
            if prior is not None:
                detail = f'{{"lost_attempts":{lost + 1}}}'  # what the replay records
            await steps_q.start_attempt(
                conn,
                run_id=run_id,
                tenant_id=TENANT,
                step_id="add",
                seq=0,
                kind="step",
                name="add",
                attempt=(prior[0] if prior else 0) + 1,
                max_attempts=1,
                fence=claimed[0]["fence"],
                detail=detail,
            )
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(status="queued", lease_owner=None, available_at=claimed[0]["created_at"])
            )

    forgiven = await submit(db, settings, "it-once", a=1, b=2)
    for _ in range(2):
        await crash_mid_attempt(forgiven)
    async with running_worker(settings, db):
        row = await finished(db, forgiven)
    assert (row["status"], row["output"]) == ("completed", "3"), row["error"]
    async with db.read() as conn:
        attempt, detail = (
            await conn.execute(
                select(steps.c.attempt, steps.c.detail).where(steps.c.run_id == forgiven)
            )
        ).one()
    assert attempt == 3 and '"lost_attempts":2' in detail

    poison = await submit(db, settings, "it-once", a=5, b=5)
    for _ in range(3):
        await crash_mid_attempt(poison)
    async with running_worker(settings, db):
        row = await finished(db, poison)
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    assert "WorkerLost" in row["error"]


async def test_lost_claims_count_lost_attempts_of_a_step_without_a_start_record(
    database_url: str, tmp_path: Any, db: Database
) -> None:
    """A fast step writes no start record; the run's lost claims stand for it (ADR 0040).

    What a worker killed inside a quick attempt leaves behind is a lease still owned and
    expired, and no ``running`` entry. Each such claim counts; past
    ``TREADLE_MAX_LOST_ATTEMPTS`` the step fails ``WorkerLost`` as a slow one would.
    """
    from sqlalchemy import update

    from app.db.tables import runs
    from tests.conftest import make_settings

    settings = make_settings(database_url, tmp_path, max_lost_attempts=2)

    async def lose_claim(run_id: Any) -> None:
        async with db.write() as conn:
            claimed = await runs_q.claim_runs(
                conn, worker_id="dead", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
            )
            assert [r["run_id"] for r in claimed] == [run_id]
            # The dead worker's lease, expired: due again, still owned, nothing journaled.
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(available_at=claimed[0]["created_at"])
            )

    async def lost_claims(run_id: Any) -> int:
        async with db.read() as conn:
            return int(
                (
                    await conn.execute(select(runs.c.lost_claims).where(runs.c.run_id == run_id))
                ).scalar_one()
            )

    forgiven = await submit(db, settings, "it-once", a=1, b=2)
    for _ in range(2):
        await lose_claim(forgiven)
    # The first claim took a queued run (nobody's lease): one lost claim so far.
    assert await lost_claims(forgiven) == 1
    async with running_worker(settings, db):
        row = await finished(db, forgiven)
    assert (row["status"], row["output"]) == ("completed", "3"), row["error"]
    async with db.read() as conn:
        attempt, detail = (
            await conn.execute(
                select(steps.c.attempt, steps.c.detail).where(steps.c.run_id == forgiven)
            )
        ).one()
    assert attempt == 3 and json_loads(detail)["lost_attempts"] == 2
    assert await lost_claims(forgiven) == 0  # the step's write ended the series

    poison = await submit(db, settings, "it-once", a=5, b=5)
    for _ in range(3):
        await lose_claim(poison)
    async with running_worker(settings, db):
        row = await finished(db, poison)
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    assert "WorkerLost" in row["error"]
    async with db.read() as conn:
        status, detail = (
            await conn.execute(
                select(steps.c.status, steps.c.detail).where(steps.c.run_id == poison)
            )
        ).one()
        letters = (
            await conn.execute(
                select(func.count())
                .select_from(dead_letters)
                .where(dead_letters.c.run_id == poison)
            )
        ).scalar_one()
    assert status == "failed" and json_loads(detail)["lost_attempts"] == 3
    assert letters == 1


@WITH_PGBOUNCER
async def test_a_quick_attempt_is_journaled_whole_in_timeline_order(
    settings: Settings, db: Database
) -> None:
    """Start and result of an attempt that finished quickly are one write, in order.

    The row carries the attempt's own start time (not the commit's), and the timeline
    reads ``step_started`` before ``step_succeeded`` for every step.
    """
    from app.db.tables import events

    run_id = await submit(db, settings, "it-sum", a=2, b=3)
    async with running_worker(settings, db):
        row = await finished(db, run_id)
    assert row["status"] == "completed", row["error"]
    async with db.read() as conn:
        journal = (
            await conn.execute(
                select(
                    steps.c.step_id,
                    steps.c.status,
                    steps.c.attempt,
                    steps.c.started_at,
                    steps.c.finished_at,
                )
                .where(steps.c.run_id == run_id)
                .order_by(steps.c.seq)
            )
        ).all()
        timeline = (
            await conn.execute(
                select(events.c.kind, events.c.step_id, events.c.at)
                .where(events.c.run_id == run_id, events.c.step_id.is_not(None))
                .order_by(events.c.event_id)
            )
        ).all()
    assert [(r[1], r[2]) for r in journal] == [("succeeded", 1), ("succeeded", 1)]
    for _, _, _, started, finished_at in journal:
        assert started is not None and finished_at is not None and started <= finished_at
    by_step: dict[str, list[Any]] = {}
    for kind, step_id, at in timeline:
        by_step.setdefault(step_id, []).append((kind, at))
    assert len(by_step) == 2
    for kinds in by_step.values():
        assert [k for k, _ in kinds] == ["step_started", "step_succeeded"]
        assert kinds[0][1] <= kinds[1][1]


def json_loads(text: str) -> dict[str, Any]:
    from app.core import json

    loaded: dict[str, Any] = json.loads(text)
    return loaded


async def test_a_claim_that_returns_after_the_drain_began_gives_its_runs_back(
    settings: Settings, db: Database
) -> None:
    # SIGTERM can land while a claim statement is in flight: the runs it returns must be
    # handed back at once, not started (the drain would wait its whole grace for them).
    # CI run 10 failed test_drain this way: the later run was claimed 0.3 ms after
    # "draining" and held the worker for the 60 s grace.
    calls.clear()
    run_id = await submit(db, settings, "it-sum", a=1, b=2)
    worker = Worker(settings, db, REGISTRY, concurrency=8)
    claim = worker.claimer.claim

    async def claim_then_sigterm(limit: int, *, executing: Any) -> Any:
        rows = await claim(limit, executing=executing)
        if rows:
            worker.stop()  # what SIGTERM does, between the statement and its result
        return rows

    worker.claimer.claim = claim_then_sigterm  # type: ignore[method-assign,assignment]
    await asyncio.wait_for(worker.run(), 30)
    async with db.read() as conn:
        row = await runs_q.get_run(conn, TENANT, run_id)
        journaled = (
            await conn.execute(select(func.count()).where(steps.c.run_id == run_id))
        ).scalar()
    assert (row["status"], row["lease_owner"]) == ("queued", None)
    assert journaled == 0 and calls == {}
    assert (worker.stats.claimed, worker.stats.released) == (1, 1)
    # Given back claimable at once: the next worker runs it to the end.
    async with running_worker(settings, db):
        done = await finished(db, run_id)
    assert (done["status"], json.loads(done["output"])) == ("completed", {"total": 3, "doubled": 6})
