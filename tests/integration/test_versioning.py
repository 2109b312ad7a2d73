"""Versioning: ctx.patched replays old and new runs; blocked runs are visible, then migrated."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from app.core.errors import InvalidState, RunFinished, WorkflowNotFound
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import steps as steps_q
from app.engine import control, versioning
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import reach, submit, workers

TENANT = "acme"


class Expense(BaseModel):
    amount: int


calls: list[str] = []


def prepare(amount: int) -> int:
    calls.append("prepare")
    return amount


def audit(amount: int) -> str:
    calls.append("audit")
    return f"audited {amount}"


def pay(amount: int) -> str:
    calls.append("pay")
    return f"paid {amount}"


async def _old_body(ctx: WorkflowContext, inp: Expense) -> dict[str, Any]:
    amount = await ctx.step(prepare, inp.amount)
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, amount), "audit": None}


async def _patched_body(ctx: WorkflowContext, inp: Expense) -> dict[str, Any]:
    amount = await ctx.step(prepare, inp.amount)
    note = None
    if ctx.patched("audit-before-approval"):
        note = await ctx.step(audit, amount)
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, amount), "audit": note}


async def _unpatched_new_body(ctx: WorkflowContext, inp: Expense) -> dict[str, Any]:
    amount = await ctx.step(prepare, inp.amount)
    note = await ctx.step(audit, amount)  # inserted without ctx.patched
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, amount), "audit": note}


async def _deprecated_body(ctx: WorkflowContext, inp: Expense) -> dict[str, Any]:
    amount = await ctx.step(prepare, inp.amount)
    ctx.deprecate_patch("audit-before-approval")
    note = await ctx.step(audit, amount)
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, amount), "audit": note}


OLD = workflow("expense", version=1)(_old_body)
PATCHED = workflow("expense", version=1)(_patched_body)
UNPATCHED = workflow("expense", version=1)(_unpatched_new_body)
DEPRECATED = workflow("expense", version=1)(_deprecated_body)
PATCHED_V2 = workflow("expense", version=2)(_patched_body)


async def _approve(db: Database, run_id: uuid.UUID) -> None:
    await control.decide_approval(
        db,
        db.settings,
        tenant_id=TENANT,
        run_id=run_id,
        step_id="manager",
        subject="boss",
        groups=frozenset(),
        decision="approve",
        payload=None,
        comment=None,
    )


async def _journal_ids(db: Database, run_id: uuid.UUID) -> list[str]:
    async with db.read() as conn:
        rows = await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
    return [r["step_id"] for r in sorted(rows, key=lambda r: r["seq"])]


async def test_patched_replays_old_and_new_runs(settings: Settings, db: Database) -> None:
    old_registry = Registry([OLD])
    async with workers(settings, db, old_registry):
        old_run = await submit(db, settings, old_registry, TENANT, "expense", amount=10)
        await reach(db, TENANT, old_run, "waiting_approval")
    # Deploy: same version, new code with ctx.patched. Old run waits on its approval.
    new_registry = Registry([PATCHED])
    async with workers(settings, db, new_registry):
        new_run = await submit(db, settings, new_registry, TENANT, "expense", amount=20)
        await reach(db, TENANT, new_run, "waiting_approval")
        await _approve(db, old_run)
        await _approve(db, new_run)
        old_row = await reach(db, TENANT, old_run, "completed", "failed")
        new_row = await reach(db, TENANT, new_run, "completed", "failed")
    assert old_row["status"] == "completed", old_row["error"]
    assert new_row["status"] == "completed", new_row["error"]
    assert old_row["output"] == '{"paid":"paid 10","audit":null}'
    assert new_row["output"] == '{"paid":"paid 20","audit":"audited 20"}'
    assert await _journal_ids(db, old_run) == ["prepare", "manager", "pay"]
    assert await _journal_ids(db, new_run) == [
        "prepare",
        "patch:audit-before-approval",
        "audit",
        "manager",
        "pay",
    ]


async def test_unpatched_change_fails_old_runs_and_deprecate_patch_keeps_new_ones(
    settings: Settings, db: Database
) -> None:
    old_registry = Registry([OLD])
    patched_registry = Registry([PATCHED])
    async with workers(settings, db, old_registry):
        old_run = await submit(db, settings, old_registry, TENANT, "expense", amount=1)
        await reach(db, TENANT, old_run, "waiting_approval")
    async with workers(settings, db, patched_registry):
        new_run = await submit(db, settings, patched_registry, TENANT, "expense", amount=2)
        await reach(db, TENANT, new_run, "waiting_approval")
    # The same change without ctx.patched breaks the run that predates it ...
    async with workers(settings, db, Registry([UNPATCHED])):
        await _approve(db, old_run)
        old_row = await reach(db, TENANT, old_run, "completed", "failed")
    assert (old_row["status"], old_row["reason"]) == ("failed", "failure_nondeterminism")
    # ... while deprecate_patch keeps a run that journaled the marker aligned.
    async with workers(settings, db, Registry([DEPRECATED])):
        fresh = await submit(db, settings, Registry([DEPRECATED]), TENANT, "expense", amount=3)
        await reach(db, TENANT, fresh, "waiting_approval")
        await _approve(db, new_run)
        await _approve(db, fresh)
        new_row = await reach(db, TENANT, new_run, "completed", "failed")
        fresh_row = await reach(db, TENANT, fresh, "completed", "failed")
    assert new_row["status"] == "completed", new_row["error"]
    assert fresh_row["status"] == "completed", fresh_row["error"]
    assert "patch:audit-before-approval" not in await _journal_ids(db, fresh)


async def test_blocked_run_is_visible_then_migrated(settings: Settings, db: Database) -> None:
    old_registry = Registry([OLD])
    async with workers(settings, db, old_registry):
        run_id = await submit(db, settings, old_registry, TENANT, "expense", amount=5)
        await reach(db, TENANT, run_id, "waiting_approval")
    v2 = Registry([PATCHED_V2])
    async with workers(settings, db, v2) as (worker,):
        async with db.write() as conn:
            await v2.register(conn)
        await _approve(db, run_id)  # due again, but only expense@2 has a live worker
        blocked = await versioning.blocked_runs(db, settings, tenant_id=TENANT)
        assert [(b.run_id, b.workflow, b.version) for b in blocked] == [(run_id, "expense", "1")]
        assert blocked[0].reason == "no live worker has registered expense@1"
        counts = await versioning.open_runs_by_version(db, tenant_id=TENANT)
        assert counts == {("expense", "1"): 1}
        with pytest.raises(WorkflowNotFound):
            await versioning.migrate_run(
                db, settings, tenant_id=TENANT, run_id=run_id, version="7", actor="op"
            )
        with pytest.raises(InvalidState, match="newer"):
            await versioning.migrate_run(
                db, settings, tenant_id=TENANT, run_id=run_id, version="1", actor="op"
            )
        row = await versioning.migrate_run(
            db, settings, tenant_id=TENANT, run_id=run_id, version="2", actor="op"
        )
        assert row["version"] == "2"
        worker.wake()
        done = await reach(db, TENANT, run_id, "completed", "failed")
    assert done["status"] == "completed", done["error"]
    # v2's ctx.patched answered False: the run's journal was past that point.
    assert done["output"] == '{"paid":"paid 5","audit":null}'
    with pytest.raises(RunFinished):
        await versioning.migrate_run(
            db, settings, tenant_id=TENANT, run_id=run_id, version="2", actor="op"
        )
