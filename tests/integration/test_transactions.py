"""Transactional steps on both databases: business writes commit exactly once.

They commit with the step's checkpoint and are rolled back with it: on a lost fence, on a
failed attempt (then retried), on a permanent error or a result of the wrong type.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import events, steps
from app.engine import control
from app.engine.executor import RunExecution
from app.engine.registry import Registry
from app.sdk import Permanent, RetryPolicy, WorkflowContext, current_step, workflow
from tests.conftest import WITH_PGBOUNCER
from tests.helpers import wait_for
from tests.integration.support import reach, submit, workers

TENANT = "tx"

# The user's own table, in the same database as Treadle's (created by the test, as a
# user's migration would).
business = MetaData()
ledger = Table(
    "ledger",
    business,
    Column("entry_id", String(100), primary_key=True),
    Column("key", String(100), nullable=False),
    Column("amount", Integer, nullable=False),
)

calls: dict[str, int] = {}
gates: dict[str, asyncio.Event] = {}
_keys = itertools.count()


class Credit(BaseModel):
    key: str
    amount: int = 10
    fail_attempts: int = 0
    max_attempts: int = 3


class Entry(BaseModel):
    entry_id: str
    rows_seen: int


def gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


async def credit(tx: AsyncSession, req: Credit) -> Entry:
    """Insert one ledger row per attempt; fail the first ``fail_attempts`` attempts."""
    calls[req.key] = calls.get(req.key, 0) + 1
    attempt = current_step().attempt
    entry_id = f"{req.key}:{attempt}"
    await tx.execute(insert(ledger).values(entry_id=entry_id, key=req.key, amount=req.amount))
    seen = (
        await tx.execute(select(func.count()).select_from(ledger).where(ledger.c.key == req.key))
    ).scalar_one()
    if f"{req.key}:park" in gates:
        # Written, not yet committed: let the test move the fence now.
        gate(f"{req.key}:written").set()
        await asyncio.wait_for(gate(f"{req.key}:park").wait(), 20)
    if attempt <= req.fail_attempts:
        raise ConnectionError(f"transient failure on attempt {attempt}")
    return Entry(entry_id=entry_id, rows_seen=int(seen))


async def after(key: str) -> str:
    """Hang on the first call (the test 'crashes' the worker there); return afterwards."""
    calls[f"{key}:after"] = calls.get(f"{key}:after", 0) + 1
    if calls[f"{key}:after"] == 1:
        gate(f"{key}:after").set()
        await asyncio.Event().wait()
    return "after"


@workflow("tx-credit")
async def credit_flow(ctx: WorkflowContext, req: Credit) -> Entry:
    policy = RetryPolicy(max_attempts=req.max_attempts, backoff="fixed", delay=0.01)
    return await ctx.transaction(credit, req, retry=policy)


@workflow("tx-credit-then")
async def credit_then_flow(ctx: WorkflowContext, req: Credit) -> Entry:
    entry = await ctx.transaction(credit, req)
    await ctx.step(after, req.key)
    return entry


async def refuse(tx: AsyncSession, key: str) -> int:
    calls[key] = calls.get(key, 0) + 1
    await tx.execute(insert(ledger).values(entry_id=f"{key}:1", key=key, amount=1))
    raise Permanent(ValueError("account closed"))


@workflow("tx-permanent")
async def permanent_flow(ctx: WorkflowContext, req: Credit) -> int:
    return await ctx.transaction(refuse, req.key)


async def wrong_type(tx: AsyncSession, key: str) -> int:
    await tx.execute(insert(ledger).values(entry_id=f"{key}:1", key=key, amount=1))
    return "not an int"  # type: ignore[return-value]


@workflow("tx-wrong-type")
async def wrong_type_flow(ctx: WorkflowContext, req: Credit) -> int:
    return await ctx.transaction(wrong_type, req.key)


async def own_savepoint(tx: AsyncSession, key: str) -> int:
    """tx.rollback() undoes only this function's writes so far; tx.commit() ends nothing."""
    await tx.execute(insert(ledger).values(entry_id=f"{key}:a", key=key, amount=1))
    await tx.rollback()
    await tx.execute(insert(ledger).values(entry_id=f"{key}:b", key=key, amount=2))
    await tx.commit()
    await tx.execute(insert(ledger).values(entry_id=f"{key}:c", key=key, amount=3))
    return 2


