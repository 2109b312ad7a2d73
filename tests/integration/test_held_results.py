"""Held step results (docs/adr/0047-held-step-results.md), on both dialects.

A plain step's result is held while the workflow's own code runs on after it and is
written with the run's next write: a run's last step commits with its completion (on
PostgreSQL one statement, ``complete_with_step``), a step followed by another is
committed before the next one starts, a result held past
``TREADLE_STEP_RESULT_HOLD_SECONDS`` is written alone, and an execution stopped while
a result is held writes it before it is given back. What the workflow logs or emits
after the step still follows the step's events in the timeline.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel
from sqlalchemy import select

from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import events, run_logs, steps
from app.engine.executor import execute_claim
from app.engine.registry import Registry
from app.engine.submit import Submitter
from app.sdk import WorkflowContext, workflow
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "held"

# Set by the tests, awaited by workflow code after its step (a wait that journals nothing).
gates: dict[str, asyncio.Event] = {}
# Set by the step itself: its call is over (the result is about to be held).
stepped: dict[str, asyncio.Event] = {}


class In(BaseModel):
    """Which gate the run waits on after its step (empty: none)."""

    gate: str = ""


def double(n: int) -> int:
    return n * 2


async def note(gate: str) -> int:
    if gate in stepped:
        stepped[gate].set()
    return 21


@workflow("held-one")
async def one_step(ctx: WorkflowContext, inp: In) -> int:
    """One plain step, then the end."""
    return await ctx.step(double, 21)


@workflow("held-chain")
async def chain(ctx: WorkflowContext, inp: In) -> int:
    """Three steps in a row: each result committed before the next step starts."""
    n = 1
    for _ in range(3):
        n = await ctx.step(double, n)
    return n


@workflow("held-talk")
async def talk(ctx: WorkflowContext, inp: In) -> int:
    """A step, then a line and an emit from the workflow's own code after it."""
    n = await ctx.step(double, 21)
    ctx.logger.info("after the step", n=n)
    ctx.emit("after-step", {"n": n})
    return n


@workflow("held-gate")
async def gated(ctx: WorkflowContext, inp: In) -> int:
    """A step, then workflow code awaiting something that is not durable."""
    n = await ctx.step(note, inp.gate)
    await gates[inp.gate].wait()
    return n


REGISTRY_ = Registry([one_step, chain, talk, gated])


def _rows(kind: str) -> float:
    return REGISTRY.get_sample_value("treadle_group_commit_rows_sum", {"kind": kind}) or 0.0


async def _timeline(db: Database, run_id: uuid.UUID) -> list[tuple[str, str | None]]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(events.c.kind, events.c.step_id)
                .where(events.c.run_id == run_id)
                .order_by(events.c.event_id)
            )
        ).all()
    return [(r[0], r[1]) for r in rows]


async def _step_rows(db: Database, run_id: uuid.UUID) -> list[tuple[str, str, str | None]]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(steps.c.step_id, steps.c.status, steps.c.output)
                .where(steps.c.run_id == run_id)
                .order_by(steps.c.seq)
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


@pytest.fixture
async def held_db(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Settings, Database]]:
    # A long hold, so that only the run's next write (or a stop) can send a result.
    settings = make_settings(database_url, tmp_path, step_result_hold_seconds=1.0)
    database = Database(settings)
    yield settings, database
    await database.dispose()


async def test_a_one_step_run_commits_its_step_with_its_completion(
    held_db: tuple[Settings, Database],
) -> None:
    settings, db = held_db
    run_id = await support.submit(db, settings, REGISTRY_, TENANT, "held-one")
    together, alone = _rows("complete_with_step"), _rows("step_done")
    async with support.workers(settings, db, REGISTRY_):
        row = await support.reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["output"]) == ("completed", "42")
    assert await _step_rows(db, run_id) == [("double", "succeeded", "42")]
    timeline = await _timeline(db, run_id)
    assert timeline[-3:] == [
        ("step_started", "double"),
        ("step_succeeded", "double"),
        ("run_completed", None),
    ]
    if db.dialect == "postgresql":
        # One statement after the claim: the whole attempt and the completion together.
        assert (_rows("complete_with_step") - together, _rows("step_done") - alone) == (1, 0)


