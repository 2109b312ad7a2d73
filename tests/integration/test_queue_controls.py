"""Queue controls enforced in the claim path across two workers, on both databases.

A global ``concurrency_limit`` caps runs executing at once across workers; a
``rate_limit`` spaces first starts (per workflow or per concurrency key) but never delays
a run resuming after a timer; ``priority`` orders claims. Declarations are shown by
``GET /workflows``; ``priority`` is validated at ``POST /runs``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import runs
from app.engine.claims import Claimer, gcra, rate_bucket
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import WorkflowContext, workflow
from app.sdk.queue import RateLimit
from tests.helpers import wait_for
from tests.integration.support import api_client, reach, workers

TENANT = "queues"


class Job(BaseModel):
    """Input: which job; how long its one step works (seconds); an optional timer."""

    n: int = 0
    work: float = 0.0
    nap: float = 0.0


class Gauge:
    """Counts runs executing at once in this process (both in-process workers share it)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.order: list[int] = []

    def reset(self) -> None:
        self.now = self.peak = 0
        self.order = []


GAUGE = Gauge()


async def _work(job: Job, *, pair_within: float = 0.0) -> int:
    GAUGE.now += 1
    GAUGE.peak = max(GAUGE.peak, GAUGE.now)
    GAUGE.order.append(job.n)
    try:
        # Wait (bounded) for a second run to execute beside this one, so the limit's
        # peak of two is reached on a loaded machine too, where a short slot could end
        # before the other worker's next claim; not for the last run of the batch.
        deadline = asyncio.get_running_loop().time() + pair_within
        while GAUGE.now < 2 and len(GAUGE.order) < 10:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.01)
        # Holding the slot for a while is the workload that gives a third run the
        # chance to overlap if the limit leaked; nothing waits on it.
        await asyncio.sleep(job.work)
    finally:
        GAUGE.now -= 1
    return job.n


async def _paired_work(job: Job) -> int:
    return await _work(job, pair_within=10.0)


@workflow("limited", concurrency_limit=2)
async def limited(ctx: WorkflowContext, job: Job) -> int:
    """At most two runs execute at once, whatever the workers' capacity."""
    return await ctx.step(_paired_work, job)


@workflow("metered", rate_limit=RateLimit(per_second=20))
async def metered(ctx: WorkflowContext, job: Job) -> int:
    """At most 20 starts a second across all workers (one every 50 ms)."""
    return job.n


@workflow("metered-per-key", rate_limit=RateLimit(per_second=10, by="key"))
async def metered_per_key(ctx: WorkflowContext, job: Job) -> int:
    """At most 10 starts a second per concurrency key."""
    return job.n


@workflow("slow-starter", rate_limit=RateLimit(per_second=0.01))
async def slow_starter(ctx: WorkflowContext, job: Job) -> int:
    """One start per 100 s; its own resumption after a timer is not a start."""
    await ctx.sleep(job.nap)
    return job.n


@workflow("ranked")
async def ranked(ctx: WorkflowContext, job: Job) -> int:
    """Records the order runs execute in."""
    return await ctx.step(_work, job)


REGISTRY = Registry([limited, metered, metered_per_key, slow_starter, ranked])


@pytest.fixture(autouse=True)
def _fresh_gauge() -> None:
    GAUGE.reset()


async def _submit(
    db: Database, settings: Settings, workflow_name: str, job: Job, **kwargs: Any
) -> uuid.UUID:
    row, _ = await Submitter(db, settings).submit(
        SubmitRequest(workflow=workflow_name, input=job.model_dump(), **kwargs),
        tenant_id=TENANT,
        subject="s",
    )
    run_id: uuid.UUID = row["run_id"]
    return run_id


async def _register(db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)


async def _started(db: Database, run_ids: list[uuid.UUID]) -> list[datetime]:
    async with db.read() as conn:
        rows = (
            await conn.execute(select(runs.c.started_at).where(runs.c.run_id.in_(run_ids)))
        ).all()
    return sorted(r[0] for r in rows)


def test_claimer_partitions_controlled_workflows(settings: Settings, db: Database) -> None:
    claimer = Claimer(db, REGISTRY, worker_id="w", lease_ttl=3)
    assert claimer.plain_keys == (("ranked", "1"),)
    by_name = {c.workflow: c for c in claimer.controlled}
    assert sorted(by_name) == ["limited", "metered", "metered-per-key", "slow-starter"]
    assert by_name["limited"].concurrency_limit == 2
    assert by_name["limited"].rate_limit is None
    assert by_name["metered"].rate_limit == RateLimit(per_second=20)


def test_gcra_allows_a_burst_then_spaces_starts() -> None:
    rate = RateLimit(per_second=10, burst=3)
    now = datetime(2026, 11, 30, 12, 0, 0)
    tat: datetime | None = None
    for _ in range(3):
        ok, tat = gcra(rate, tat, now)
        assert ok
    ok, when = gcra(rate, tat, now)
    assert not ok
    assert (when - now).total_seconds() == pytest.approx(0.1)
    ok, _ = gcra(rate, tat, when)
    assert ok
    assert rate_bucket(RateLimit(per_second=1), "t", "k") == ""
    assert rate_bucket(RateLimit(per_second=1, by="key"), "ab", "c") == "2:ab/c"
    assert rate_bucket(RateLimit(per_second=1, by="key"), "a", "b/c") == "1:a/b/c"


async def test_global_concurrency_limit_across_two_workers(
    settings: Settings, db: Database
) -> None:
    await _register(db)
    ids = [await _submit(db, settings, "limited", Job(n=i, work=0.05)) for i in range(10)]
    async with workers(settings, db, REGISTRY, count=2, concurrency=4):
        for run_id in ids:
            await reach(db, TENANT, run_id, "completed")
    assert GAUGE.peak == 2, GAUGE.peak
    assert sorted(GAUGE.order) == list(range(10))


