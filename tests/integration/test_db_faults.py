"""Database faults, provoked for real: timeouts, pool exhaustion, deadlocks, SQLite locks.

Every fault here is made by the database itself (a ``LOCK TABLE`` or row lock held from a
second connection, two transactions locking rows in opposite order, a pool with one
connection, a port nothing listens on), never by raising a hand-made exception. The
PostgreSQL-only tests say so in their parametrization; the SQLite ones use SQLite's own
write lock. Waits are polls on ``pg_stat_activity`` or on counters, never sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import prometheus_client
import pytest
import structlog
from pydantic import BaseModel
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.core import json, metrics
from app.db.database import Database
from app.db.faults import DbFault, classify
from app.db.queries import runs as runs_q
from app.db.tables import dead_letters, events, runs, steps
from app.engine import control
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, workflow
from app.worker.worker import Worker
from tests.conftest import PG_SERVER, make_settings
from tests.helpers import Deadlock, TcpForwarder, wait_for
from tests.integration import support

TENANT = "faults"
PG_ONLY = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

gates: dict[str, asyncio.Event] = {}
calls: dict[str, int] = {}


class Job(BaseModel):
    key: str


def _gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


async def held(key: str) -> str:
    """Count the call; the first one waits for ``<key>:release``."""
    calls[key] = calls.get(key, 0) + 1
    if calls[key] == 1:
        _gate(f"{key}:started").set()
        await _gate(f"{key}:release").wait()
    return f"call-{calls[key]}"


def after(previous: str) -> str:
    return previous + "+after"


@workflow("fault-held")
async def held_flow(ctx: WorkflowContext, job: Job) -> str:
    first = await ctx.step(held, job.key, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(after, first, retry=RetryPolicy(max_attempts=1))


@workflow("fault-approval")
async def approval_flow(ctx: WorkflowContext, job: Job) -> bool:
    decision = await ctx.approval("ok")
    return decision.approved


async def bump_both(tx: AsyncSession, key: str) -> int:
    """A transactional step locking probe rows 1 then 2 (the test locks them 2 then 1)."""
    calls[key] = calls.get(key, 0) + 1
    await tx.execute(text("UPDATE probe SET v = v + 1 WHERE id = 1"))
    await tx.execute(text("UPDATE probe SET v = v + 1 WHERE id = 2"))
    return calls[key]


@workflow("fault-transaction")
async def transaction_flow(ctx: WorkflowContext, job: Job) -> int:
    return await ctx.transaction(bump_both, job.key, retry=RetryPolicy(max_attempts=1))


async def held_big(key: str) -> str:
    """Like :func:`held`, with a result large enough to need new database pages."""
    return (await held(key)) + "." * 200_000


@workflow("fault-big")
async def big_flow(ctx: WorkflowContext, job: Job) -> str:
    first = await ctx.step(held_big, job.key, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(after, first[:15], retry=RetryPolicy(max_attempts=1))


async def insert_twice(tx: AsyncSession, key: str) -> None:
    """A transactional step whose own SQL violates a primary key (the caller's fault)."""
    await tx.execute(text("INSERT INTO probe (id, v) VALUES (7, 0)"))
    await tx.execute(text("INSERT INTO probe (id, v) VALUES (7, 1)"))


@workflow("fault-own-sql")
async def own_sql_flow(ctx: WorkflowContext, job: Job) -> None:
    await ctx.transaction(insert_twice, job.key, retry=RetryPolicy(max_attempts=2))


REGISTRY = Registry([held_flow, approval_flow, transaction_flow, big_flow, own_sql_flow])


def retries(fault: DbFault) -> float:
    """``treadle_db_retries_total{fault}`` in this process."""
    return float(metrics.DB_RETRIES.labels(fault.value)._value.get())


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


async def failure(db: Database, statements: Any, *, write: bool = True) -> Exception:
    """Run ``statements(conn)`` in a transaction that must fail; return what it raised."""
    try:
        async with db.write() if write else db.read() as conn:
            await statements(conn)
    except Exception as exc:  # noqa: BLE001 - the test classifies what the database raised
        return exc
    raise AssertionError("expected the database to raise")


# --- classification of real faults ---------------------------------------------------------


@PG_ONLY
async def test_postgresql_faults_are_classified(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(
        database_url,
        tmp_path,
        db_statement_timeout_seconds=0.2,
        db_pool_size=1,
        db_pool_timeout_seconds=0.3,
    )
    db = Database(settings)
    try:
        # statement_timeout (SQLSTATE 57014), set on every pooled connection.
        exc = await failure(db, lambda c: c.execute(text("SELECT pg_sleep(5)")), write=False)
        assert classify(exc) is DbFault.STATEMENT_TIMEOUT, exc

        # Pool exhaustion: the one pooled connection is checked out; the next caller
        # waits TREADLE_DB_POOL_TIMEOUT_SECONDS, no longer.
        async with db.read():
            started = time.monotonic()
            exc = await failure(db, lambda c: c.execute(text("SELECT 1")), write=False)
            waited = time.monotonic() - started
        assert classify(exc) is DbFault.POOL_TIMEOUT, exc
        assert 0.25 <= waited < 5, waited

        # Serialization failure (40001): a REPEATABLE READ transaction updates a row that
        # a concurrent transaction changed after its snapshot was taken.
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key="s")
        other = await asyncpg.connect(asyncpg_dsn(database_url))

        async def stale_update(conn: AsyncConnection) -> None:
            await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            await conn.execute(select(runs.c.status).where(runs.c.run_id == run_id))
            await other.execute("UPDATE runs SET priority = 1 WHERE run_id = $1", run_id)
            await conn.execute(runs.update().where(runs.c.run_id == run_id).values(priority=2))

        try:
            exc = await failure(db, stale_update)
        finally:
            await other.close()
        assert classify(exc) is DbFault.SERIALIZATION_FAILURE, exc

        # Errors of the request or of the code are no faults: they surface as they are.
        syntax = await failure(db, lambda c: c.execute(text("SELEC 1")), write=False)
        assert isinstance(syntax, ProgrammingError) and classify(syntax) is None

        async def duplicate_run(conn: AsyncConnection) -> None:
            row = (await conn.execute(select(runs).where(runs.c.run_id == run_id))).one()
            await conn.execute(runs.insert().values(**row._mapping))

        duplicate = await failure(db, duplicate_run)
        assert isinstance(duplicate, IntegrityError) and classify(duplicate) is None
    finally:
        await db.dispose()

    # Nothing listens on port 1: connection refused before any SQL is sent.
    host = PG_SERVER.split("@")[-1].split(":")[0]
    down = Database(make_settings(f"postgresql+asyncpg://postgres@{host}:1/nothing", tmp_path))
    try:
        exc = await failure(down, lambda c: c.execute(text("SELECT 1")), write=False)
    finally:
        await down.dispose()
    assert classify(exc) is DbFault.UNAVAILABLE, exc


@SQLITE_ONLY
async def test_sqlite_lock_is_classified_as_a_conflict(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path, sqlite_busy_timeout_seconds=0.05)
    db = Database(settings)
    holder = sqlite3.connect(make_url(database_url).database or "", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # SQLite's one write lock, held by another process
        exc = await failure(db, lambda c: c.execute(text("SELECT 1")))
    finally:
        holder.rollback()
        holder.close()
        await db.dispose()
    assert classify(exc) is DbFault.LOCKED, exc


# --- conflicts are retried ----------------------------------------------------------------


@PG_ONLY
async def test_a_real_deadlock_is_retried_and_commits(database_url: str, tmp_path: Path) -> None:
    """Two transactions lock two rows in opposite order; PostgreSQL aborts ours; it re-runs.

    :class:`tests.helpers.Deadlock` makes ours the one PostgreSQL's deadlock check aborts
    (SQLSTATE 40P01), whatever the machine's load.
    """
    db = Database(make_settings(database_url, tmp_path, db_retry_attempts=3))
    async with db.write() as conn:
        await conn.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)"))
        await conn.execute(text("INSERT INTO probe VALUES (1, 0), (2, 0)"))
    attempts = 0

    async def ours(conn: AsyncConnection) -> int:
        nonlocal attempts
        attempts += 1
        await conn.execute(text("UPDATE probe SET v = v + 1 WHERE id = 1"))
        await conn.execute(text("UPDATE probe SET v = v + 1 WHERE id = 2"))
        return attempts

    before = retries(DbFault.DEADLOCK)
    async with Deadlock(asyncpg_dsn(database_url)) as cycle:
        await cycle.hold(
            "SELECT 1 FROM probe WHERE id = 1 FOR UPDATE",
            "UPDATE probe SET v = v + 10 WHERE id = 2",
        )
        task = asyncio.create_task(db.write_retrying(ours, what="probe"))
        await cycle.close("UPDATE probe SET v = v + 10 WHERE id = 1")
        assert await asyncio.wait_for(task, 30) == 2
    async with db.read() as conn:
        rows = (await conn.execute(text("SELECT id, v FROM probe ORDER BY id"))).all()
    await db.dispose()
    assert [tuple(r) for r in rows] == [(1, 11), (2, 11)]  # each committed exactly once
    assert retries(DbFault.DEADLOCK) == before + 1


@PG_ONLY
@pytest.mark.parametrize("attempts", [4, 1])
async def test_cancel_deadlocking_with_another_transaction(
    database_url: str, tmp_path: Path, attempts: int
) -> None:
    """A cancel (run row, then its step rows) against a transaction locking them the other way.

    With retries (the default) the cancel is re-run and succeeds; with
    ``TREADLE_DB_RETRY_ATTEMPTS=1`` the deadlock surfaces, classified, and nothing of the
    cancel was written (the API turns it into 503 ``database_conflict``).
    """
    settings = make_settings(database_url, tmp_path, db_retry_attempts=attempts)
    db = Database(settings)
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-approval", key="c")
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_approval")
    before = retries(DbFault.DEADLOCK)
    try:
        async with Deadlock(asyncpg_dsn(database_url)) as cycle:
            # The run row, then the waiting approval's step row, as the cancel takes them.
            await cycle.hold(
                "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE",
                "SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE",
                run_id,
            )
            cancel = asyncio.create_task(
                control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="test")
            )
            await cycle.close("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id)
        if attempts > 1:
            row = await asyncio.wait_for(cancel, 30)
            assert (row["status"], row["reason"]) == ("cancelled", "canceled_by_request")
            assert retries(DbFault.DEADLOCK) == before + 1
        else:
            exc = await asyncio.wait_for(asyncio.gather(cancel, return_exceptions=True), 30)
            assert isinstance(exc[0], DBAPIError) and classify(exc[0]) is DbFault.DEADLOCK
            async with db.read() as conn:
                row = await runs_q.get_run(conn, TENANT, run_id)
            assert row["status"] == "waiting_approval"  # the cancel changed nothing
            assert retries(DbFault.DEADLOCK) == before
            # The client's retry (after Retry-After) succeeds.
            row = await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="")
            assert row["status"] == "cancelled"
    finally:
        await db.dispose()