@workflow("tx-savepoint")
async def savepoint_flow(ctx: WorkflowContext, req: Credit) -> int:
    return await ctx.transaction(own_savepoint, req.key)


async def stuck(tx: AsyncSession, key: str) -> int:
    calls[key] = calls.get(key, 0) + 1
    await tx.execute(insert(ledger).values(entry_id=f"{key}:{calls[key]}", key=key, amount=1))
    await asyncio.Event().wait()
    return 0


@workflow("tx-timeout")
async def timeout_flow(ctx: WorkflowContext, req: Credit) -> int:
    policy = RetryPolicy(max_attempts=2, backoff="fixed", delay=0.01)
    return await ctx.transaction(stuck, req.key, timeout=0.2, retry=policy)


REGISTRY = Registry(
    [credit_flow, credit_then_flow, permanent_flow, wrong_type_flow, savepoint_flow, timeout_flow]
)


def new_key() -> str:
    return f"k{next(_keys)}-{uuid.uuid4().hex[:6]}"


async def create_ledger(db: Database) -> None:
    async with db.write() as conn:
        await conn.run_sync(business.create_all)


async def ledger_rows(db: Database, key: str) -> list[str]:
    async with db.read() as conn:
        rows = await conn.execute(select(ledger.c.entry_id).where(ledger.c.key == key))
        return sorted(r[0] for r in rows)


async def journal(db: Database, run_id: uuid.UUID) -> dict[str, Any]:
    async with db.read() as conn:
        rows = await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
    return {r["step_id"]: r for r in rows}


async def claim_execution(
    db: Database, settings: Settings, run_id: uuid.UUID, worker_id: str
) -> RunExecution:
    """Claim the run as a hand-driven worker and build its execution (no release on exit)."""
    async with db.write() as conn:
        rows = await runs_q.claim_runs(
            conn,
            worker_id=worker_id,
            definition_keys=REGISTRY.keys,
            limit=1,
            lease_ttl=settings.lease_ttl_seconds,
        )
    assert [r["run_id"] for r in rows] == [run_id]
    async with db.read() as conn:
        entries = await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
    definition = REGISTRY.get(rows[0]["workflow"], rows[0]["version"])
    assert definition is not None
    return RunExecution(db, settings, rows[0], definition, entries, worker_id)


@WITH_PGBOUNCER
async def test_commits_once_across_a_crash_and_replay(settings: Settings, db: Database) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-credit-then", key=key)
    # A first worker commits the transaction, then dies inside the next step (its task is
    # dropped without releasing the run, as a kill -9 would).
    execution = await claim_execution(db, settings, run_id, "doomed-worker")
    doomed = asyncio.create_task(execution.execute())
    await asyncio.wait_for(gate(f"{key}:after").wait(), 20)
    assert await ledger_rows(db, key) == [f"{key}:1"]
    entry = (await journal(db, run_id))["credit"]
    assert (entry["kind"], entry["status"], entry["attempt"]) == ("transaction", "succeeded", 1)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    # The lease expires; another worker replays the run from the journal.
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert row["status"] == "completed"
    assert row["output"] == f'{{"entry_id":"{key}:1","rows_seen":1}}'
    assert calls[key] == 1  # the transaction was not run again on replay
    assert calls[f"{key}:after"] == 2
    assert await ledger_rows(db, key) == [f"{key}:1"]


@WITH_PGBOUNCER
async def test_lost_fence_rolls_back(settings: Settings, db: Database) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-credit", key=key)
    execution = await claim_execution(db, settings, run_id, "stale-worker")
    # The run is cancelled after the claim: the fence moves, the execution holds the old one.
    await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="test")
    with pytest.raises(LeaseLost):
        await execution.execute()
    assert calls[key] == 1  # the function ran and wrote its row inside the transaction...
    assert await ledger_rows(db, key) == []  # ...which the failed fenced UPDATE rolled back
    assert "credit" not in await journal(db, run_id)
    async with db.read() as conn:
        row = await runs_q.get_run(conn, TENANT, run_id)
    assert row["status"] == "cancelled"


