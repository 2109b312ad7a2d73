"""A requeue, a retry and a bulk retry give a failed run a fresh budget (both databases).

Each counter that can fail a run starts over when an operator puts the run back to work
(``POST /dead-letters/{id}/requeue``, ``POST /runs/{id}/retry``, ``POST /runs:retry``):
the step's attempts, its lost attempts (a ``running`` entry left by a dead worker, and the
run's lost claims that stand for a quick attempt's), the state machine's transitions. The
history keeps the old ones: the dead letter, the claims and the failure stay in the
timeline. See docs/guarantees.md.

A dead worker is simulated as a kill -9 leaves it: the run claimed by a worker that then
vanishes, its lease still owned and expired (and, for a step slow enough to write one, a
``running`` start record).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import select, update

from app.core import json
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import events, runs, steps
from app.engine.batches import BatchRunner
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from app.sdk.state_machine import StateMachine, state_machine
from app.worker.worker import Worker
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "acme"
PATHS = ["requeue", "retry", "bulk"]
_ids = itertools.count()
# Calls of a step body, by key: what the step does on each call is decided by the count.
calls: dict[str, int] = {}


class Key(BaseModel):
    key: str


def quick(key: str) -> str:
    calls[key] = calls.get(key, 0) + 1
    return f"done {key} on attempt {current_step().attempt}"


@workflow("fb-once")
async def once_flow(ctx: WorkflowContext, k: Key) -> str:
    return await ctx.step(quick, k.key, retry=RetryPolicy(max_attempts=1))


def fails_three_times(key: str) -> str:
    calls[key] = calls.get(key, 0) + 1
    if calls[key] <= 3:
        raise ConnectionError(f"call {calls[key]} fails")
    return f"done {key} on attempt {current_step().attempt}"


@workflow("fb-flaky")
async def flaky_flow(ctx: WorkflowContext, k: Key) -> str:
    # Two attempts a budget: calls 1-2 exhaust the first, 3 (fails) and 4 use a fresh one.
    policy = RetryPolicy(max_attempts=2, backoff="fixed", delay=0.01)
    return await ctx.step(fails_three_times, k.key, retry=policy)


class Loop(StateMachine):
    """The test machine: it goes round until its parent may finish."""


class Idle(Loop):
    """Initial."""


class Round(Loop):
    """One more round."""

    n: int


class Finished(Loop):
    """Terminal."""

    rounds: int


# Parents whose machine may reach its terminal state.
may_finish: set[str] = set()


@state_machine("fb-loop", initial=Idle, terminal=[Finished], max_transitions=2)
async def loop(parent: str, k: Key, state: Loop) -> Loop:
    """Idle → Round(1) → Round(2) … → Finished once ``parent`` is in :data:`may_finish`."""
    rounds = state.n if isinstance(state, Round) else 0
    if parent in may_finish:
        return Finished(rounds=rounds)
    return Round(n=rounds + 1)


REGISTRY = Registry([once_flow, flaky_flow, loop.definition])


async def _submit(client: httpx.AsyncClient, workflow_name: str, key: str) -> uuid.UUID:
    resp = await client.post("/runs", json={"workflow": workflow_name, "input": {"key": key}})
    assert resp.status_code == 201, resp.text
    return uuid.UUID(resp.json()["run_id"])


async def _run(db: Database, run_id: uuid.UUID) -> Any:
    async with db.read() as conn:
        return await runs_q.get_run(conn, TENANT, run_id)


async def _finished(db: Database, run_id: uuid.UUID) -> Any:
    async def probe() -> Any:
        row = await _run(db, run_id)
        return row if row["status"] in {"completed", "failed", "cancelled"} else None

    return await wait_for(probe, timeout=30, what=f"run {run_id} to finish")


@contextlib.asynccontextmanager
async def _worker(settings: Settings, db: Database) -> AsyncIterator[Worker]:
    worker = Worker(settings, db, REGISTRY, concurrency=8)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def _execute(settings: Settings, db: Database, run_id: uuid.UUID) -> Any:
    async with _worker(settings, db):
        return await _finished(db, run_id)


async def _die_claimed(db: Database, run_id: uuid.UUID, *, start_record: bool) -> None:
    """A worker claims the run, (maybe) journals an attempt's start, and is killed -9."""
    async with db.write() as conn:
        claimed = await runs_q.claim_runs(
            conn, worker_id="doomed", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
        )
        assert [r["run_id"] for r in claimed] == [run_id]
        if start_record:
            prior = (
                await conn.execute(
                    select(steps.c.attempt, steps.c.detail, steps.c.status).where(
                        steps.c.run_id == run_id
                    )
                )
            ).first()
            attempt, lost = 0, 0
            if prior is not None:
                attempt = int(prior[0])
                lost = int((json.loads(prior[1]) if prior[1] else {}).get("lost_attempts", 0))
                lost += prior[2] == "running"  # what the replay makes of it
            await steps_q.start_attempt(
                conn,
                run_id=run_id,
                tenant_id=TENANT,
                step_id="quick",
                seq=0,
                kind="step",
                name="quick",
                attempt=attempt + 1,
                max_attempts=1,
                fence=claimed[0]["fence"],
                detail=json.dumps({"lost_attempts": lost}) if lost else None,
            )
        # The dead worker's lease, expired: still owned, due again.
        past = claimed[0]["created_at"]
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(lease_expires_at=past, available_at=past)
        )