@SQLITE_ONLY
async def test_sqlite_lock_is_retried_until_it_is_free(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(
        database_url, tmp_path, sqlite_busy_timeout_seconds=0.05, db_retry_attempts=20
    )
    db = Database(settings)
    holder = sqlite3.connect(make_url(database_url).database or "", isolation_level=None)
    before = retries(DbFault.LOCKED)

    async def write(conn: AsyncConnection) -> int:
        return int((await conn.execute(select(func.count()).select_from(runs))).scalar_one())

    try:
        holder.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(db.write_retrying(write, what="probe"))

        async def retried() -> bool:
            return retries(DbFault.LOCKED) > before

        await wait_for(retried, timeout=20, what="a retry after 'database is locked'")
        holder.rollback()
        assert await asyncio.wait_for(task, 30) == 0
    finally:
        holder.close()
        await db.dispose()


# --- a worker meeting a fault gives the run back; the run does not fail --------------------


class _Blocker:
    """Holds the database's write path from a second connection, for real.

    PostgreSQL: ``LOCK TABLE runs IN ACCESS EXCLUSIVE MODE`` (every claim, checkpoint,
    heartbeat and release touches ``runs``). SQLite: ``BEGIN IMMEDIATE`` (the one write lock).
    """

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.pg: Any = None
        self.sqlite: sqlite3.Connection | None = None

    async def hold(self) -> None:
        if self.url.startswith("postgresql"):
            self.pg = await asyncpg.connect(asyncpg_dsn(self.url))
            self.tx = self.pg.transaction()
            await self.tx.start()
            await self.pg.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        else:
            self.sqlite = sqlite3.connect(make_url(self.url).database or "", isolation_level=None)
            self.sqlite.execute("BEGIN IMMEDIATE")

    async def free(self) -> None:
        if self.pg is not None:
            await self.tx.rollback()
            await self.pg.close()
        if self.sqlite is not None:
            self.sqlite.rollback()
            self.sqlite.close()


async def test_checkpoint_fault_gives_the_run_back_and_it_completes(
    database_url: str, tmp_path: Path
) -> None:
    """A checkpoint meets a fault: the worker survives and the run completes later.

    A step finishes while the database refuses writes: its checkpoint fails, the worker
    survives, the run is given back (not failed), and it completes once the fault clears.
    """
    settings = make_settings(
        database_url,
        tmp_path,
        db_statement_timeout_seconds=0.3,  # PostgreSQL: the checkpoint is cancelled
        sqlite_busy_timeout_seconds=0.1,  # SQLite: "database is locked"…
        db_retry_attempts=2,  # …past its retries
        poll_interval_seconds=0.05,
    )
    db = Database(settings)
    key = f"ck-{uuid.uuid4().hex[:8]}"
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
    blocker = _Blocker(database_url)
    faults_before = metrics.DB_FAULTS.labels(
        "statement_timeout" if db.dialect == "postgresql" else "locked"
    )._value.get()
    async with support.workers(settings, db, REGISTRY) as (worker,):
        await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
        await blocker.hold()
        try:
            _gate(f"{key}:release").set()  # the step returns; its checkpoint meets the lock

            async def gave_back() -> bool:
                return worker.stats.db_faults >= 1

            await wait_for(gave_back, timeout=30, what="the worker gave the run back")
        finally:
            await blocker.free()
        row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
        assert not worker._stopping.is_set()  # the worker kept running throughout
    assert (row["status"], json.loads(row["output"])) == ("completed", "call-2+after")
    assert calls[key] == 2  # at least once: the step ran again after its lost checkpoint
    assert (
        metrics.DB_FAULTS.labels(
            "statement_timeout" if db.dialect == "postgresql" else "locked"
        )._value.get()
        > faults_before
    )
    async with db.read() as conn:
        failed = await conn.execute(
            select(func.count()).where(events.c.run_id == run_id, events.c.kind == "run_failed")
        )
        letters = await conn.execute(select(func.count()).where(dead_letters.c.run_id == run_id))
        step_rows = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).all()
        assert (failed.scalar_one(), letters.scalar_one()) == (0, 0)
    assert sorted((s.step_id.split("#")[0], s.status) for s in step_rows) == [
        ("after", "succeeded"),
        ("held", "succeeded"),
    ]
    await db.dispose()


