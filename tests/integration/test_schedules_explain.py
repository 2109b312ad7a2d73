"""Every statement on ``schedules`` and ``schedule_fires`` runs on a tenant-leading key.

PostgreSQL only (the plans are PostgreSQL's). The test loads 20,000 schedules of 50
tenants with ten fires each (``generate_series``), VACUUM ANALYZEs, then records every
SQL statement that the code under test sends while it does what the API and the
scheduler loop do with a ``buffer_one`` schedule: create, list, get, patch, pause,
resume, three scheduler passes (started, buffered, the buffered tick released once its
run is cancelled), trigger now, read its fires, delete. Each recorded statement that
names either table is explained with its own parameters, under a custom and a generic
plan (what a prepared statement ends up with). No plan may read either table with a
``Seq Scan``, and every index scan of them must have ``tenant_id`` in its index
condition, except the scheduler's two global scans for due work (``ix_schedules_due``,
``ix_schedules_buffered``: docs/adr/0034-tenant-leading-keys.md, revision 0024). The
fire's ``ON CONFLICT`` must arbitrate on the tenant-leading primary key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text

from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import schedules as sched_q
from app.engine import control
from app.engine import schedules as engine
from app.engine.registry import Registry
from app.engine.submit import Submitter
from app.sdk import WorkflowContext, workflow
from tests.conftest import make_settings
from tests.integration.support import record_statements

TENANT = "t7"
T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
# The scans that serve the scheduler loop across tenants, by design.
GLOBAL_SCANS = {"ix_schedules_due", "ix_schedules_buffered"}
TABLES = re.compile(r"\b(schedules|schedule_fires)\b")


class Nothing(BaseModel):
    pass


@workflow("explain-sched")
async def explain_flow(ctx: WorkflowContext, inp: Nothing) -> str:
    return "ok"


# 400 schedules per tenant, none due before T0 + 30 days; ten past fires each.
LOAD_SCHEDULES = """
INSERT INTO schedules (schedule_id, tenant_id, name, workflow, input, cron, timezone,
                       overlap, catchup_window_seconds, jitter_seconds, state,
                       next_tick_at, next_fire_at, created_by, access, created_at, updated_at)
SELECT gen_random_uuid(), 't' || (i % 50), 'bulk-' || i, 'explain-sched', '{}', '0 * * * *',
       'UTC', 'skip', 60, 0, CASE WHEN i % 10 = 0 THEN 'paused' ELSE 'active' END,
       :later, :later, 'alice', 'tenant', :t0, :t0
FROM generate_series(1, 20000) AS i
"""
LOAD_FIRES = """
INSERT INTO schedule_fires (tenant_id, schedule_id, tick, kind, outcome, run_id,
                            fired_at, fired_by)
SELECT s.tenant_id, s.schedule_id, CAST(:t0 AS timestamptz) - n * interval '1 hour',
       'cron', 'started', gen_random_uuid(), CAST(:t0 AS timestamptz) - n * interval '1 hour',
       'scheduler:bulk'
