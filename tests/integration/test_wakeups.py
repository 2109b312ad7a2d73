"""Coalesced wake-ups (docs/adr/0037-coalesced-wake-ups.md): no NOTIFY in a submit's commit.

PostgreSQL only: SQLite has no LISTEN/NOTIFY (``treadle dev`` wakes its in-process worker
through the API's ``on_wake``, covered by the dev-server tests).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
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
            # The worker's own flag, not pg_stat_activity: there ``query`` is only the
            # session's last statement, the probe's UNLISTEN or the liveness SELECT 1.
            await asyncio.wait_for(started[0].listening.wait(), 30)
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


async def _some(found: Awaitable[set[int]]) -> set[int] | None:
    return (await found) or None


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


async def _listen_backends(db: Database, query: str = "%") -> set[int]:
    async with db.read() as conn:
        rows = await conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :a"
                " AND datname = current_database() AND query LIKE :q"
            ),
            {"a": LISTEN_APPLICATION_NAME, "q": query},
        )
        return {int(r[0]) for r in rows}


async def test_a_frozen_listen_server_is_given_up_and_reconnected(
    database_url: str, tmp_path: Path
) -> None:
    """A LISTEN whose server stops answering (socket open) is replaced within a bound.

    The backend serving the worker's LISTEN is frozen with SIGSTOP: to the worker the
    connection looks open and silent, like a network partition. Its liveness check times
    out (``LISTEN_CHECK_TIMEOUT_SECONDS``), it connects again, and a submit wakes it
    through the new LISTEN while its poll interval is 30 s.
    """
    import os
    import signal

    settings = make_settings(
        database_url, tmp_path, poll_interval_seconds=30.0, lease_ttl_seconds=60.0
    )
    db = Database(settings)
    frozen: int | None = None
    try:
        _pg_only(db)
        async with db.write() as conn:
            await REGISTRY.register(conn)
        submitter = Submitter(db, settings)
        request = SubmitRequest(workflow="wake-plain", input={})
        async with workers(settings, db, REGISTRY) as started:
            # Frozen in its steady state: listening, probed, checked alive once.
            checked = await wait_for(
                lambda: _some(_listen_backends(db, "SELECT 1")), timeout=15, what="LISTEN checked"
            )
            (frozen,) = checked
            try:
                os.kill(frozen, signal.SIGSTOP)
            except PermissionError:
                frozen = None
                pytest.skip("the PostgreSQL server's processes are not ours to signal")

            async def replaced() -> bool | None:
                return bool((await _listen_backends(db)) - {frozen}) or None

            # The check runs every heartbeat interval (0.5 s here) and gives up after
            # LISTEN_CHECK_TIMEOUT_SECONDS: well within 30 s, the poll interval.
            await wait_for(replaced, timeout=25, what="a new LISTEN connection")
            await wait_for(
                lambda: _true(not started[0]._wake.is_set()), timeout=10, what="worker idle"
            )
            t0 = time.monotonic()
            row, _ = await submitter.submit(request, tenant_id=TENANT, subject="s")
            await reach(db, TENANT, row["run_id"], "completed", timeout=10)
            assert time.monotonic() - t0 < 10.0
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        await db.dispose()