async def test_each_step_commits_before_the_next_begins(
    held_db: tuple[Settings, Database],
) -> None:
    settings, db = held_db
    run_id = await support.submit(db, settings, REGISTRY_, TENANT, "held-chain")
    async with support.workers(settings, db, REGISTRY_):
        row = await support.reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["output"]) == ("completed", "8")
    assert [s for _, s, _ in await _step_rows(db, run_id)] == ["succeeded"] * 3
    kinds = [k for k, _ in await _timeline(db, run_id)]
    done = [k for k in kinds if k.startswith("step_")]
    # The held result of step n is written before step n+1's start: never interleaved.
    assert done == ["step_started", "step_succeeded"] * 3
    assert kinds[-1] == "run_completed"


async def test_lines_and_emits_after_a_step_follow_its_events(
    held_db: tuple[Settings, Database],
) -> None:
    settings, db = held_db
    run_id = await support.submit(db, settings, REGISTRY_, TENANT, "held-talk")
    async with support.workers(settings, db, REGISTRY_):
        row = await support.reach(db, TENANT, run_id, "completed", "failed")
    assert row["status"] == "completed"
    kinds = [k for k, _ in await _timeline(db, run_id)]
    assert kinds.index("step_succeeded") < kinds.index("emitted") < kinds.index("run_completed")
    async with db.read() as conn:
        lines = (
            await conn.execute(select(run_logs.c.message).where(run_logs.c.run_id == run_id))
        ).all()
    assert [json.loads(r[0]) for r in lines] == ["after the step"]


async def test_a_result_held_past_the_hold_is_written_alone(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path, step_result_hold_seconds=0.05)
    db = Database(settings)
    gate = f"past-{uuid.uuid4()}"
    gates[gate] = asyncio.Event()
    try:
        run_id = await support.submit(db, settings, REGISTRY_, TENANT, "held-gate", gate=gate)
        async with support.workers(settings, db, REGISTRY_):

            async def written() -> bool:
                return await _step_rows(db, run_id) == [("note", "succeeded", "21")]

            # The workflow is still awaiting its gate: only the hold's end wrote the result.
            await wait_for(written, timeout=30, what="the held result, written alone")
            async with db.read() as conn:
                assert (await runs_q.get_run(conn, TENANT, run_id))["status"] == "running"
            gates[gate].set()
            row = await support.reach(db, TENANT, run_id, "completed", "failed")
        assert (row["status"], row["output"]) == ("completed", "21")
        kinds = [k for k, _ in await _timeline(db, run_id)]
        assert kinds.count("step_succeeded") == 1 and kinds[-1] == "run_completed"
    finally:
        gates.pop(gate, None)
        await db.dispose()


async def test_a_stopped_execution_writes_its_held_result(
    held_db: tuple[Settings, Database],
) -> None:
    settings, db = held_db
    gate = f"stop-{uuid.uuid4()}"
    gates[gate] = asyncio.Event()
    stepped[gate] = asyncio.Event()
    try:
        run_id = await support.submit(db, settings, REGISTRY_, TENANT, "held-gate", gate=gate)
        async with db.write() as conn:
            (row,) = await runs_q.claim_runs(
                conn,
                worker_id="w-stop",
                definition_keys=REGISTRY_.keys,
                limit=1,
                lease_ttl=60,
            )
        definition = REGISTRY_.get("held-gate", "1")
        assert definition is not None
        execution = asyncio.create_task(
            execute_claim(db, settings, row, definition, "w-stop", Submitter(db, settings))
        )
        await asyncio.wait_for(stepped[gate].wait(), 30)
        # Within the 1 s hold: the drain's cancellation is what writes the result.
        execution.cancel()
        with pytest.raises(asyncio.CancelledError):
            await execution
        assert await _step_rows(db, run_id) == [("note", "succeeded", "21")]
        async with db.read() as conn:
            assert (await runs_q.get_run(conn, TENANT, run_id))["status"] == "running"
    finally:
        gates.pop(gate, None)
        stepped.pop(gate, None)