@PG_ONLY
async def test_worker_without_pre_ping_survives_terminated_connections(
    database_url: str, tmp_path: Path
) -> None:
    """A worker pool without pre-ping survives its connections being terminated.

    Worker processes check connections out without a pre-ping round trip. A server-side
    termination of every connection (what a PostgreSQL restart does) fails the next
    checkpoint on a dead pooled connection; the run is given back and completes, and the
    worker's later runs get fresh connections.
    """
    # Deterministic: with one slot the claim loop does not query while the run is
    # active, no heartbeat falls due, and the worker's own background loops (batch
    # runner, webhook sender: each polls every poll interval) are idle in this test, so
    # the checkpoint is the first statement to meet a dead connection (any earlier one
    # would invalidate the whole pool first and the checkpoint would get a fresh one).
    # CI run 8 failed with the webhook sender's poll meeting it first, and a 3 Dec CI
    # with the statistics keeper's (every 10 s, app/db/statistics.py): it is off here,
    # and so is the scheduler loop (a pass every second on the same pool).
    settings = make_settings(
        database_url,
        tmp_path,
        poll_interval_seconds=0.05,
        heartbeat_interval_seconds=100,
        lease_ttl_seconds=600,
        analyze_interval_seconds=0,
        scheduler_enabled=False,
    )
    db = Database(settings)
    worker_db = Database(settings, pre_ping=False)
    worker = Worker(settings, worker_db, REGISTRY, concurrency=1)

    async def idle(stopping: asyncio.Event) -> None:
        await stopping.wait()

    worker.batches.run = idle  # type: ignore[method-assign]
    worker.webhooks.run = idle  # type: ignore[method-assign]
    running = asyncio.create_task(worker.run())
    try:
        key = f"pp-{uuid.uuid4().hex[:8]}"
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
        await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
        pool = worker_db.engine.sync_engine.pool

        async def pooled() -> bool:
            # The claim's and the journal read's connection, back in the worker's pool once
            # their statements returned (the step may start a moment before).
            return bool(pool.checkedin() >= 1)  # type: ignore[attr-defined]

        await wait_for(pooled, timeout=10, what="a connection back in the worker's pool")
        admin = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            terminated = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert terminated >= 1
        _gate(f"{key}:release").set()  # the success checkpoint meets a dead connection
        row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
        assert (row["status"], json.loads(row["output"])) == ("completed", "call-2+after")
        assert worker.stats.db_faults >= 1 and worker.stats.lease_lost == 0

        later = f"pp-{uuid.uuid4().hex[:8]}"
        _gate(f"{later}:release").set()
        second = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=later)
        row = await support.reach(db, TENANT, second, "completed", "failed", timeout=60)
        assert (row["status"], json.loads(row["output"])) == ("completed", "call-1+after")
        assert not worker._stopping.is_set()
        async with db.read() as conn:
            failed = await conn.execute(select(func.count()).where(events.c.kind == "run_failed"))
            assert failed.scalar_one() == 0
    finally:
        # Disposed whatever failed: pooled connections left to the garbage collector
        # warn (ResourceWarning) inside whichever test runs next, and fail it.
        worker.stop()
        await asyncio.wait_for(running, 30)
        await worker_db.dispose()
        await db.dispose()


