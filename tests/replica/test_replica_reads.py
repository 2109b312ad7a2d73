"""Reads that may lag go to a real streaming standby; every decision stays on the primary.

A real ``treadle serve`` (uvicorn) and ``treadle worker`` run with
``TREADLE_DATABASE_URL`` = the primary and ``TREADLE_READ_DATABASE_URL`` = its hot
standby (tests/replica/conftest.py). Replay is paused on the standby, so whatever is
written afterwards exists on the primary only: a list that misses it was served by the
standby; a submit, claim, idempotent retry or key check that behaves was served by the
primary (docs/adr/0033-lag-tolerant-reads-on-a-replica.md).

The gate's two ways out (a standby that is unreachable, one too far behind) are shown on
an in-process :class:`Database` against the same pair, which runs the heartbeat the
replica's lag is measured by as the API does (tests/replica/conftest.py, ``heartbeating``);
a standby cut off from its primary is in test_replica_freshness.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app.db import replica
from app.db.database import Database
from tests.acceptance.conftest import ROOT, Stack, free_port, token
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for, wait_for_sync
from tests.replica.conftest import (
    DATABASE,
    StreamingPair,
    fallbacks,
    heartbeating,
    metric,
    replica_settings,
    served_by_standby,
)

pytestmark = pytest.mark.xdist_group("replica")

ADMIN = token(tenant="acme", subject="root")


@pytest.fixture(scope="module")
def stack(pair: StreamingPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API and one worker on the primary, lists on the standby (lag bound far away)."""
    tmp = tmp_path_factory.mktemp("replica-stack")
    (tmp / "shared").mkdir()
    env = {
        "TREADLE_DATABASE_URL": pair.primary.url(DATABASE),
        "TREADLE_READ_DATABASE_URL": pair.standby.url(DATABASE),
        # Replay stays paused for a while here; the bound is shown in its own test.
        "TREADLE_READ_MAX_LAG_SECONDS": "3600",
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_DATA_DIR": str(tmp / "data"),
        "TREADLE_LEASE_TTL_SECONDS": "3",
        "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
        "TREADLE_POLL_INTERVAL_SECONDS": "0.1",
        "TREADLE_LOG_FORMAT": "json",
        "TREADLE_TEST_DIR": str(tmp / "shared"),
        "PYTHONPATH": str(ROOT),
    }
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}, **env}
    s = Stack(database_url=env["TREADLE_DATABASE_URL"], tmp=tmp, env=env)
    try:
        s.start_api()
        s.start_worker()
        yield s
    finally:
        s.stop()


def _listed(c: httpx.Client, **params: str) -> dict[str, str]:
    resp = c.get("/runs", params={"limit": "200", **params})
    assert resp.status_code == 200, resp.text
    return {r["run_id"]: r["status"] for r in resp.json()["items"]}


def _submit(c: httpx.Client, value: object, key: str | None = None) -> httpx.Response:
    body: dict[str, object] = {"workflow": "acc-echo", "input": {"value": value}}
    if key is not None:
        body["idempotency_key"] = key
    return c.post("/runs", json=body)


def test_lists_come_from_the_standby_and_decisions_from_the_primary(
    stack: Stack, pair: StreamingPair
) -> None:
    with stack.client() as c, stack.client(ADMIN) as admin:
        before = _submit(c, "before").json()["run_id"]
        assert c.get(f"/runs/{before}/result", params={"wait": 60}).json()["done"]
        # The standby has replayed it to its end.
        wait_for_sync(
            lambda: _listed(c).get(before) == "completed", timeout=60, what="first run listed"
        )
        asyncio.run(pair.pause_replay())
        try:
            # Submit with an idempotency key, twice: the lookup of the retry is the
            # primary's (the standby has never seen the key), so one run.
            first = _submit(c, "after", key="replica-once")
            again = _submit(c, "after", key="replica-once")
            assert (first.status_code, again.status_code) == (201, 200), again.text
            after = first.json()["run_id"]
            assert again.json()["run_id"] == after
            # The worker claims, checkpoints and finishes it on the primary.
            result = c.get(f"/runs/{after}/result", params={"wait": 60}).json()
            assert result["done"] and result["output"] == "after", result
            # The single-run GET reads the primary: the client sees its own write.
            got = c.get(f"/runs/{after}")
            assert got.status_code == 200 and got.json()["status"] == "completed"
            # Lists and counts come from the standby, which stopped before the submit.
            assert _listed(c) == {before: "completed"}
            assert _listed(c, idempotency_key="replica-once") == {}
            counts = c.get("/runs/counts").json()
            assert counts["total"] == 1, counts
            # Per-run pages never 404 for a run the standby lacks: they ask the primary.
            report = c.get(f"/runs/{after}/report")
            assert report.status_code == 200 and report.json()["run"]["status"] == "completed"
            assert c.get(f"/runs/{after}/steps").json()["items"], "steps from the primary"
            assert c.get(f"/runs/{after}/events").status_code == 200
            assert c.get(f"/runs/{after}/logs").status_code == 200
            # The gauges count from the standby too (the first scrape computes them).
            scrape = httpx.get(stack.url + "/metrics").text
            lagging = metric(scrape, "treadle_db_replica_fallbacks_total", '{reason="lagging"}')
            assert metric(scrape, "treadle_runs", '{status="completed"}') == 1.0
            assert (metric(scrape, "treadle_db_pool_size_connections", '{pool="replica"}') or 0) > 0
            assert metric(scrape, "treadle_db_replica_lag_seconds") is not None
            # An API key made now exists on the primary only: it authenticates (the
            # lookup is the primary's), and once revoked it is refused at the next request.
            made = admin.post("/admin/api-keys", json={"name": "lagging", "scopes": ["runs:read"]})
            assert made.status_code == 201, made.text
            with stack.client(made.json()["api_key"]) as keyed:
                assert keyed.get("/runs").status_code == 200
                revoked = admin.delete(f"/admin/api-keys/{made.json()['key_id']}")
                assert revoked.status_code == 200, revoked.text
                assert keyed.get("/runs").status_code == 401
        finally:
            asyncio.run(pair.resume_replay())
        wait_for_sync(lambda: after in _listed(c), timeout=60, what="the run listed after resume")
        assert set(_listed(c, idempotency_key="replica-once")) == {after}
        assert c.get("/runs/counts").json()["total"] == 2
        scrape = httpx.get(stack.url + "/metrics").text
        # The standby was never skipped meanwhile: every list above was its answer.
        assert metric(scrape, "treadle_db_replica_fallbacks_total", '{reason="lagging"}') == (
            lagging
        )
        unavailable = metric(scrape, "treadle_db_replica_fallbacks_total", '{reason="unavailable"}')
        assert unavailable in (None, 0.0)


