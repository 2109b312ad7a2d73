"""Every statement a leased run sends to a tenant-owned table names the run's tenant.

Issue #22 / docs/adr/0034-tenant-leading-keys.md ("Queries keyed by tenant"): on Citus a
statement reaches one shard only when its ``WHERE`` fixes ``tenant_id``; one that names
``run_id`` alone fans out to every shard. PostgreSQL only (the check reads PostgreSQL's
plans). The test records every statement the engine sends (SQLAlchemy
``before_cursor_execute``) while workers execute a scripted mix of runs of two tenants
(quick steps, a retried step, a signal wait, labels, log lines and emits, a completion, a
failure with its dead letter, a cancel) and maintenance archives them; then it EXPLAINs
each recorded statement with its own parameters (``VERBOSE``, custom plan) and requires
every scan of a tenant-owned table to carry a condition on ``tenant_id`` (its own index
condition or filter, or the join condition that feeds it). The few statements that are
cross-tenant by design are in ``CROSS_TENANT``, each with why.

A second test pins that the tenant narrows nothing and a wrong tenant matches nothing:
the fence check and ``step_done`` with the right run id and fence but another tenant
raise ``LeaseLost`` and write nothing. A third explains the fence check and ``step_done``
and requires the run row to be found through ``pk_runs`` and the step upserted on
``pk_steps``: the added filter must not cost the primary-key lookup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, text

from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries import runs as runs_q
from app.db.tables import events, runs, steps
from app.engine import control
from app.engine import maintenance as maint
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, workflow
from tests.conftest import make_settings
from tests.integration import support
from tests.integration.support import record_statements

# Tenant-owned tables of the run core (every one has tenant_id; tests/unit/
# test_tenant_leading_keys.py lists them), and the archive.
TENANT_TABLES = {
    "runs",
    "steps",
    "events",
    "run_labels",
    "dead_letters",
    "signals",
    "approval_decisions",
    "run_logs",
    "event_waits",
    "runs_archive",
}
PARTITION = re.compile(r"_(p\d{8}|default)$")
NAMES = re.compile(r"\b(" + "|".join(sorted(TENANT_TABLES)) + r")\b")

# Statements that are cross-tenant by design, each matched by the start of its text
# (whitespace collapsed).
# On Citus these are the multi-shard statements docs/scaling.md ("Citus") lists.
CROSS_TENANT: dict[str, tuple[re.Pattern[str], str]] = {
    "claim": (
        re.compile(r"^WITH due AS \(SELECT runs\.run_id"),
        "the claim picks due runs of every tenant in one priority order (FOR UPDATE SKIP "
        "LOCKED over ix_runs_claimable); on Citus it must become a claim per tenant "
        "(docs/scaling.md, 'Claims per shard').",
    ),
    "lease renewal": (
        re.compile(r"^UPDATE runs SET lease_expires_at=.*WHERE runs\.run_id IN", re.S),
        "one heartbeat renews every lease a worker holds, of any tenant, in one statement: "
        "per tenant it would be one statement per tenant per beat.",
    ),
    "slot sweep": (
        re.compile(r"^SELECT runs\.tenant_id, runs\.workflow, runs\.concurrency_key, count"),
        "the worker's sweep for concurrency keys with waiting runs spans every tenant "
        "(each key it finds is then handled by tenant-keyed statements).",
    ),
    "metrics": (
        re.compile(r"^SELECT runs\.status, count\(\*\)"),
        "the status gauge counts runs of every tenant.",
    ),
    "maintenance: finished runs": (
        re.compile(r"^SELECT runs\.run_id, runs\.finished_at, runs\.tenant_id FROM runs"),
        "compaction and archival walk finished runs of every tenant (an operator's job on "
        "the whole database); each batch they pick is then keyed by tenant.",
    ),
    "maintenance: old events": (
        re.compile(r"^SELECT events\.tenant_id, events\.event_id FROM events JOIN runs"),
        "audit trimming walks old events of every tenant; its deletes are keyed by tenant.",
    ),
    "maintenance: old dead letters": (
        re.compile(r"^SELECT dead_letters\.tenant_id, dead_letters\.dead_letter_id"),
        "audit trimming walks old dead letters of every tenant; its deletes are keyed.",
    ),
    # The retention rules of app/db/queries/retention.py (docs/operations.md, "What each
    # table keeps"): each walks its table's old rows of every tenant, as the two above do.
    "maintenance: expired archive summaries": (
        re.compile(r"^SELECT runs_archive\.tenant_id, runs_archive\.run_id FROM runs_archive"),
        "audit trimming walks archived summaries of every tenant past the window.",
    ),
    "maintenance: old posted events": (
        re.compile(r"^SELECT inbound_events\.tenant_id, inbound_events\.event_id FROM"),
        "audit trimming walks old posted events of every tenant; the runs and event waits "
        "that keep one are matched on its tenant.",
    ),
    "maintenance: old schedule fires": (
        re.compile(r"^SELECT schedule_fires\.tenant_id, schedule_fires\.schedule_id"),
        "audit trimming walks old schedule fires of every tenant; a fire's run is matched "
        "on its tenant.",
    ),
    "maintenance: idle workers": (
        re.compile(r"^(SELECT workers\.worker_id FROM workers|DELETE FROM workers WHERE)"),
        "a worker leases runs of every tenant: a worker row is kept while any run names it "
        "as lease owner (ix_runs_lease_owner), whatever the tenant.",
    ),
}


class Job(BaseModel):
    key: str = "k"
    fail: bool = False


TRIES: dict[str, int] = {}


def quick(n: int) -> int:
    return n + 1


def flaky(key: str) -> str:
    TRIES[key] = TRIES.get(key, 0) + 1
    if TRIES[key] == 1:
        raise ConnectionError("first attempt fails")
    return "ok"


def broken() -> None:
    raise ValueError("always")


@workflow("routed-mix")
async def mix(ctx: WorkflowContext, job: Job) -> str:
    await ctx.set_label("stage", "start")
    ctx.logger.info("begins", key=job.key)
    ctx.emit("progress", {"at": 1})
    n = await ctx.step(quick, 1)
    await ctx.step(flaky, job.key, retry=RetryPolicy(max_attempts=3, delay=0.0))
    got = await ctx.signal("go", timeout=600)
    await ctx.set_label("stage", "after")
    if job.fail:
        await ctx.step(broken, retry=RetryPolicy(max_attempts=1))
    return f"{n}:{got}"


@workflow("routed-waits")
async def waits(ctx: WorkflowContext, job: Job) -> None:
    await ctx.signal("never")


@pytest.fixture
def pg_url(make_pg_database: Callable[[], str]) -> str:
    """A fresh migrated PostgreSQL database (the plans checked are PostgreSQL's)."""
    return make_pg_database()


def _recording(db: Database, into: list[tuple[str, Any]]) -> Callable[[], None]:
    """Record ``(statement, parameters)`` of every statement naming a tenant table."""
    return record_statements(db, NAMES, into)


_CONDS = ("Index Cond", "Filter", "Recheck Cond", "Join Filter", "Hash Cond", "Merge Cond")


def _unrouted(plan: dict[str, Any]) -> list[str]:
    """Scans of tenant-owned tables with no ``tenant_id`` condition in one plan.

    A scan counts as routed when its own conditions mention ``<alias>.tenant_id`` (or a
    bare ``tenant_id``), or when a join above it does (the tenant is fed by the join).
    """
    bad: list[str] = []

    def walk(node: dict[str, Any], above: list[str]) -> None:
        conds = [str(node[k]) for k in _CONDS if k in node]
        # A time partition (docs/adr/0036-time-partitions.md) stands for its table.
        relation = PARTITION.sub("", node.get("Relation Name", ""))
        if relation in TENANT_TABLES and "Scan" in node["Node Type"]:
            alias = node.get("Alias", relation)
            mine = " ".join(conds)
            if "tenant_id" not in mine and not any(f"{alias}.tenant_id" in c for c in above):
                bad.append(
                    f"{node['Node Type']} on {relation} ({alias}) "
                    f"{node.get('Index Name', '')}: {mine or 'no condition'}"
                )
        for child in node.get("Plans", []):
            walk(child, [*above, *conds])

    walk(plan["Plan"], [])
    return bad


async def _explain(conn: Any, statement: str, parameters: Any) -> dict[str, Any]:
    result = await conn.exec_driver_sql("EXPLAIN (VERBOSE, FORMAT JSON) " + statement, parameters)
    raw = result.scalar_one()
    plan: dict[str, Any] = (raw if isinstance(raw, list) else json.loads(raw))[0]
    return plan


def _literal(value: Any) -> str:
    # A parameter as an untyped SQL literal (PREPARE's own types coerce it).
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, datetime):
        value = value.isoformat()
    return "'" + str(value).replace("'", "''") + "'"