@PG_ONLY
async def test_checkpoint_deadlock_past_its_retries_does_not_fail_the_run(
    database_url: str, tmp_path: Path
) -> None:
    """The fault hits one checkpoint only, and the database is fine right after it.

    The success checkpoint of ``held`` (run row, then step row) deadlocks with a
    transaction taking them the other way, and ``TREADLE_DB_RETRY_ATTEMPTS=1`` lets the
    deadlock through. Writing a failed outcome would succeed at once, so a fault that
    reached workflow code would fail the run: it must be given back and complete instead.
    """
    # Heartbeats renew the lease on the run row the gate holds; none falls in the test.
    settings = make_settings(
        database_url,
        tmp_path,
        db_retry_attempts=1,
        poll_interval_seconds=0.05,
        lease_ttl_seconds=120.0,
        heartbeat_interval_seconds=50.0,
    )
    db = Database(settings)
    key = f"dl-{uuid.uuid4().hex[:8]}"
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
    try:
        async with support.workers(settings, db, REGISTRY) as (worker,):
            await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
            await support.start_recorded(db, run_id)  # the step row the lock is taken on
            async with Deadlock(asyncpg_dsn(database_url)) as cycle:
                await cycle.hold(
                    "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE",
                    "SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE",
                    run_id,
                )
                _gate(f"{key}:release").set()
                await cycle.close("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id)
            row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
            assert worker.stats.db_faults == 1
    finally:
        await db.dispose()
    assert (row["status"], json.loads(row["output"])) == ("completed", "call-2+after")


@PG_ONLY
async def test_a_deadlocked_transactional_step_is_rerun_whole_and_commits_once(
    database_url: str, tmp_path: Path
) -> None:
    """The step's own writes deadlock; the whole transaction (function included) re-runs.

    The deadlock is not a failed attempt: the step succeeds on its first attempt (its
    ``RetryPolicy`` allows one), the function ran twice, and its writes committed once.
    """
    settings = make_settings(database_url, tmp_path)
    db = Database(settings)
    async with db.write() as conn:
        await conn.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)"))
        await conn.execute(text("INSERT INTO probe VALUES (1, 0), (2, 0)"))
    key = f"tx-{uuid.uuid4().hex[:8]}"
    before = retries(DbFault.DEADLOCK)
    try:
        async with Deadlock(asyncpg_dsn(database_url)) as cycle:
            await cycle.hold(
                "SELECT 1 FROM probe WHERE id = 1 FOR UPDATE",
                "UPDATE probe SET v = v + 10 WHERE id = 2",
            )
            run_id = await support.submit(
                db, settings, REGISTRY, TENANT, "fault-transaction", key=key
            )
            async with support.workers(settings, db, REGISTRY):
                await cycle.close("UPDATE probe SET v = v + 10 WHERE id = 1")
                row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
        async with db.read() as conn:
            probe = (await conn.execute(text("SELECT id, v FROM probe ORDER BY id"))).all()
            step = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).one()
    finally:
        await db.dispose()
    assert (row["status"], json.loads(row["output"])) == ("completed", 2)
    assert [tuple(r) for r in probe] == [(1, 11), (2, 11)]
    assert (step.status, step.attempt) == ("succeeded", 1)
    assert retries(DbFault.DEADLOCK) == before + 1


