"""``ctx.set_label`` is journaled like a value: a replay writes nothing and keeps the value.

In-process workers (tests/integration/support.py) on both databases: the run sets a label,
parks on a signal, the code's value changes, the signal replays the body. Also a label
the rules refuse fails the run with the rule in its error, and journals nothing.
"""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import run_labels
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import api_client, reach, submit, workers

TENANT = "labels"
# What the workflow passes to set_label: changed by the test between executions, as a
# deploy of new code would.
CURRENT = {"value": "first"}


class Empty(BaseModel):
    """No input."""


@workflow("labels-replay")
async def replayed(ctx: WorkflowContext, _: Empty) -> str:
    """Label, wait for ``go`` (the replay point), label the next stage."""
    await ctx.set_label("stage", CURRENT["value"])
    await ctx.signal("go")
    await ctx.set_label("stage", "done")
    await ctx.set_label("after", CURRENT["value"])
    return "ok"


@workflow("labels-refused")
async def refused(ctx: WorkflowContext, _: Empty) -> str:
    """A label key with a space: the rules refuse it."""
    await ctx.set_label("bad key", "x")
    return "unreachable"


REGISTRY = Registry([replayed, refused])


async def test_replay_keeps_the_journaled_label(settings: Settings, db: Database) -> None:
    CURRENT["value"] = "first"
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        run_id = await submit(db, settings, REGISTRY, TENANT, "labels-replay")
        await reach(db, TENANT, run_id, "waiting_signal")
        assert (await client.get(f"/runs/{run_id}")).json()["labels"] == {"stage": "first"}
        CURRENT["value"] = "second"
        sent = await client.post(f"/runs/{run_id}/signals/go", json={"payload": None})
        assert sent.status_code == 202, sent.text
        await reach(db, TENANT, run_id, "completed")
        run = (await client.get(f"/runs/{run_id}")).json()
        steps = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
        found = (
            await client.get("/runs", params={"label.stage": "done", "label.after": "second"})
        ).json()["items"]
    # The first label was replayed from the journal ("first" is gone only because the run
    # itself set "done" later); the code's "second" reached only the new call.
    assert run["labels"] == {"stage": "done", "after": "second"}
    labels = [s for s in steps if s["name"] == "label"]
    assert [s["output"] for s in labels] == [
        {"key": "stage", "value": "first"},
        {"key": "stage", "value": "done"},
        {"key": "after", "value": "second"},
    ]
    assert [r["run_id"] for r in found] == [str(run_id)]
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(run_labels.c.key, run_labels.c.value).where(run_labels.c.run_id == run_id)
            )
        ).all()
    assert sorted(tuple(r) for r in rows) == [("after", "second"), ("stage", "done")]


async def test_a_refused_label_fails_the_run(settings: Settings, db: Database) -> None:
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        run_id = await submit(db, settings, REGISTRY, TENANT, "labels-refused")
        row = await reach(db, TENANT, run_id, "failed")
        run = (await client.get(f"/runs/{run_id}")).json()
        steps = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
    assert row["reason"] == "failure_non_retryable"
    assert "A-Z a-z 0-9" in str(run["error"])
    assert run["labels"] == {}
    assert steps == []


async def test_label_filters_never_see_another_tenants_runs(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    seen: dict[str, str] = {}
    for tenant in ("labels-a", "labels-b"):
        async with api_client(settings, db, tenant) as client:
            made = await client.post(
                "/runs",
                json={"workflow": "labels-refused", "labels": {"customer": "42"}},
            )
            assert made.status_code == 201, made.text
            seen[tenant] = made.json()["run_id"]
    for tenant in ("labels-a", "labels-b"):
        async with api_client(settings, db, tenant) as client:
            listed = (await client.get("/runs", params={"label.customer": "4*"})).json()
            counts = (await client.get("/runs/counts", params={"label.customer": "42"})).json()
        assert [r["run_id"] for r in listed["items"]] == [seen[tenant]]
        assert counts["total"] == 1