async def _explain_generic(conn: Any, statement: str, parameters: Any) -> dict[str, Any]:
    """The generic plan a prepared statement may settle on after five executions.

    EXPLAIN with bound parameters plans them as constants (a custom plan) on PostgreSQL
    15, which has no ``EXPLAIN (GENERIC_PLAN)``; so the statement is PREPAREd and its
    EXECUTE explained under ``plan_cache_mode = force_generic_plan``.
    """
    await conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    await conn.exec_driver_sql("PREPARE routed_generic AS " + statement)
    try:
        args = ", ".join(_literal(v) for v in parameters)
        result = await conn.exec_driver_sql(
            f"EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE routed_generic({args})"
        )
        raw = result.scalar_one()
    finally:
        await conn.exec_driver_sql("DEALLOCATE routed_generic")
        await conn.exec_driver_sql("SET LOCAL plan_cache_mode = auto")
    plan: dict[str, Any] = (raw if isinstance(raw, list) else json.loads(raw))[0]
    return plan


def _allowed(statement: str) -> str | None:
    flat = " ".join(statement.split())  # compiled SQL breaks lines where it likes
    for name, (pattern, _why) in CROSS_TENANT.items():
        if pattern.search(flat):
            return name
    return None


async def _scripted(db: Database, settings: Settings) -> None:
    """Runs of two tenants through a worker: steps, retry, signal, failure, a cancel."""
    registry = Registry([mix, waits])
    TRIES.clear()
    ids = []
    for tenant, fail in (("ta", False), ("tb", True)):
        run_id = await support.submit(
            db, settings, registry, tenant, "routed-mix", key=tenant, fail=fail
        )
        ids.append((tenant, run_id))
    cancelled = await support.submit(db, settings, registry, "tb", "routed-waits")
    async with support.workers(settings, db, registry):
        for tenant, run_id in ids:
            await support.reach(db, tenant, run_id, "waiting_signal")
            await control.send_signal(
                db,
                settings,
                tenant_id=tenant,
                run_id=run_id,
                name="go",
                payload="yes",
                actor="op",
            )
        await support.reach(db, "ta", ids[0][1], "completed")
        await support.reach(db, "tb", ids[1][1], "failed")
        await support.reach(db, "tb", cancelled, "waiting_signal")
        await control.cancel(db, tenant_id="tb", run_id=cancelled, actor="op", reason=None)
        await support.reach(db, "tb", cancelled, "cancelled")