async def _put_back(
    path: str, client: httpx.AsyncClient, settings: Settings, db: Database, run_id: uuid.UUID
) -> None:
    """Requeue the failed run by ``path``; answered 200 (202 for a bulk retry, then done)."""
    body = {"reason": f"fresh budget by {path}", "correlation_id": "INC-34"}
    if path == "requeue":
        letters = (await client.get("/dead-letters")).json()["items"]
        (letter,) = [d for d in letters if d["run_id"] == str(run_id)]
        resp = await client.post(f"/dead-letters/{letter['dead_letter_id']}/requeue", json=body)
        assert resp.status_code == 200, resp.text
    elif path == "retry":
        resp = await client.post(f"/runs/{run_id}/retry", json=body)
        assert resp.status_code == 200, resp.text
    else:
        resp = await client.post(
            "/runs:retry", json={"run_ids": [str(run_id)], "reason": body["reason"]}
        )
        assert resp.status_code == 202, resp.text
        runner = BatchRunner(db, settings, worker_id="batch-runner")
        while await runner.run_once():
            pass
        batch = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert (batch["state"], batch["done"]) == ("completed", 1), batch
    assert (await _run(db, run_id))["status"] == "queued"


async def _kinds(db: Database, run_id: uuid.UUID) -> list[str]:
    async with db.read() as conn:
        found = await conn.execute(
            select(events.c.kind).where(events.c.run_id == run_id).order_by(events.c.event_id)
        )
        return [str(k) for k in found.scalars()]


async def _step(db: Database, run_id: uuid.UUID) -> tuple[str, int, dict[str, Any]]:
    async with db.read() as conn:
        status, attempt, detail = (
            await conn.execute(
                select(steps.c.status, steps.c.attempt, steps.c.detail).where(
                    steps.c.run_id == run_id
                )
            )
        ).one()
    return str(status), int(attempt), json.loads(detail) if detail else {}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("start_record", [True, False], ids=["running-entry", "lost-claims"])
async def test_lost_attempts_start_over(
    database_url: str, tmp_path: Any, db: Database, path: str, start_record: bool
) -> None:
    """Failed ``WorkerLost`` after 3 kill -9s, put back: 2 more kill -9s are forgiven again.

    ``running-entry``: each dead worker journaled the attempt's start (a slow step);
    ``lost-claims``: none did (a quick step, ADR 0040), the run's lost claims count them.
    """
    settings = make_settings(database_url, tmp_path, max_lost_attempts=2)
    async with db.write() as conn:
        await REGISTRY.register(conn)
    key = f"lost-{next(_ids)}"
    async with support.api_client(settings, db, TENANT) as client:
        run_id = await _submit(client, "fb-once", key)
        for _ in range(3):
            await _die_claimed(db, run_id, start_record=start_record)
        row = await _execute(settings, db, run_id)
        assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
        assert "WorkerLost" in row["error"]
        assert key not in calls  # every attempt was cut short

        await _put_back(path, client, settings, db, run_id)
        assert (await _run(db, run_id))["lost_claims"] == 0
        status, attempt, detail = await _step(db, run_id)
        assert (status, attempt, detail.get("lost_attempts")) == ("pending", 0, None)
        # A whole new budget: TREADLE_MAX_LOST_ATTEMPTS=2 lost attempts are forgiven again.
        for _ in range(2):
            await _die_claimed(db, run_id, start_record=start_record)
        row = await _execute(settings, db, run_id)
    assert (row["status"], row["output"]) == ("completed", f'"done {key} on attempt 3"'), row
    assert calls[key] == 1
    status, attempt, detail = await _step(db, run_id)
    assert (status, attempt, detail["lost_attempts"]) == ("succeeded", 3, 2)
    kinds = await _kinds(db, run_id)
    # The history keeps the first budget's failure and dead letter (the dead workers'
    # claims were made by hand, without their events: one real claim each side).
    assert kinds.count("run_claimed") == 2
    for kind in ("step_failed", "run_failed", "dead_letter_written", "dead_letter_requeued"):
        assert kinds.count(kind) == 1, kinds