@SQLITE_ONLY
async def test_sqlite_locked_past_the_retries_is_a_503_over_http(
    database_url: str, tmp_path: Path
) -> None:
    """SQLite's write lock held past the retries: 503 database_conflict over HTTP.

    With Retry-After, nothing stored; reads go on beside the writer (WAL); then it succeeds.
    """
    settings = make_settings(
        database_url, tmp_path, sqlite_busy_timeout_seconds=0.05, db_retry_attempts=2
    )
    db = Database(settings)
    async with db.write() as conn:
        await REGISTRY.register(conn)
    body = {"workflow": "fault-held", "input": {"key": "x"}, "idempotency_key": "k1"}
    holder = sqlite3.connect(make_url(database_url).database or "", isolation_level=None)
    try:
        async with support.api_client(settings, db, TENANT) as client:
            holder.execute("BEGIN IMMEDIATE")
            refused = await client.post("/runs", json=body)
            listed = await client.get("/runs")
            holder.rollback()
            accepted = await client.post("/runs", json=body)
    finally:
        holder.close()
        await db.dispose()
    assert refused.status_code == 503, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "2"
    assert refused.json()["code"] == "database_conflict"
    assert (listed.status_code, listed.json()["items"]) == (200, [])
    assert accepted.status_code == 201, accepted.text  # the refused one stored nothing


# --- faults by SQLSTATE class: a fault nobody listed is still a fault ----------------------


async def raised(db: Database, sql: str) -> Exception:
    """What the database raised for ``sql`` (run in a read transaction)."""
    return await failure(db, lambda c: c.execute(text(sql)), write=False)


def raise_sqlstate(code: str) -> str:
    """A PL/pgSQL block raising SQLSTATE ``code``, as a trigger or the server would."""
    return f"DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '{code}'; END $$"


@PG_ONLY
async def test_postgresql_faults_are_classified_by_sqlstate_class(
    database_url: str, tmp_path: Path
) -> None:
    """Real lock_timeout, terminated backend and raised SQLSTATEs; caller's faults are not.

    Every class the module lists (08, 40, 53, 55, 57, 58, XX) is a fault, and so is a
    code in no list (72000); the caller's own errors (bad SQL, bad data, a constraint,
    PL/pgSQL's RAISE) are not.
    """
    db = Database(make_settings(database_url, tmp_path))
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        # 55P03 for real: a row lock held elsewhere, our lock_timeout runs out.
        async with db.write() as conn:
            await conn.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)"))
            await conn.execute(text("INSERT INTO probe VALUES (1, 0)"))
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM probe WHERE id = 1 FOR UPDATE")

        async def wait_for_row(conn: AsyncConnection) -> None:
            await conn.execute(text("SET LOCAL lock_timeout = '100ms'"))
            await conn.execute(text("UPDATE probe SET v = 1 WHERE id = 1"))

        exc = await failure(db, wait_for_row)
        await tx.rollback()
        assert getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03", exc
        assert classify(exc) is DbFault.LOCK_TIMEOUT

        # 57P01 for real: our backend terminated mid-statement (what a shutdown does).
        async with db.read() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()

        async def terminate_when_sleeping() -> None:
            async def sleeping() -> bool:
                state = await other.fetchval(
                    "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", pid
                )
                return bool(state == "PgSleep")

            await wait_for(sleeping, timeout=20, what="our session inside pg_sleep")
            await other.fetchval("SELECT pg_terminate_backend($1)", pid)

        killer = asyncio.create_task(terminate_when_sleeping())
        exc = await raised(db, "SELECT pg_sleep(30)")
        await killer
        assert classify(exc) is DbFault.UNAVAILABLE, exc

        expected = {
            "53100": DbFault.INSUFFICIENT_RESOURCES,  # disk_full
            "53200": DbFault.INSUFFICIENT_RESOURCES,  # out_of_memory
            "55006": DbFault.OBJECT_STATE,  # object_in_use
            "58030": DbFault.SYSTEM_ERROR,  # io_error
            "XX000": DbFault.SYSTEM_ERROR,  # internal_error
            "XX001": DbFault.SYSTEM_ERROR,  # data_corrupted
            "40003": DbFault.TRANSACTION_ROLLBACK,  # statement_completion_unknown
            "57P05": DbFault.UNAVAILABLE,  # idle_session_timeout
            "08006": DbFault.UNAVAILABLE,  # connection_failure
            "25006": DbFault.UNAVAILABLE,  # read_only_sql_transaction (a standby)
            "72000": DbFault.OTHER,  # snapshot_too_old: in no list, still a fault
            "F0000": DbFault.OTHER,  # config_file_error
        }
        seen = {code: classify(await raised(db, raise_sqlstate(code))) for code in expected}
        assert seen == expected

        # The caller's fault, raised for real or by PL/pgSQL: no fault, whatever the class.
        callers = [
            "SELECT 1 / 0",  # 22012
            "SELECT 'x'::int",  # 22P02
            "SELECT * FROM no_such_table",  # 42P01
            "DO $$ BEGIN RAISE EXCEPTION 'user code says no'; END $$",  # P0001
            raise_sqlstate("23505"),
            raise_sqlstate("40002"),  # a deferred constraint at commit
            raise_sqlstate("55000"),  # object_not_in_prerequisite_state
            raise_sqlstate("54000"),  # program_limit_exceeded
        ]
        for sql in callers:
            exc = await raised(db, sql)
            assert classify(exc) is None, (sql, exc)
    finally:
        await other.close()
        await db.dispose()


