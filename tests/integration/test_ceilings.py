"""Ceilings on both databases: each is a setting and ends runaway work with a clear error."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import func, insert, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.core import json
from app.core.errors import CeilingExceeded, PayloadTooLarge
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import events, runs, signals, steps
from app.engine import control
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import RetryPolicy, WorkflowContext, workflow
from tests.conftest import DEV_SECRET, make_settings
from tests.integration import support

TENANT = "ceil"
_ids = itertools.count()
calls: dict[str, int] = {}


class Job(BaseModel):
    key: str


def noop(i: int) -> int:
    return i


@workflow("c-steps")
async def many_steps(ctx: WorkflowContext, job: Job) -> str:
    for i in range(20):
        # Swallowing the ceiling must not let the run go on.
        with contextlib.suppress(CeilingExceeded):
            await ctx.step(noop, i)
    return "escaped the ceiling"


def always_fails(key: str) -> None:
    calls[key] = calls.get(key, 0) + 1
    raise ConnectionError("still down")


@workflow("c-attempts")
async def many_attempts(ctx: WorkflowContext, job: Job) -> None:
    policy = RetryPolicy(max_attempts=50, backoff="fixed", delay=0.01)
    await ctx.step(always_fails, job.key, retry=policy)


def big(n: int) -> str:
    return "x" * n


@workflow("c-payload")
async def big_output(ctx: WorkflowContext, job: Job) -> str:
    return await ctx.step(big, 5000)


@workflow("c-events")
async def chatty(ctx: WorkflowContext, job: Job) -> int:
    await ctx.signal("go")
    return await ctx.step(noop, 1)


@workflow("c-kid")
async def kid(ctx: WorkflowContext, job: Job) -> str:
    return job.key


@workflow("c-children")
async def many_children(ctx: WorkflowContext, job: Job) -> None:
    for i in range(5):
        await ctx.start_child(kid, {"key": f"{job.key}-{i}"})


REGISTRY = Registry([many_steps, many_attempts, big_output, chatty, kid, many_children])


@pytest.fixture
def csettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        tmp_path,
        max_payload_bytes=1024,
        max_steps_per_run=6,
        max_attempts_per_step=3,
        max_events_per_run=100,
        max_signals_buffered_per_run=3,
        max_children_per_run=2,
    )


async def _submit(db: Database, settings: Settings, name: str) -> Any:
    return await support.submit(db, settings, REGISTRY, TENANT, name, key=f"k{next(_ids)}")


async def _failed(db: Database, settings: Settings, run_id: Any) -> dict[str, Any]:
    async with support.workers(settings, db, REGISTRY):
        row = await support.reach(db, TENANT, run_id, "failed", "completed")
    assert row["status"] == "failed", row
    return {"reason": row["reason"], **json.loads(row["error"])}


async def test_steps_per_run(csettings: Settings, db: Database) -> None:
    run_id = await _submit(db, csettings, "c-steps")
    error = await _failed(db, csettings, run_id)
    assert error["reason"] == "failure_non_retryable"
    assert (error["type"], error["ceiling"], error["limit"]) == (
        "CeilingExceeded",
        "max_steps_per_run",
        6,
    )
    assert "TREADLE_MAX_STEPS_PER_RUN=6" in error["message"]


async def test_attempts_per_step_overrides_the_retry_policy(
    csettings: Settings, db: Database
) -> None:
    run_id = await _submit(db, csettings, "c-attempts")
    error = await _failed(db, csettings, run_id)
    assert error["reason"] == "failure_attempts_exhausted"
    assert "CeilingExceeded" in error["message"]
    async with db.read() as conn:
        key = json.loads((await conn.execute(select(runs.c.input))).scalar_one())["key"]
    assert calls[key] == 3  # the policy allowed 50
    assert "TREADLE_MAX_ATTEMPTS_PER_STEP=3" in error["message"]
    async with db.read() as conn:
        step_error = json.loads((await conn.execute(select(steps.c.error))).scalar_one())
    assert step_error["ceiling"] == "max_attempts_per_step"
    assert step_error["last_error"]["type"] == "ConnectionError"


async def test_payload_bytes(csettings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    submitter = Submitter(db, csettings)
    with pytest.raises(PayloadTooLarge, match="limit is 1024 bytes"):
        await submitter.submit(
            SubmitRequest(workflow="c-payload", input={"key": "y" * 2000}),
            tenant_id=TENANT,
            subject="s",
        )
    run_id = await _submit(db, csettings, "c-payload")
    error = await _failed(db, csettings, run_id)
    assert (error["reason"], error["type"]) == ("failure_non_retryable", "StepFailed")
    assert "PayloadTooLarge: step output is 5002 bytes encoded" in error["message"]
    with pytest.raises(PayloadTooLarge):
        await control.send_signal(
            db, csettings, tenant_id=TENANT, run_id=run_id, name="x", payload="z" * 2000,
            actor="op",
        )  # fmt: skip


async def test_events_per_run(csettings: Settings, db: Database) -> None:
    run_id = await _submit(db, csettings, "c-events")
    async with support.workers(csettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
        async with db.write() as conn:  # a timeline already at the ceiling
            await conn.execute(
                insert(events),
                [
                    {"run_id": run_id, "tenant_id": TENANT, "at": await db.now(), "kind": "x"}
                    for _ in range(100)
                ],
            )
        await control.send_signal(
            db, csettings, tenant_id=TENANT, run_id=run_id, name="go", payload=None, actor="op"
        )
        row = await support.reach(db, TENANT, run_id, "failed", "completed")
    error = json.loads(row["error"])
    assert (row["status"], error["ceiling"]) == ("failed", "max_events_per_run")
    assert "TREADLE_MAX_EVENTS_PER_RUN=100" in error["message"]


async def test_signals_buffered_per_run(csettings: Settings, db: Database, tmp_path: Path) -> None:
    run_id = await _submit(db, csettings, "c-events")  # queued: no worker, signals buffer
    for i in range(3):
        await control.send_signal(
            db, csettings, tenant_id=TENANT, run_id=run_id, name="other", payload=i, actor="op"
        )
    with pytest.raises(CeilingExceeded, match="TREADLE_MAX_SIGNALS_BUFFERED_PER_RUN=3"):
        await control.send_signal(
            db, csettings, tenant_id=TENANT, run_id=run_id, name="other", payload=3, actor="op"
        )
    # Over HTTP: 422 problem+json naming the ceiling, and nothing stored.
    app = create_app(csettings, db=db, check_schema_on_start=False)
    tok = DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject="op", scopes=["signals:write"])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://treadle"
    ) as client:
        resp = await client.post(
            f"/runs/{run_id}/signals/other",
            json={"payload": 4},
            headers={"Authorization": f"Bearer {tok}"},
        )
    assert resp.status_code == 422
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert (body["code"], body["ceiling"], body["limit"]) == (
        "ceiling_exceeded",
        "max_signals_buffered_per_run",
        3,
    )
    async with db.read() as conn:
        stored = (await conn.execute(select(func.count()).select_from(signals))).scalar_one()
    assert stored == 3


async def test_children_per_run(csettings: Settings, db: Database) -> None:
    run_id = await _submit(db, csettings, "c-children")
    error = await _failed(db, csettings, run_id)
    assert (error["type"], error["ceiling"]) == ("CeilingExceeded", "max_children_per_run")
    async with db.read() as conn:
        children = (
            await conn.execute(select(func.count()).where(runs.c.parent_run_id == run_id))
        ).scalar_one()
    assert children == 2