@pytest.mark.parametrize("path", PATHS)
async def test_step_attempts_start_over(
    database_url: str, tmp_path: Any, db: Database, path: str
) -> None:
    """Failed after its 2 attempts, put back: the step gets 2 attempts again."""
    settings = make_settings(database_url, tmp_path)
    async with db.write() as conn:
        await REGISTRY.register(conn)
    key = f"flaky-{next(_ids)}"
    async with support.api_client(settings, db, TENANT) as client:
        run_id = await _submit(client, "fb-flaky", key)
        row = await _execute(settings, db, run_id)
        assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
        await _put_back(path, client, settings, db, run_id)
        row = await _execute(settings, db, run_id)
    assert (row["status"], row["output"]) == ("completed", f'"done {key} on attempt 2"'), row
    assert calls[key] == 4
    kinds = await _kinds(db, run_id)
    assert kinds.count("step_started") == 4  # every attempt of both budgets
    assert kinds.count("run_failed") == 1


@pytest.mark.parametrize("path", PATHS)
async def test_state_machine_transitions_start_over(
    database_url: str, tmp_path: Any, db: Database, path: str
) -> None:
    """Failed after ``max_transitions=2`` without a terminal state, put back: 2 more.

    The two journaled transitions replay from the journal and do not count against the
    new budget; the third reaches the terminal state. A second exhaustion after the
    requeue would fail again: the fresh budget is ``max_transitions``, not unbounded.
    """
    settings = make_settings(database_url, tmp_path)
    async with db.write() as conn:
        await REGISTRY.register(conn)
    parent = f"loop-{next(_ids)}"
    async with support.api_client(settings, db, TENANT) as client:
        resp = await client.post(
            "/runs",
            json={"workflow": "fb-loop", "input": {"key": parent}, "concurrency_key": parent},
        )
        assert resp.status_code == 201, resp.text
        run_id = uuid.UUID(resp.json()["run_id"])
        row = await _execute(settings, db, run_id)
        assert (row["status"], row["reason"]) == ("failed", "failure_transitions_exhausted")

        await _put_back(path, client, settings, db, run_id)
        may_finish.add(parent)
        row = await _execute(settings, db, run_id)
        assert row["status"] == "completed", row["error"]
        assert json.loads(row["output"]) == {"name": "Finished", "fields": {"rounds": 2}}

        # Exhausted again within the new budget: fails again, and is put back again.
        may_finish.discard(parent)
        second = f"{parent}-b"
        resp = await client.post(
            "/runs",
            json={"workflow": "fb-loop", "input": {"key": second}, "concurrency_key": second},
        )
        run_b = uuid.UUID(resp.json()["run_id"])
        row = await _execute(settings, db, run_b)
        assert row["reason"] == "failure_transitions_exhausted"
        await _put_back(path, client, settings, db, run_b)
        row = await _execute(settings, db, run_b)
        assert (row["status"], row["reason"]) == ("failed", "failure_transitions_exhausted")
        async with db.read() as conn:
            found = await conn.execute(
                select(steps.c.step_id).where(steps.c.run_id == run_b).order_by(steps.c.seq)
            )
            transitions = [str(s) for s in found.scalars()]
    # Two budgets of two transitions each, every one journaled once.
    assert transitions == [
        "transition-1:Idle",
        "transition-2:Round",
        "transition-3:Round",
        "transition-4:Round",
    ]
