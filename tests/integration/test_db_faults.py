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
import pytest
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
from tests.conftest import PG_SERVER, make_settings
from tests.helpers import wait_for
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


REGISTRY = Registry([held_flow, approval_flow, transaction_flow])


def retries(fault: DbFault) -> float:
    """``treadle_db_retries_total{fault}`` in this process."""
    return float(metrics.DB_RETRIES.labels(fault.value)._value.get())


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


async def lock_waiters(db: Database) -> int:
    """PostgreSQL: other sessions of this database blocked on a lock right now."""
    async with db.read() as conn:
        stmt = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int((await conn.execute(stmt)).scalar_one())


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

    Ours waits first and keeps the default 1 s ``deadlock_timeout``; the other connection
    sets 60 s, so ours is the one PostgreSQL's deadlock check aborts (SQLSTATE 40P01).
    """
    db = Database(make_settings(database_url, tmp_path, db_retry_attempts=3))
    async with db.write() as conn:
        await conn.execute(text("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)"))
        await conn.execute(text("INSERT INTO probe VALUES (1, 0), (2, 0)"))
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    attempts = 0

    async def ours(conn: AsyncConnection) -> int:
        nonlocal attempts
        attempts += 1
        await conn.execute(text("UPDATE probe SET v = v + 1 WHERE id = 1"))
        await conn.execute(text("UPDATE probe SET v = v + 1 WHERE id = 2"))
        return attempts

    before = retries(DbFault.DEADLOCK)
    try:
        await other.execute("SET deadlock_timeout = '60s'")
        tx = other.transaction()
        await tx.start()
        await other.execute("UPDATE probe SET v = v + 10 WHERE id = 2")
        task = asyncio.create_task(db.write_retrying(ours, what="probe"))

        async def ours_waits() -> bool:
            return await lock_waiters(db) == 1

        await wait_for(ours_waits, timeout=20, what="our transaction blocked on row 2")
        # Closes the cycle; returns once PostgreSQL aborted ours and freed row 1.
        await other.execute("UPDATE probe SET v = v + 10 WHERE id = 1")
        await tx.commit()
        assert await asyncio.wait_for(task, 30) == 2
    finally:
        await other.close()
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
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    before = retries(DbFault.DEADLOCK)
    try:
        await other.execute("SET deadlock_timeout = '60s'")
        tx = other.transaction()
        await tx.start()
        # The waiting approval's step row first, as the cancel will want it second.
        await other.execute("SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE", run_id)
        cancel = asyncio.create_task(
            control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="test")
        )

        async def cancel_waits() -> bool:
            return await lock_waiters(db) == 1

        await wait_for(cancel_waits, timeout=20, what="cancel blocked on the step row")
        await other.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id)
        await tx.commit()
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
        await other.close()
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
    # active, and no heartbeat falls due, so the checkpoint is the first statement to
    # meet a dead connection (any earlier one would drop the whole pool first).
    settings = make_settings(
        database_url,
        tmp_path,
        poll_interval_seconds=0.05,
        heartbeat_interval_seconds=100,
        lease_ttl_seconds=600,
    )
    db = Database(settings)
    worker_db = Database(settings, pre_ping=False)
    key = f"pp-{uuid.uuid4().hex[:8]}"
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
    async with support.workers(settings, worker_db, REGISTRY, concurrency=1) as (worker,):
        await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
        # The step's start checkpoint left its connection in the worker's pool.
        assert worker_db.engine.sync_engine.pool.checkedin() >= 1  # type: ignore[attr-defined]
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
    settings = make_settings(
        database_url, tmp_path, db_retry_attempts=1, poll_interval_seconds=0.05
    )
    db = Database(settings)
    key = f"dl-{uuid.uuid4().hex[:8]}"
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-held", key=key)
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await other.execute("SET deadlock_timeout = '60s'")
        async with support.workers(settings, db, REGISTRY) as (worker,):
            await asyncio.wait_for(_gate(f"{key}:started").wait(), 30)
            tx = other.transaction()
            await tx.start()
            await other.execute("SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE", run_id)
            _gate(f"{key}:release").set()

            async def checkpoint_waits() -> bool:
                return await lock_waiters(db) == 1

            await wait_for(checkpoint_waits, timeout=20, what="checkpoint blocked on the step")
            await other.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id)
            await tx.commit()
            row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
            assert worker.stats.db_faults == 1
    finally:
        await other.close()
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
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    before = retries(DbFault.DEADLOCK)
    try:
        await other.execute("SET deadlock_timeout = '60s'")
        tx = other.transaction()
        await tx.start()
        await other.execute("UPDATE probe SET v = v + 10 WHERE id = 2")
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "fault-transaction", key=key)
        async with support.workers(settings, db, REGISTRY):

            async def step_waits() -> bool:
                return await lock_waiters(db) == 1

            await wait_for(step_waits, timeout=30, what="the step's transaction blocked")
            await other.execute("UPDATE probe SET v = v + 10 WHERE id = 1")
            await tx.commit()
            row = await support.reach(db, TENANT, run_id, "completed", "failed", timeout=60)
        async with db.read() as conn:
            probe = (await conn.execute(text("SELECT id, v FROM probe ORDER BY id"))).all()
            step = (await conn.execute(select(steps).where(steps.c.run_id == run_id))).one()
    finally:
        await other.close()
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