@SQLITE_ONLY
async def test_sqlite_full_database_is_a_fault_and_sql_errors_are_not(
    database_url: str, tmp_path: Path
) -> None:
    """SQLite's own "database or disk is full" (``max_page_count``) is a fault; bad SQL is not."""
    db = Database(make_settings(database_url, tmp_path))
    try:
        async with db.write() as conn:
            await conn.execute(text("CREATE TABLE probe (id INTEGER PRIMARY KEY, v TEXT)"))
        async with db.write() as conn:  # the one writer connection: cap the file at its size
            await conn.exec_driver_sql("PRAGMA max_page_count = 1")

        async def grow(conn: AsyncConnection) -> None:
            await conn.execute(text("INSERT INTO probe (v) VALUES (:v)"), {"v": "x" * 200_000})

        exc = await failure(db, grow)
        assert getattr(getattr(exc, "orig", None), "sqlite_errorname", None) == "SQLITE_FULL"
        assert classify(exc) is DbFault.INSUFFICIENT_RESOURCES
        async with db.write() as conn:
            await conn.exec_driver_sql("PRAGMA max_page_count = 1073741823")
        async with db.write() as conn:
            await grow(conn)  # the same write succeeds once there is room

        missing = await raised(db, "SELECT * FROM no_such_table")
        assert getattr(getattr(missing, "orig", None), "sqlite_errorname", None) == "SQLITE_ERROR"
        assert classify(missing) is None  # an OperationalError, but the caller's fault

        async def duplicate(conn: AsyncConnection) -> None:
            await conn.execute(text("INSERT INTO probe (id, v) VALUES (1, 'a'), (1, 'b')"))

        assert classify(await failure(db, duplicate)) is None
    finally:
        await db.dispose()


_SWITCHED_TRIGGER = """
CREATE TABLE fault_switch (code text NOT NULL);
CREATE FUNCTION fault_on_steps() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c text;
BEGIN
  SELECT code INTO c FROM fault_switch LIMIT 1;
  IF c IS NOT NULL THEN
    RAISE EXCEPTION 'simulated fault' USING ERRCODE = c;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fault_on_steps BEFORE UPDATE ON steps
  FOR EACH ROW EXECUTE FUNCTION fault_on_steps();
"""

_LOCK_TIMEOUT = """DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET lock_timeout = ''300ms''', current_database());
END $$"""


class _Fault:
    """A real database fault that a test switches on and off while a worker runs.

    ``lock_timeout`` (PostgreSQL): the database's ``lock_timeout`` is 300 ms and a second
    connection holds the run's step rows; ``53100`` / ``XX000`` / ``58030`` (PostgreSQL):
    a trigger on ``steps`` raises that SQLSTATE (disk full, internal error, I/O error);
    ``SQLITE_FULL``: ``max_page_count`` caps the file on the one writer connection.
    """

    def __init__(self, kind: str, database_url: str) -> None:
        self.kind = kind
        self.url = database_url
        self.other: Any = None
        self.tx: Any = None

    @property
    def fault(self) -> DbFault:
        return {
            "lock_timeout": DbFault.LOCK_TIMEOUT,
            "53100": DbFault.INSUFFICIENT_RESOURCES,
            "XX000": DbFault.SYSTEM_ERROR,
            "58030": DbFault.SYSTEM_ERROR,
            "SQLITE_FULL": DbFault.INSUFFICIENT_RESOURCES,
        }[self.kind]

    async def prepare(self) -> None:
        """Before the database under test opens its connections."""
        if self.kind == "SQLITE_FULL":
            return
        self.other = await asyncpg.connect(asyncpg_dsn(self.url))
        await self.other.execute(
            _LOCK_TIMEOUT if self.kind == "lock_timeout" else _SWITCHED_TRIGGER
        )

    async def on(self, db: Database, run_id: uuid.UUID) -> None:
        if self.kind == "SQLITE_FULL":
            async with db.write() as conn:
                await conn.exec_driver_sql("PRAGMA max_page_count = 1")
        elif self.kind == "lock_timeout":
            self.tx = self.other.transaction()
            await self.tx.start()
            await self.other.execute("SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE", run_id)
        else:
            await self.other.execute("INSERT INTO fault_switch VALUES ($1)", self.kind)

    async def off(self, db: Database) -> None:
        if self.kind == "SQLITE_FULL":
            async with db.write() as conn:
                await conn.exec_driver_sql("PRAGMA max_page_count = 1073741823")
        elif self.kind == "lock_timeout":
            await self.tx.rollback()
        else:
            await self.other.execute("DELETE FROM fault_switch")

    async def close(self) -> None:
        if self.other is not None:
            await self.other.close()