@pytest.mark.timeout(300)
async def test_leased_run_statements_name_the_tenant(pg_url: str, tmp_path: Path) -> None:
    settings = make_settings(pg_url, tmp_path, group_commit_window_ms=1)
    db = Database(settings)
    try:
        statements: list[tuple[str, Any]] = []
        stop = _recording(db, statements)
        try:
            await _scripted(db, settings)
            # Every tier over everything finished (zero-day windows).
            windows = make_settings(
                pg_url,
                tmp_path,
                compaction_after_days=0,
                archival_after_days=0,
                audit_retention_days=0,
            )
            report = await maint.run_maintenance(db, windows)
            archived = next(t for t in report.tiers if t.tier is maint.Tier.ARCHIVAL)
            assert archived.touched["runs"] == 3, report.as_dict()
        finally:
            stop()
        distinct = {s: p for s, p in statements}
        bad: list[str] = []
        allowed: set[str] = set()
        kinds = {"UPDATE": 0, "DELETE": 0, "SELECT": 0, "WITH": 0}
        async with db.write() as conn:
            for statement, parameters in distinct.items():
                head = statement.lstrip().split(None, 1)[0].upper()
                if head not in kinds:
                    continue  # a plain INSERT … VALUES reads no table
                name = _allowed(statement)
                if name is not None:
                    allowed.add(name)
                    continue
                kinds[head] += 1
                plan = await _explain(conn, statement, parameters)
                problems = _unrouted(plan)
                bad += [f"{p}\n    {' '.join(statement.split())[:400]}" for p in problems]
            await conn.rollback()
        assert not bad, f"{len(bad)} unrouted scans:\n" + "\n".join(bad)
        # Not vacuous: the script reached the fenced writes, reads and deletes.
        assert kinds["UPDATE"] >= 5 and kinds["DELETE"] >= 3 and kinds["WITH"] >= 2, kinds
        assert {"claim", "maintenance: finished runs", "maintenance: old events"} <= allowed, (
            allowed
        )
    finally:
        await db.dispose()


