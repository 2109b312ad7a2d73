"""A step attempt's ``started_at`` never predates what its run committed before it.

The executor stamps an attempt's start from an estimate of the database clock (the
claim's ``now()`` plus local monotonic time), written later with the attempt's record.
Counted from when the execution was built, that estimate lags the database by the claim's
round trip and the journal read: under load a join step of a DAG appeared to start before
the branches it waited for had finished (``test_dags::test_independent_nodes_run_in_
parallel`` failed in CI by 0.5 ms). ``RunExecution.attempt_started_at`` counts from before
the claim was sent, so it bounds the database clock from above; ``db_now`` (deadlines,
log lines) stays a bound from below. Both bounds are checked here against the database's
own clock, with the journal read made slow on purpose (as a loaded machine makes it).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from pydantic import BaseModel

from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.engine.executor import RunExecution
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import submit

TENANT = "clock"
SLOW_JOURNAL_READ_SECONDS = 0.05


class In(BaseModel):
    pass


@workflow(name="clock-plain", version="1")
async def plain(ctx: WorkflowContext, input: In) -> None:
    return None


REGISTRY = Registry([plain])


async def test_attempt_start_bounds_the_database_clock_from_above(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    run_id = await submit(db, settings, REGISTRY, TENANT, "clock-plain")
    sent = time.monotonic()
    async with db.write() as conn:
        rows = await runs_q.claim_runs(
            conn,
            worker_id="w-clock",
            definition_keys=REGISTRY.keys,
            limit=1,
            lease_ttl=settings.lease_ttl_seconds,
        )
    assert [r["run_id"] for r in rows] == [run_id]
    # A journal read as slow as a loaded machine makes it: the execution is built well
    # after the claim's now(), which is what made the old estimate lag.
    await asyncio.sleep(SLOW_JOURNAL_READ_SECONDS)
    async with db.read() as conn:
        entries = await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
    definition = REGISTRY.get("clock-plain", "1")
    assert definition is not None
    ex = RunExecution(db, settings, rows[0], definition, entries, "w-clock", claim_sent=sent)
    for _ in range(20):
        below = ex.db_now()
        async with db.read() as conn:
            clock = await fetch_now(conn, db.dialect)
        above = ex.attempt_started_at()
        # SQLite's clock has millisecond resolution (its text timestamps): a truncated
        # reading is up to 1 ms early, never late.
        slack = 0.001 if db.dialect == "sqlite" else 0.0
        assert below <= clock + timedelta(seconds=slack), (below, clock)
        assert above >= clock - timedelta(seconds=slack), (above, clock)
        # The two bounds differ by the time from sending the claim to building the
        # execution, the slow journal read included.
        assert (above - below).total_seconds() >= SLOW_JOURNAL_READ_SECONDS