async def test_rate_limit_spaces_first_starts_across_two_workers(
    settings: Settings, db: Database
) -> None:
    await _register(db)
    ids = [await _submit(db, settings, "metered", Job(n=i)) for i in range(8)]
    async with workers(settings, db, REGISTRY, count=2, concurrency=4):
        for run_id in ids:
            await reach(db, TENANT, run_id, "completed")
    starts = await _started(db, ids)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    # 20/s is one start per 50 ms on database time (SQLite keeps milliseconds).
    assert min(gaps) >= 0.049, gaps


async def test_rate_limit_per_key_buckets_are_independent(settings: Settings, db: Database) -> None:
    await _register(db)
    first = [
        await _submit(db, settings, "metered-per-key", Job(n=i), concurrency_key=f"k{i}")
        for i in range(4)
    ]
    async with workers(settings, db, REGISTRY, count=2, concurrency=4):
        for run_id in first:
            await reach(db, TENANT, run_id, "completed")
    starts = await _started(db, first)
    # Four keys, one start each: nothing spaces them (all conform on the first claim).
    assert (starts[-1] - starts[0]).total_seconds() < 0.1, starts


async def test_resuming_after_a_timer_spends_no_rate_budget(
    settings: Settings, db: Database
) -> None:
    await _register(db)
    napper = await _submit(db, settings, "slow-starter", Job(n=1, nap=0.2))
    async with workers(settings, db, REGISTRY, count=2, concurrency=4):
        await reach(db, TENANT, napper, "completed", timeout=30)
        # The budget (one start per 100 s) went to the first run: a second waits, deferred.
        second = await _submit(db, settings, "slow-starter", Job(n=2))

        async def deferred() -> datetime | None:
            async with db.read() as conn:
                row = (
                    await conn.execute(
                        select(runs.c.available_at, runs.c.status).where(runs.c.run_id == second)
                    )
                ).one()
            return row[0] if row[1] == "queued" and row[0] is not None else None

        async def pushed_back() -> bool:
            until = await deferred()
            async with db.read() as conn:
                created = (
                    await conn.execute(select(runs.c.created_at).where(runs.c.run_id == second))
                ).scalar_one()
            return until is not None and (until - created).total_seconds() > 60

        await wait_for(pushed_back, what="the second start deferred by the rate limit")


async def test_priority_orders_claims(settings: Settings, db: Database) -> None:
    await _register(db)
    priorities = [0, 50, -10, 100, 0, 50]
    for n, priority in enumerate(priorities):
        await _submit(db, settings, "ranked", Job(n=n), priority=priority)
    async with workers(settings, db, REGISTRY, count=1, concurrency=1):
        await wait_for(lambda: _done(len(priorities)), what="every ranked run executed", timeout=30)
    # Highest priority first; equal priorities in submission order.
    assert GAUGE.order == [3, 1, 5, 0, 4, 2]


async def _done(count: int) -> bool:
    return len(GAUGE.order) == count


async def test_priority_and_controls_over_http(settings: Settings, db: Database) -> None:
    await _register(db)
    async with api_client(settings, db, TENANT) as client:
        created = await client.post(
            "/runs", json={"workflow": "ranked", "input": {"n": 1}, "priority": -100}
        )
        assert created.status_code == 201, created.text
        assert created.json()["priority"] == -100
        shown = await client.get(f"/runs/{created.json()['run_id']}")
        assert shown.json()["priority"] == -100
        for bad in (101, -101, "5", 2.5, True, None):
            r = await client.post(
                "/runs", json={"workflow": "ranked", "input": {"n": 1}, "priority": bad}
            )
            assert r.status_code == 422, (bad, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert any(e["path"] == "body.priority" for e in r.json()["errors"]), r.json()
        async with db.read() as conn:
            count = len((await conn.execute(select(runs.c.run_id))).all())
        assert count == 1  # the refused submissions wrote nothing
        # An idempotent retry must repeat the priority: another one is a different request.
        first = await client.post(
            "/runs",
            json={"workflow": "ranked", "input": {"n": 2}, "priority": 5, "idempotency_key": "p"},
        )
        again = await client.post(
            "/runs",
            json={"workflow": "ranked", "input": {"n": 2}, "priority": 5, "idempotency_key": "p"},
        )
        other = await client.post(
            "/runs",
            json={"workflow": "ranked", "input": {"n": 2}, "priority": 6, "idempotency_key": "p"},
        )
        assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
        listed = (await client.get("/workflows")).json()["items"]
        controls = {w["name"]: w["versions"][0]["queue_controls"] for w in listed}
        assert controls["limited"] == {
            "key_limit": 1,
            "on_limit": "reject",
            "concurrency_limit": 2,
            "rate_limit": None,
        }
        assert controls["metered-per-key"]["rate_limit"] == {
            "per_second": 10.0,
            "burst": 1,
            "by": "key",
        }
        assert controls["ranked"]["concurrency_limit"] is None


async def test_suspended_tenant_is_refused_on_the_controlled_claim_paths(
    settings: Settings, db: Database
) -> None:
    from app.engine.tenants import TenantService

    await _register(db)
    ids = [
        await _submit(db, settings, "limited", Job(n=1)),
        await _submit(db, settings, "metered", Job(n=2)),
    ]
    await TenantService(db).suspend(tenant_id=TENANT, reason="unpaid", actor="ops")
    async with workers(settings, db, REGISTRY, count=2, concurrency=4):
        for run_id in ids:
            row = await reach(db, TENANT, run_id, "failed")
            assert row["reason"] == "failure_authorization"
    assert GAUGE.order == []  # no step of theirs ran