@pytest.mark.parametrize(
    ("database_url", "kind"),
    [
        ("postgresql", "lock_timeout"),
        ("postgresql", "53100"),
        ("postgresql", "XX000"),
        ("postgresql", "58030"),
        ("sqlite", "SQLITE_FULL"),
    ],
    indirect=["database_url"],
)
async def test_a_checkpoint_fault_of_any_class_gives_the_run_back(
    database_url: str, tmp_path: Path, kind: str
) -> None:
    """The step ran; its checkpoint meets a fault outside the old hand-made list.

    Lock timeout (55P03), disk full (53100), internal error (XX000), I/O error (58030),
    SQLite's full database: the run is given back, not failed (failing it would make a
    requeue repeat the step's effect), no dead letter, and it completes once the fault
    clears.
    """
    fault = _Fault(kind, database_url)
    await fault.prepare()
    settings = make_settings(database_url, tmp_path, poll_interval_seconds=0.05)
    db = Database(settings)
    key = f"any-{kind}-{uuid.uuid4().hex[:6]}"
    counted = metrics.DB_FAULTS.labels(fault.fault.value)
    before = counted._value.get()
    try:
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-big", key=key)
        async with support.workers(settings, db, REGISTRY) as (worker,):
            await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
            await support.start_recorded(db, run_id)  # the fault hits the result write
            await fault.on(db, run_id)
            try:
                _gate(f"{key}:release").set()  # the step returns; its checkpoint fails

                async def gave_back() -> bool:
                    return worker.stats.db_faults >= 1

                await wait_for(gave_back, timeout=30, what="the worker gave the run back")
            finally:
                await fault.off(db)
            row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
            assert not worker._stopping.is_set()
        assert (row["status"], json.loads(row["output"])) == ("completed", "call-2.........+after")
        assert counted._value.get() > before
        async with db.read() as conn:
            letters = await conn.execute(
                select(func.count()).where(dead_letters.c.run_id == run_id)
            )
            failed = await conn.execute(
                select(func.count()).where(
                    events.c.run_id == run_id, events.c.kind.in_(["run_failed", "step_failed"])
                )
            )
            assert (letters.scalar_one(), failed.scalar_one()) == (0, 0)
    finally:
        await fault.close()
        await db.dispose()


async def test_a_runs_error_never_shows_sql(database_url: str, tmp_path: Path) -> None:
    """A transactional step's own SQL fails (the caller's fault): the run fails, no SQL shown.

    The step's and the run's error (message and traceback), the timeline and the dead
    letter carry the driver's message and SQLSTATE, never the statement or its parameters.
    """
    settings = make_settings(database_url, tmp_path)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await conn.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)"))
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-own-sql", key="sql")
        async with support.workers(settings, db, REGISTRY):
            row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
        async with db.read() as conn:
            step_errors = (
                (await conn.execute(select(steps.c.error).where(steps.c.run_id == run_id)))
                .scalars()
                .all()
            )
            event_data = (
                (await conn.execute(select(events.c.data).where(events.c.run_id == run_id)))
                .scalars()
                .all()
            )
            letters = (
                (
                    await conn.execute(
                        select(dead_letters.c.error).where(dead_letters.c.run_id == run_id)
                    )
                )
                .scalars()
                .all()
            )
    finally:
        await db.dispose()
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    error = json.loads(row["error"])
    assert (error["type"], error["step_id"]) == ("StepFailed", "insert_twice"), error
    assert "unique" in error["message"].lower(), error["message"]  # the driver says why
    assert letters, "a dead letter was written"
    assert "INSERT" not in error["message"]
    # Tracebacks keep the step's own source lines; what SQLAlchemy adds to a failed
    # statement's message (the statement, its parameters) is gone from every copy.
    for shown in [row["error"], *step_errors, *event_data, *letters]:
        assert shown is None or ("[SQL:" not in shown and "[parameters:" not in shown), shown


# --- pool saturation is visible, and never reaches heartbeats -----------------------------


def sample(name: str, pool: str) -> float:
    """A ``treadle_db_pool_*`` sample of this process (0 before its first observation)."""
    return prometheus_client.REGISTRY.get_sample_value(name, {"pool": pool}) or 0.0


async def test_a_saturated_pool_shows_in_metrics_and_leases_still_renew(
    database_url: str, tmp_path: Path
) -> None:
    """The main pool's one connection is held: a checkpoint waits, the heartbeat does not.

    ``treadle_db_pool_in_use_connections`` and ``treadle_db_pool_waiting_checkouts`` show
    the saturation while it lasts and ``treadle_db_pool_wait_seconds`` counts the wait;
    meanwhile a lease renewal on the lease pool commits at once.
    """
    settings = make_settings(database_url, tmp_path, db_pool_size=1, db_pool_timeout_seconds=60)
    db = Database(settings)
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key="pool")
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn, worker_id="w", definition_keys=REGISTRY.keys, limit=1, lease_ttl=60
        )
    in_use = sample("treadle_db_pool_in_use_connections", "main")
    waits = sample("treadle_db_pool_wait_seconds_count", "main")
    try:
        # The main pool's only connection, checked out (no statement: on SQLite that would
        # BEGIN IMMEDIATE and take the database's write lock, which is not the point here).
        async with db.engine.connect():
            assert sample("treadle_db_pool_in_use_connections", "main") == in_use + 1

            async def touch(conn: AsyncConnection) -> None:
                await conn.execute(select(1))

            queued = asyncio.create_task(db.write_retrying(touch, what="queued"))

            async def waiting() -> bool:
                return sample("treadle_db_pool_waiting_checkouts", "main") >= 1

            await wait_for(waiting, timeout=20, what="a caller waiting for the main pool")
            async with db.lease_write() as conn:  # the heartbeat's pool: not waiting
                held = await runs_q.renew_leases(
                    conn, worker_id="w", run_ids=[run_id], lease_ttl=60
                )
            assert held == {run_id: claimed["fence"]}
            assert sample("treadle_db_pool_size_connections", "lease") >= 1  # opened on use
            assert not queued.done()
        await asyncio.wait_for(queued, 30)
        assert sample("treadle_db_pool_waiting_checkouts", "main") == 0
        assert sample("treadle_db_pool_wait_seconds_count", "main") > waits
        assert sample("treadle_db_pool_in_use_connections", "main") == in_use
    finally:
        await db.dispose()