async def _claimed(db: Database, settings: Settings) -> Any:
    registry = Registry([waits])
    await support.submit(db, settings, registry, "right", "routed-waits")
    async with db.write() as conn:
        (run,) = await runs_q.claim_runs(
            conn,
            worker_id="w1",
            definition_keys=[("routed-waits", "1")],
            limit=1,
            lease_ttl=30,
        )
    return run


# An index scan of runs in a JSON plan: (index, index condition).
RUNS_SCAN = re.compile(
    r'"Index Name": "(\w+)", "Relation Name": "runs",[^}]*"Index Cond": "([^"]*)"'
)


def _done_params(run: Any, tenant_id: str) -> dict[str, Any]:
    return {
        "run_id": run["run_id"],
        "tenant_id": tenant_id,
        "fence": int(run["fence"]),
        "step_id": "s",
        "seq": 0,
        "kind": "step",
        "name": "s",
        "attempt": 1,
        "max_attempts": 1,
        "detail": None,
        "output": '"x"',
        "started_at": datetime.now(UTC),
        "started_data": "{}",
        "event_data": "{}",
    }


async def test_a_wrong_tenant_matches_nothing(database_url: str, tmp_path: Path) -> None:
    """Right run id and fence, another tenant: ``LeaseLost``, nothing written (both DBs)."""
    settings = make_settings(database_url, tmp_path)
    db = Database(settings)
    try:
        run = await _claimed(db, settings)
        with pytest.raises(LeaseLost):
            async with db.write() as conn:
                await runs_q.check_fence(conn, run["run_id"], int(run["fence"]), tenant_id="other")
        if db.dialect == "postgresql":
            with pytest.raises(LeaseLost):
                async with db.autocommit() as conn:
                    await checkpoints_q.step_done(conn, **_done_params(run, "other"))
            with pytest.raises(LeaseLost):
                async with db.autocommit() as conn:
                    await checkpoints_q.complete_run(
                        conn,
                        run_id=run["run_id"],
                        tenant_id="other",
                        fence=int(run["fence"]),
                        output="1",
                    )
        async with db.read() as conn:
            journal = (
                await conn.execute(select(steps.c.step_id).where(steps.c.run_id == run["run_id"]))
            ).all()
            kinds = (
                (await conn.execute(select(events.c.kind).where(events.c.run_id == run["run_id"])))
                .scalars()
                .all()
            )
            status = (
                await conn.execute(select(runs.c.status).where(runs.c.run_id == run["run_id"]))
            ).scalar_one()
        assert journal == []
        assert "step_started" not in kinds and "run_completed" not in kinds
        assert status == "running"
        # The right tenant still holds: the tenant narrows nothing when it is correct.
        async with db.write() as conn:
            await runs_q.check_fence(conn, run["run_id"], int(run["fence"]), tenant_id="right")
        if db.dialect == "postgresql":
            async with db.autocommit() as conn:
                await checkpoints_q.step_done(conn, **_done_params(run, "right"))
            async with db.read() as conn:
                got = (
                    await conn.execute(
                        select(steps.c.status).where(steps.c.run_id == run["run_id"])
                    )
                ).scalar_one()
            assert got == "succeeded"
    finally:
        await db.dispose()


