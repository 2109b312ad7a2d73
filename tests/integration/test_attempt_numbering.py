"""An attempt counts when it starts running: a worker lost in a retry backoff costs none.

Both databases. A lost worker is simulated as a kill -9 leaves it: the run claimed by a
worker that journaled what it had done (attempt 1 failed, its retry scheduled) and then
vanished, its lease still owned and expired. The real worker that takes the run over must
number the step's next attempt 2, however many workers died in the backoff, and must not
fail it ``WorkerLost``: no attempt ran. The same crash with real processes at every point
of a backoff is tests/acceptance/test_crash_attempts.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select, update

from app.core import json
from app.core.settings import Settings
from app.core.status import StepStatus
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.db.tables import events, runs, steps
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from app.worker.worker import Worker
from tests.conftest import make_settings
from tests.helpers import wait_for

TENANT = "acme"
_ids = itertools.count()
# The attempt numbers each key's step body saw, in order.
seen: dict[str, list[int]] = {}


class Key(BaseModel):
    key: str


def fails_first(key: str) -> str:
    attempt = current_step().attempt
    seen.setdefault(key, []).append(attempt)
    if attempt == 1:
        raise ConnectionError("attempt 1 fails")
    return f"ok on attempt {attempt}"


@workflow("an-flaky")
async def flaky_flow(ctx: WorkflowContext, k: Key) -> str:
    policy = RetryPolicy(max_attempts=2, backoff="fixed", delay=0.01)
    return await ctx.step(fails_first, k.key, retry=policy)


REGISTRY = Registry([flaky_flow])


@contextlib.asynccontextmanager
async def _worker(settings: Settings, db: Database) -> AsyncIterator[Worker]:
    worker = Worker(settings, db, REGISTRY, concurrency=4)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def _submit(db: Database, settings: Settings, key: str) -> uuid.UUID:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    row, _ = await Submitter(db, settings).submit(
        SubmitRequest(workflow="an-flaky", input={"key": key}), tenant_id=TENANT, subject="t"
    )
    return uuid.UUID(str(row["run_id"]))


async def _finished(db: Database, run_id: uuid.UUID) -> Any:
    async def probe() -> Any:
        async with db.read() as conn:
            row = await runs_q.get_run(conn, TENANT, run_id)
        return row if row["status"] in {"completed", "failed"} else None

    return await wait_for(probe, timeout=30, what=f"run {run_id} to finish")


async def _die(db: Database, run_id: uuid.UUID, *, journal: str) -> None:
    """A worker claims the run, journals ``journal``, and is killed -9 (lease left owned).

    ``journal``: ``failed-1`` (attempt 1 ran and failed, its retry scheduled: the worker
    dies in the backoff), ``nothing`` (it dies in the backoff again, before attempt 2),
    ``started-2`` (the backoff was over: attempt 2 began and its start record is written).
    """
    async with db.write() as conn:
        claimed = await runs_q.claim_runs(
            conn, worker_id="doomed", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
        )
        assert [r["run_id"] for r in claimed] == [run_id]
        fence = claimed[0]["fence"]
        common: dict[str, Any] = {"run_id": run_id, "tenant_id": TENANT, "step_id": "fails_first"}
        if journal in ("failed-1", "started-2"):
            await steps_q.start_attempt(
                conn,
                **common,
                seq=0,
                kind="step",
                name="fails_first",
                attempt=1 if journal == "failed-1" else 2,
                max_attempts=2,
                fence=fence,
                detail=None,
            )
        if journal == "failed-1":
            error = json.dumps({"type": "ConnectionError", "message": "attempt 1 fails"})
            await steps_q.finish_attempt(
                conn,
                **common,
                status=StepStatus.RETRY_WAIT,
                output=None,
                error=error,
                fence=fence,
                retry_in=0.0,
            )
        past = claimed[0]["created_at"]
        # A step write ends the run's series of lost claims, as the journal's writes do.
        progress = {} if journal == "nothing" else {"lost_claims": 0}
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(lease_expires_at=past, available_at=past, **progress)
        )


async def _step(db: Database, run_id: uuid.UUID) -> tuple[int, dict[str, Any]]:
    async with db.read() as conn:
        attempt, detail = (
            await conn.execute(
                select(steps.c.attempt, steps.c.detail).where(steps.c.run_id == run_id)
            )
        ).one()
    return int(attempt), json.loads(detail) if detail else {}


async def _started(db: Database, run_id: uuid.UUID) -> list[int]:
    async with db.read() as conn:
        found = await conn.execute(
            select(events.c.data)
            .where(events.c.run_id == run_id, events.c.kind == "step_started")
            .order_by(events.c.event_id)
        )
        return [int(json.loads(d)["attempt"]) for d in found.scalars()]


async def test_workers_lost_in_a_backoff_cost_no_attempt(
    database_url: str, tmp_path: Any, db: Database
) -> None:
    """Attempt 1 failed; three workers die in its backoff (more than may be lost): attempt 2.

    The first died having journaled attempt 1's failure and retry; the other two took the
    run over and died in what was left of the backoff, before attempt 2 began.
    """
    settings = make_settings(database_url, tmp_path, max_lost_attempts=2)
    key = f"backoff-{next(_ids)}"
    run_id = await _submit(db, settings, key)
    await _die(db, run_id, journal="failed-1")
    for _ in range(2):
        await _die(db, run_id, journal="nothing")
    async with _worker(settings, db):
        row = await _finished(db, run_id)
    assert (row["status"], row["output"]) == ("completed", '"ok on attempt 2"'), row["error"]
    assert seen[key] == [2]  # attempt 1 ran on the dead worker
    attempt, detail = await _step(db, run_id)
    assert (attempt, detail.get("lost_attempts")) == (2, None)
    # The attempt after the backoff journaled its start before it ran, as a slow one does.
    assert await _started(db, run_id) == [2]
    async with db.read() as conn:
        lost = (
            await conn.execute(select(runs.c.lost_claims).where(runs.c.run_id == run_id))
        ).scalar_one()
    assert lost == 0  # attempt 2's start record ended the series


async def test_a_worker_lost_in_the_attempt_after_a_backoff_loses_that_attempt(
    database_url: str, tmp_path: Any, db: Database
) -> None:
    """Attempt 2 began (its start record written) and its worker died: attempt 3 runs."""
    settings = make_settings(database_url, tmp_path)
    key = f"after-{next(_ids)}"
    run_id = await _submit(db, settings, key)
    await _die(db, run_id, journal="failed-1")
    await _die(db, run_id, journal="started-2")
    async with _worker(settings, db):
        row = await _finished(db, run_id)
    # Attempt 2 was lost, not failed: the step's second real try is attempt 3.
    assert (row["status"], row["output"]) == ("completed", '"ok on attempt 3"'), row["error"]
    assert seen[key] == [3]
    attempt, detail = await _step(db, run_id)
    assert (attempt, detail["lost_attempts"]) == (3, 1)