FROM schedules s, generate_series(1, 10) AS n
"""


@pytest.fixture
def pg_url(make_pg_database: Callable[[], str]) -> str:
    """A fresh migrated PostgreSQL database (the plans checked are PostgreSQL's)."""
    return make_pg_database()


def _recording(db: Database, into: list[tuple[str, Any]]) -> Callable[[], None]:
    """Record ``(statement, parameters)`` of every statement ``db`` sends; returns a stop."""
    return record_statements(db, TABLES, into)


def _problems(plan: dict[str, Any]) -> tuple[list[str], set[str]]:
    """What breaks the rule in one plan, and the indexes of the two tables it used."""
    bad: list[str] = []
    used: set[str] = set()
    stack = [plan["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        relation = node.get("Relation Name")
        index = node.get("Index Name", "")
        if node["Node Type"] == "Seq Scan" and relation in ("schedules", "schedule_fires"):
            bad.append(f"Seq Scan on {relation}")
        if relation in ("schedules", "schedule_fires") or index.startswith(
            ("pk_schedule", "ix_schedule", "uq_schedules")
        ):
            arbiters = node.get("Conflict Arbiter Indexes", [])
            used.update(arbiters)
            fire_insert = relation == "schedule_fires" and node["Node Type"] == "ModifyTable"
            if fire_insert and arbiters and arbiters != ["pk_schedule_fires"]:
                bad.append(f"ON CONFLICT arbitrates on {arbiters}")
            if index:
                used.add(index)
                cond = node.get("Index Cond", "")
                if index not in GLOBAL_SCANS and "tenant_id" not in cond:
                    bad.append(f"{node['Node Type']} using {index} without tenant_id: {cond!r}")
    return bad, used


async def _exercise(db: Database, settings: Settings) -> None:
    """What the API and a scheduler loop do with one ``buffer_one`` schedule of TENANT."""
    submitter = Submitter(db, settings)
    sched = await engine.create_schedule(
        db,
        submitter,
        engine.ScheduleSpec(
            name="explained",
            workflow="explain-sched",
            cron="* * * * *",
            overlap=engine.Overlap.BUFFER_ONE,
            catchup_window_seconds=3600,
        ),
        tenant_id=TENANT,
        subject="alice",
        now=T0,
    )
    sid = sched["schedule_id"]
    async with db.read() as conn:
        await sched_q.list_schedules(
            conn, TENANT, workflow=None, state=None, before_id=None, limit=51, owner="alice"
        )
        await sched_q.get_schedule(conn, TENANT, sid, owner="alice")
    await engine.update_schedule(
        db, submitter, tenant_id=TENANT, schedule_id=sid, changes={"name": "renamed"}, now=T0
    )
    await engine.set_paused(db, tenant_id=TENANT, schedule_id=sid, paused=True, now=T0)
    await engine.set_paused(db, tenant_id=TENANT, schedule_id=sid, paused=False, now=T0)
    clock = engine.VirtualClock(T0)
    scheduler = engine.Scheduler(db, settings, submitter=submitter, clock=clock)
    clock.advance(60)
    assert (await scheduler.run_once()).started == 1
    clock.advance(60)
    assert (await scheduler.run_once()).buffered == 1
    async with db.read() as conn:
        fires = await sched_q.list_fires(conn, TENANT, sid, before_tick=None, limit=10)
    first = next(f["run_id"] for f in fires if f["outcome"] == "started")
    await control.cancel(db, tenant_id=TENANT, run_id=first, actor="op", reason=None)
    assert (await scheduler.run_once()).started == 1  # the buffered tick, released
    fire = await engine.trigger_now(
        db, submitter, tenant_id=TENANT, schedule_id=sid, actor="alice", now=clock.current
    )
    async with db.read() as conn:
        await sched_q.get_fire(conn, TENANT, sid, fire.tick)
        await sched_q.list_fires(conn, TENANT, sid, before_tick=fire.tick, limit=101)
    async with db.write() as conn:
        await sched_q.delete_schedule(conn, TENANT, sid, owner="alice")


@pytest.mark.timeout(300)
async def test_schedule_statements_use_tenant_leading_keys(pg_url: str, tmp_path: Path) -> None:
    settings = make_settings(pg_url, tmp_path)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([explain_flow]).register(conn)
            await conn.execute(text("SET LOCAL statement_timeout = 0"))
            params = {"t0": T0, "later": T0 + timedelta(days=30)}
            await conn.execute(text(LOAD_SCHEDULES), params)
            await conn.execute(text(LOAD_FIRES), params)
        async with db.autocommit() as conn:
            await conn.execute(text("SET statement_timeout = 0"))
            await conn.execute(text("VACUUM ANALYZE schedules"))
            await conn.execute(text("VACUUM ANALYZE schedule_fires"))
        statements: list[tuple[str, Any]] = []
        stop = _recording(db, statements)
        try:
            await _exercise(db, settings)
        finally:
            stop()
        distinct = {s: p for s, p in statements}
        bad: list[str] = []
        used: set[str] = set()
        async with db.write() as conn:
            for mode in ("auto", "force_generic_plan"):
                await conn.execute(text(f"SET LOCAL plan_cache_mode = {mode}"))
                for statement, parameters in distinct.items():
                    result = await conn.exec_driver_sql(
                        "EXPLAIN (FORMAT JSON) " + statement, parameters
                    )
                    raw = result.scalar_one()
                    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]
                    problems, indexes = _problems(plan)
                    used |= indexes
                    bad += [f"[{mode}] {p}\n    {statement}" for p in problems]
            await conn.rollback()
        assert not bad, "\n".join(bad)
        # Not vacuous: the statements reached every key and both global scans.
        assert {
            "pk_schedules",
            "pk_schedule_fires",
            "uq_schedules_tenant_id_name",
            "ix_schedules_due",
            "ix_schedules_buffered",
        } <= used, used
        assert len(distinct) >= 12, list(distinct)
    finally:
        await db.dispose()