async def test_a_standby_too_far_behind_is_skipped_until_it_catches_up(
    pair: StreamingPair, tmp_path: Path
) -> None:
    db = Database(replica_settings(pair, tmp_path, pair.standby.url(DATABASE), max_lag=1.0))
    try:
        async with heartbeating(pair, db):
            assert await served_by_standby(db)
            assert not await _plain_read_on_standby(db)
            await pair.pause_replay()
            try:
                lagging = fallbacks("lagging")
                # The heartbeats go on on the primary; the standby receives them and
                # applies none: the one it shows ages from here.

                async def on_primary() -> bool:
                    return not await served_by_standby(db)

                await wait_for(
                    on_primary, timeout=60, interval=0.2, what="reads moved to the primary"
                )
                assert fallbacks("lagging") > lagging
            finally:
                await pair.resume_replay()
            await wait_for(
                lambda: served_by_standby(db), timeout=60, interval=0.2, what="standby used again"
            )
    finally:
        await db.dispose()


async def _plain_read_on_standby(db: Database) -> bool:
    # read() is never the standby's, replica or not.
    async with db.read() as conn:
        return bool((await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar_one())


async def test_an_unreachable_standby_sends_lagging_reads_to_the_primary(
    pair: StreamingPair, tmp_path: Path
) -> None:
    # A port nobody listens on: each connect is refused, as by a standby that is down.
    dead = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/{DATABASE}"
    db = Database(replica_settings(pair, tmp_path, dead, max_lag=30.0))
    try:
        unavailable = fallbacks("unavailable")
        assert not await served_by_standby(db)
        # The next one too (within the recheck second without even trying to connect).
        assert not await served_by_standby(db)
        assert fallbacks("unavailable") == unavailable + 2
    finally:
        await db.dispose()


async def test_a_standby_that_goes_down_is_skipped_and_used_again_once_back(
    pair: StreamingPair, tmp_path: Path
) -> None:
    db = Database(replica_settings(pair, tmp_path, pair.standby.url(DATABASE), max_lag=30.0))
    try:
        async with heartbeating(pair, db):
            assert await served_by_standby(db)  # a pooled connection to it now exists
            unavailable = fallbacks("unavailable")
            await asyncio.to_thread(pair.stop_standby)
            try:
                # The pooled connection is dead: its pre-ping fails, the reconnect is refused.
                assert not await served_by_standby(db)
                assert fallbacks("unavailable") > unavailable
            finally:
                await asyncio.to_thread(pair.start_standby)
            await wait_for(
                lambda: served_by_standby(db), timeout=60, interval=0.2, what="standby used again"
            )
    finally:
        await db.dispose()


def _standby_processes(pair: StreamingPair) -> list[int]:
    """The standby's postmaster and every process it started (backends, walreceiver)."""
    postmaster = int((pair.standby.dir / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *(int(pid) for pid in children)]


async def test_a_standby_that_stops_answering_is_skipped_within_the_timeouts(
    pair: StreamingPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every read re-measures the lag: the pooled connection's next statement meets the
    # frozen server at once, not after a recheck interval.
    monkeypatch.setattr(replica, "RECHECK_SECONDS", 0.0)
    settings = replica_settings(pair, tmp_path, pair.standby.url(DATABASE), max_lag=30.0)
    # asyncpg's command_timeout on the replica is this plus the connect timeout (6 s).
    db = Database(settings.model_copy(update={"db_statement_timeout_seconds": 1.0}))
    try:
        async with heartbeating(pair, db):
            assert await served_by_standby(db)  # a pooled connection to it now exists
            unavailable = fallbacks("unavailable")
            frozen = _standby_processes(pair)
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)  # alive and connected, answering nothing
            try:
                # The pre-ping of the pooled connection times out, so does the new connect:
                # the read goes to the primary instead of hanging or failing the request.
                assert not await asyncio.wait_for(served_by_standby(db), timeout=90)
                assert fallbacks("unavailable") > unavailable
                assert await asyncio.wait_for(_plain_read_on_standby(db), timeout=30) is False
            finally:
                for pid in frozen:
                    os.kill(pid, signal.SIGCONT)
            await wait_for(
                lambda: served_by_standby(db), timeout=90, interval=0.2, what="standby used again"
            )
    finally:
        await db.dispose()