@SQLITE_ONLY
async def test_sqlite_full_database_is_a_503_over_http_and_stores_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """SQLite's "database or disk is full" on ``POST /runs``: 503, no SQL, nothing stored.

    ``max_page_count`` caps the file on the process's one writer connection (SQLite's
    own ``SQLITE_FULL``, as a full disk gives); once lifted, the same request creates the
    run, once.
    """
    db = Database(make_settings(database_url, tmp_path))
    async with db.write() as conn:
        await REGISTRY.register(conn)
    body = {
        "workflow": "fault-held",
        "input": {"key": "k" * 100_000},
        "idempotency_key": "full-1",
    }
    try:
        async with support.api_client(db.settings, db, TENANT) as client:
            async with db.write() as conn:
                await conn.exec_driver_sql("PRAGMA max_page_count = 1")
            refused = await client.post("/runs", json=body)
            listed = await client.get("/runs")
            async with db.write() as conn:
                await conn.exec_driver_sql("PRAGMA max_page_count = 1073741823")
            accepted = await client.post("/runs", json=body)
            again = await client.post("/runs", json=body)
    finally:
        await db.dispose()
    assert refused.status_code == 503, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "2"
    assert refused.json()["code"] == "database_unavailable"
    for fragment in ("INSERT", "[SQL", "[parameters", "runs"):
        assert fragment not in refused.json()["detail"], refused.text
    assert (listed.status_code, listed.json()["items"]) == (200, [])
    assert accepted.status_code == 201, accepted.text  # the refused one stored nothing
    assert (again.status_code, again.json()["run_id"]) == (200, accepted.json()["run_id"])


@PG_ONLY
async def test_a_worker_started_during_an_outage_waits_for_the_database(
    database_url: str, tmp_path: Path
) -> None:
    """A worker whose database is down when it starts retries its registration.

    Found by the chaos harness's database monkey: a worker started while PostgreSQL was
    restarting (or restarted between its schema check and its registration) exited with
    the fault's traceback. Now every transient fault before the first claim is waited
    out (app.db.faults.wait_out_faults): the worker keeps retrying while connections are
    refused, registers once the server answers, and runs; SIGTERM meanwhile stops it.
    """
    url = make_url(database_url)
    forwarder = TcpForwarder((url.host or "127.0.0.1", url.port or 5432))
    down_url = url.set(port=forwarder.port).render_as_string(hide_password=False)
    settings = make_settings(down_url, tmp_path, poll_interval_seconds=0.05)
    worker_db = Database(settings, pre_ping=False)
    db = Database(make_settings(database_url, tmp_path))
    worker = Worker(settings, worker_db, REGISTRY, concurrency=1)
    ready = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        running = asyncio.create_task(worker.run(on_ready=lambda _: ready.set()))
        try:

            async def refused_twice() -> bool:
                if running.done():  # the defect: the fault ended the worker
                    running.result()
                    raise AssertionError("the worker returned while the database was down")
                retried = [e for e in logs if e["event"] == "database fault at start; retrying"]
                return len(retried) >= 2

            await wait_for(refused_twice, timeout=60, what="two refused registrations")
            assert {e["fault"] for e in logs if e.get("what") == "register"} == {"unavailable"}
            forwarder.open()  # the database is back
            await asyncio.wait_for(ready.wait(), 60)
            async with db.read() as conn:
                row = (
                    await conn.execute(
                        text("SELECT stopped_at FROM workers WHERE worker_id = :w"),
                        {"w": worker.worker_id},
                    )
                ).one()
            assert row.stopped_at is None
            key = f"late-{uuid.uuid4().hex[:8]}"
            _gate(f"{key}:release").set()
            run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
            done = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
            assert done["status"] == "completed"
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)
            await worker_db.dispose()
            await db.dispose()
            forwarder.close()


@PG_ONLY
async def test_a_worker_stopped_before_the_database_came_back_exits_cleanly(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM (``Worker.stop``) during the wait for the database ends it at once."""
    url = make_url(database_url)
    forwarder = TcpForwarder((url.host or "127.0.0.1", url.port or 5432))
    down_url = url.set(port=forwarder.port).render_as_string(hide_password=False)
    settings = make_settings(down_url, tmp_path)
    worker_db = Database(settings, pre_ping=False)
    worker = Worker(settings, worker_db, REGISTRY, concurrency=1)
    ready = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        running = asyncio.create_task(worker.run(on_ready=lambda _: ready.set()))
        try:

            async def refused() -> bool:
                if running.done():
                    running.result()
                    raise AssertionError("the worker returned while the database was down")
                return any(e["event"] == "database fault at start; retrying" for e in logs)

            await wait_for(refused, timeout=60, what="a refused registration")
            worker.stop()
            await asyncio.wait_for(running, 10)  # returns, raising nothing
            assert not ready.is_set()
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)
            await worker_db.dispose()
            forwarder.close()