async def test_fence_check_and_step_done_stay_primary_key_lookups(
    pg_url: str, tmp_path: Path
) -> None:
    """The added ``tenant_id`` filter keeps ``pk_runs`` and ``pk_steps`` in the plans."""
    settings = make_settings(pg_url, tmp_path)
    db = Database(settings)
    try:
        run = await _claimed(db, settings)
        async with db.write() as conn:
            # Thousands of other runs, half of them the same tenant's: a busy tenant, so
            # that neither a sequential scan nor a scan of the tenant's runs is cheap.
            await conn.execute(
                text(
                    "INSERT INTO runs (run_id, tenant_id, workflow, version, status, input,"
                    " attempt, fence, priority, created_by, created_at, updated_at, lost_claims)"
                    " SELECT gen_random_uuid(),"
                    " CASE WHEN i % 2 = 0 THEN 'right' ELSE 't' || (i % 20) END,"
                    " 'routed-waits', '1', 'completed', '{}', 1, 1, 0, 'alice', now(), now(), 0"
                    " FROM generate_series(1, 10000) AS i"
                )
            )
        async with db.autocommit() as conn:
            await conn.execute(text("ANALYZE runs"))
            await conn.execute(text("ANALYZE steps"))
        statements: list[tuple[str, Any]] = []
        stop = _recording(db, statements)
        try:
            async with db.write() as conn:
                await runs_q.check_fence(conn, run["run_id"], int(run["fence"]), tenant_id="right")
            async with db.autocommit() as conn:
                await checkpoints_q.step_done(conn, **_done_params(run, "right"))
        finally:
            stop()
        fence_sql = next(s for s in statements if s[0].lstrip().startswith("UPDATE runs"))
        done_sql = next(s for s in statements if s[0].lstrip().startswith("WITH"))
        async with db.write() as conn:
            # The custom plan, and the generic one a prepared statement may settle on.
            for mode in ("custom", "generic"):
                explain = _explain if mode == "custom" else _explain_generic
                for plan in (
                    json.dumps(await explain(conn, *fence_sql)),
                    json.dumps(await explain(conn, *done_sql)),
                ):
                    runs_scans = RUNS_SCAN.findall(plan)
                    # One row by its key: the (tenant_id, run_id) primary key (revision
                    # 0027), or the id-only ix_runs_run_id the planner may prefer (the
                    # smaller index, one row either way) with the tenant checked on it.
                    assert len(runs_scans) == 1, (mode, plan)
                    ((index, cond),) = runs_scans
                    assert index in ("pk_runs", "ix_runs_run_id"), (mode, plan)
                    assert "run_id = " in cond, (mode, plan)
                    assert "Seq Scan" not in plan, (mode, plan)
                    assert re.search(r"tenant_id\)?(::text)? = ", plan), (mode, plan)
                # The step's upsert is arbitrated by the steps key.
                assert '"Conflict Arbiter Indexes": ["pk_steps"]' in plan, plan
            await conn.rollback()
    finally:
        await db.dispose()
