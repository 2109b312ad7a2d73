"""Coalesced wake-ups (docs/adr/0037-coalesced-wake-ups.md): no NOTIFY in a submit's commit.

PostgreSQL only: SQLite has no LISTEN/NOTIFY (``treadle dev`` wakes its in-process worker
through the API's ``on_wake``, covered by the dev-server tests).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import asyncpg
import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, text

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import runs
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.engine.wakeup import NOTIFY_CHANNEL
from app.sdk import WorkflowContext, workflow
from app.worker.worker import LISTEN_APPLICATION_NAME
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration.support import reach, workers

TENANT = "t-wake"


class In(BaseModel):
    pass


async def noop() -> None:
    """The one step."""


@workflow(name="wake-plain", version="1")
async def plain(ctx: WorkflowContext, input: In) -> None:
    """One step, so a claimed run completes at once."""
    await ctx.step(noop)


REGISTRY = Registry([plain])


def _pg_only(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("LISTEN/NOTIFY is the PostgreSQL path")


async def _listen(settings: Settings) -> tuple[asyncpg.Connection, asyncio.Queue[str]]:
    heard: asyncio.Queue[str] = asyncio.Queue()
    assert settings.listen_url is not None
    conn = await asyncpg.connect(settings.listen_url.replace("+asyncpg", ""))
    await conn.add_listener(NOTIFY_CHANNEL, lambda *args: heard.put_nowait(args[3]))
    return conn, heard


async def _until_marker(listener: asyncpg.Connection, heard: asyncio.Queue[str]) -> list[str]:
    # Notifications arrive in commit order: everything before our marker came earlier.
    await listener.execute("SELECT pg_notify($1, 'marker')", NOTIFY_CHANNEL)
    got: list[str] = []
    while (payload := await asyncio.wait_for(heard.get(), 10)) != "marker":
        got.append(payload)
    return got


async def test_submit_commits_no_notify(settings: Settings, db: Database) -> None:
    _pg_only(db)
    async with db.write() as conn:
        await REGISTRY.register(conn)
    listener, heard = await _listen(settings)
    try:
        # The coalescer off: whatever is heard now came from the submits' own commits.
        db.wakeups = None
        submitter = Submitter(db, settings)
        await submitter.submit(
            SubmitRequest(workflow="wake-plain", input={}), tenant_id=TENANT, subject="s"
        )
        # The transactional path (labels) too.
        await submitter.submit(
            SubmitRequest(workflow="wake-plain", input={}, labels={"a": "b"}),
            tenant_id=TENANT,
            subject="s",
        )
        assert await _until_marker(listener, heard) == []
    finally:
        await listener.close()


async def test_submits_in_one_window_send_few_notifications_after_commit(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path, notify_coalesce_ms=200.0, db_pool_size=20)
    db = Database(settings)
    try:
        _pg_only(db)
        async with db.write() as conn:
            await REGISTRY.register(conn)
        listener, heard = await _listen(settings)
        try:
            submitter = Submitter(db, settings)
            n = 40
            started = time.monotonic()
            await asyncio.gather(
                *(
                    submitter.submit(
                        SubmitRequest(workflow="wake-plain", input={}),
                        tenant_id=TENANT,
                        subject="s",
                    )
                    for _ in range(n)
                )
            )
            burst = time.monotonic() - started
            # The first notification comes after a commit: a run is there to claim.
            assert await asyncio.wait_for(heard.get(), 10) == ""
            async with db.read() as conn:
                count = (await conn.execute(select(func.count()).select_from(runs))).scalar_one()
            assert count == n
            assert db.wakeups is not None
            await db.wakeups.flush()
            rest = await _until_marker(listener, heard)
            # At most one NOTIFY per 200 ms window of the burst, plus the leading one
            # and the flush: a slow machine stretches the burst, never the rule.
            assert 1 + len(rest) <= 2 + math.ceil(burst / 0.2)
            assert 1 + len(rest) < n
            assert db.wakeups.sent == 1 + len(rest)
        finally:
            await listener.close()
    finally:
        await db.dispose()


async def _listening(db: Database) -> bool:
    async with db.read() as conn:
        n = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"
                    " AND datname = current_database() AND query ILIKE 'LISTEN%'"
                ),
                {"a": LISTEN_APPLICATION_NAME},
            )
        ).scalar_one()
    return bool(n)


async def _idle_worker_claims(
    database_url: str, tmp_path: Path, *, coalescer: bool, poll: float, deadline: float
) -> float:
    # A worker polling every ``poll`` s, idle and LISTENing; returns how long a run
    # submitted now took to complete.
    settings = make_settings(
        database_url, tmp_path, poll_interval_seconds=poll, lease_ttl_seconds=60.0
    )
    db = Database(settings)
    try:
        _pg_only(db)
        async with db.write() as conn:
            await REGISTRY.register(conn)
        submitter = Submitter(db, settings)
        request = SubmitRequest(workflow="wake-plain", input={})
        async with workers(settings, db, REGISTRY) as started:
            await wait_for(lambda: _listening(db), timeout=10, what="worker LISTENing")
            first, _ = await submitter.submit(request, tenant_id=TENANT, subject="s")
            await reach(db, TENANT, first["run_id"], "completed", timeout=10)
            # Idle again: its wake-up consumed, waiting on NOTIFY or the 30 s poll.
            await wait_for(
                lambda: _true(not started[0]._wake.is_set()), timeout=10, what="worker idle"
            )
            if not coalescer:
                db.wakeups = None  # as if the process died between commit and NOTIFY
            t0 = time.monotonic()
            row, _ = await submitter.submit(request, tenant_id=TENANT, subject="s")
            await reach(db, TENANT, row["run_id"], "completed", timeout=deadline)
            return time.monotonic() - t0
    finally:
        await db.dispose()


async def _true(value: bool) -> bool | None:
    return value or None


async def test_idle_worker_is_woken_well_before_its_poll(database_url: str, tmp_path: Path) -> None:
    # Polling every 30 s, woken by the coalesced NOTIFY: done well within 10 s.
    took = await _idle_worker_claims(
        database_url, tmp_path, coalescer=True, poll=30.0, deadline=10.0
    )
    assert took < 10.0


async def test_lost_wakeup_is_covered_by_polling(database_url: str, tmp_path: Path) -> None:
    # No NOTIFY at all (the coalescer gone, as if killed after commit): the worker's
    # 1 s poll claims the run within about one interval.
    took = await _idle_worker_claims(
        database_url, tmp_path, coalescer=False, poll=1.0, deadline=5.0
    )
    assert took < 5.0