async def test_fence_moved_during_the_transaction_rolls_back(
    settings: Settings, db: Database
) -> None:
    if db.dialect == "sqlite":
        pytest.skip("SQLite: the transaction holds the write lock, so a cancel waits for it")
    await create_ledger(db)
    key = new_key()
    gate(f"{key}:park")
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-credit", key=key)
    async with workers(settings, db, REGISTRY) as [worker]:
        await asyncio.wait_for(gate(f"{key}:written").wait(), 20)
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="test")
        gate(f"{key}:park").set()

        async def abandoned() -> bool:
            return worker.stats.lease_lost >= 1

        await wait_for(abandoned, timeout=20, what="the worker to lose its lease")
    assert await ledger_rows(db, key) == []
    assert "credit" not in await journal(db, run_id)
    row = await reach(db, TENANT, run_id, "cancelled")
    assert row["reason"] == "canceled_by_request"


async def test_failed_attempts_roll_back_then_retry_succeeds(
    settings: Settings, db: Database
) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-credit", key=key, fail_attempts=2)
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert row["status"] == "completed"
    # Attempts 1 and 2 inserted their own rows and raised: only attempt 3's row remains,
    # and it saw no row of the failed attempts.
    assert await ledger_rows(db, key) == [f"{key}:3"]
    assert row["output"] == f'{{"entry_id":"{key}:3","rows_seen":1}}'
    entry = (await journal(db, run_id))["credit"]
    assert (entry["status"], entry["attempt"]) == ("succeeded", 3)
    async with db.read() as conn:
        kinds = (
            await conn.execute(
                select(events.c.kind).where(events.c.run_id == run_id, events.c.step_id == "credit")
            )
        ).scalars()
        assert list(kinds) == [
            "step_started",
            "step_retry_scheduled",
            "step_started",
            "step_retry_scheduled",
            "step_started",
            "step_succeeded",
        ]


async def test_exhausted_retries_leave_no_row(settings: Settings, db: Database) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(
        db, settings, REGISTRY, TENANT, "tx-credit", key=key, fail_attempts=5, max_attempts=2
    )
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    assert calls[key] == 2
    assert await ledger_rows(db, key) == []
    entry = (await journal(db, run_id))["credit"]
    assert (entry["status"], entry["attempt"]) == ("failed", 2)


@pytest.mark.parametrize("workflow_name", ["tx-permanent", "tx-wrong-type"])
async def test_permanent_error_or_bad_result_rolls_back_at_once(
    settings: Settings, db: Database, workflow_name: str
) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, workflow_name, key=key)
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["reason"]) == ("failed", "failure_non_retryable")
    assert await ledger_rows(db, key) == []
    async with db.read() as conn:
        attempts = (
            await conn.execute(select(steps.c.attempt).where(steps.c.run_id == run_id))
        ).scalars()
        assert list(attempts) == [1]


async def test_session_commit_and_rollback_stay_inside_the_step(
    settings: Settings, db: Database
) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-savepoint", key=key)
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["output"]) == ("completed", "2")
    assert await ledger_rows(db, key) == [f"{key}:b", f"{key}:c"]
    entry = (await journal(db, run_id))["own_savepoint"]
    assert (entry["kind"], entry["status"]) == ("transaction", "succeeded")


async def test_timed_out_attempts_roll_back(settings: Settings, db: Database) -> None:
    await create_ledger(db)
    key = new_key()
    run_id = await submit(db, settings, REGISTRY, TENANT, "tx-timeout", key=key)
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["reason"]) == ("failed", "failure_timed_out")
    assert calls[key] == 2
    assert await ledger_rows(db, key) == []
    entry = (await journal(db, run_id))["stuck"]
    assert (entry["status"], entry["attempt"]) == ("timed_out", 2)
