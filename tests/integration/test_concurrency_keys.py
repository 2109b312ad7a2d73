"""Concurrency keys: at most one active run per (tenant, workflow, key), admitted atomically.

Over HTTP against an in-process API on both databases: 50 concurrent submissions with one
key admit exactly one run and answer 49 x 409 naming it; an identical idempotent retry
still gets the first run (200); the key is free again once the run is terminal; keys are
per workflow and per tenant; requeueing a dead run whose key was taken meanwhile is 409.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.settings import Settings
from app.core.status import TERMINAL_RUN_STATUSES
from app.db.database import Database
from app.db.tables import ACTIVE_CONCURRENCY_SLOT_WHERE, WAITING_FOR_SLOT_WHERE, runs
from app.engine.registry import Registry
from app.sdk import Permanent, WorkflowContext, workflow
from tests.conftest import WITH_PGBOUNCER
from tests.integration.support import api_client, reach, workers

TENANT = "keys"
BURST = 50


class Doc(BaseModel):
    """Input: which document, and whether the run should fail."""

    n: int = 0
    fail: bool = False


@workflow("keyed")
async def keyed(ctx: WorkflowContext, doc: Doc) -> int:
    """Completes at once, or fails permanently when asked to."""
    if doc.fail:
        raise Permanent(ValueError("asked to fail"))
    return doc.n


@workflow("keyed-other")
async def keyed_other(ctx: WorkflowContext, doc: Doc) -> int:
    """A second workflow: keys are per workflow."""
    return doc.n


REGISTRY = Registry([keyed, keyed_other])


def test_index_predicates_name_every_terminal_status() -> None:
    for status in TERMINAL_RUN_STATUSES:
        assert f"'{status.value}'" in ACTIVE_CONCURRENCY_SLOT_WHERE
        assert f"'{status.value}'" in WAITING_FOR_SLOT_WHERE


async def _active(db: Database, key: str) -> int:
    async with db.read() as conn:
        stmt = select(func.count()).where(
            runs.c.concurrency_key == key,
            runs.c.status.not_in([s.value for s in TERMINAL_RUN_STATUSES]),
        )
        return int((await conn.execute(stmt)).scalar_one())


@WITH_PGBOUNCER
async def test_one_active_run_per_key(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client:
        bodies: list[dict[str, Any]] = [
            {"workflow": "keyed", "input": {"n": i}, "concurrency_key": "doc-1"}
            for i in range(BURST)
        ]
        responses = await asyncio.gather(*(client.post("/runs", json=b) for b in bodies))
        winners = [r for r in responses if r.status_code == 201]
        assert len(winners) == 1, sorted(r.status_code for r in responses)
        first = winners[0].json()
        for r in responses:
            if r is winners[0]:
                continue
            assert r.status_code == 409, r.text
            assert r.headers["content-type"] == "application/problem+json"
            problem = r.json()
            assert problem["code"] == "concurrency_key_busy", problem
            assert problem["active_run_id"] == first["run_id"], problem
            assert (problem["concurrency_key"], problem["key_limit"]) == ("doc-1", 1), problem
            assert first["run_id"] in problem["detail"]
        assert await _active(db, "doc-1") == 1

        # An identical resubmission with the first run's idempotency key: the same run.
        body = {"workflow": "keyed", "input": {"n": 7}, "concurrency_key": "doc-2"}
        created = await client.post("/runs", json={**body, "idempotency_key": "i-2"})
        assert created.status_code == 201, created.text
        again = await client.post("/runs", json={**body, "idempotency_key": "i-2"})
        assert (again.status_code, again.json()["run_id"]) == (200, created.json()["run_id"])
        other_key = await client.post("/runs", json={**body, "idempotency_key": "i-3"})
        assert other_key.status_code == 409
        assert other_key.json()["active_run_id"] == created.json()["run_id"]

        # Keys are per workflow and per tenant.
        elsewhere = await client.post(
            "/runs", json={"workflow": "keyed-other", "concurrency_key": "doc-1"}
        )
        assert elsewhere.status_code == 201, elsewhere.text
        async with api_client(settings, db, "other-tenant") as other:
            theirs = await other.post(
                "/runs", json={"workflow": "keyed", "concurrency_key": "doc-1"}
            )
            assert theirs.status_code == 201, theirs.text

        # Once the holder is terminal, the key admits a new run.
        async with workers(settings, db, REGISTRY):
            await reach(db, TENANT, uuid.UUID(first["run_id"]), "completed")
        after = await client.post(
            "/runs", json={"workflow": "keyed", "input": {"n": 99}, "concurrency_key": "doc-1"}
        )
        assert after.status_code == 201, after.text
        assert after.json()["run_id"] != first["run_id"]
        assert await _active(db, "doc-1") == 1


async def test_requeue_refuses_a_taken_key(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        body = {"workflow": "keyed", "input": {"fail": True}, "concurrency_key": "doc-9"}
        dead = (await client.post("/runs", json=body)).json()
        await reach(db, TENANT, uuid.UUID(dead["run_id"]), "failed")
        # The key is free while the run is dead: a new run takes it and holds it.
        holder = await client.post(
            "/runs", json={"workflow": "keyed", "input": {"n": 1}, "concurrency_key": "doc-9"}
        )
        assert holder.status_code == 201, holder.text
        await reach(db, TENANT, uuid.UUID(holder.json()["run_id"]), "completed")
        holder2 = await client.post(
            "/runs",
            json={
                "workflow": "keyed",
                "input": {"n": 2},
                "concurrency_key": "doc-9",
                "delay": 3600,
            },
        )
        assert holder2.status_code == 201, holder2.text
        retry = await client.post(f"/runs/{dead['run_id']}/retry", json={"reason": "again"})
        assert retry.status_code == 409, retry.text
        assert retry.headers["content-type"] == "application/problem+json"
        assert retry.json()["code"] == "concurrency_key_busy"
        assert retry.json()["active_run_id"] == holder2.json()["run_id"]
        assert (retry.json()["concurrency_key"], retry.json()["key_limit"]) == ("doc-9", 1)
        stored = (await client.get(f"/runs/{dead['run_id']}")).json()
        assert stored["status"] == "failed"
