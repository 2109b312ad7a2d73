"""A standby cut off from its primary counts as lagging; an idle one that streams does not.

The replica's lag is the age on the standby of the heartbeat written on the primary
(app/db/replica.py, docs/adr/0049-replica-lag-from-a-heartbeat.md). Here the standby's
replication connection is really cut (:meth:`StreamingPair.cut_off`: its WAL receiver
dials a port nobody listens on), not only its replay paused: the standby has then
replayed all it received, which a lag taken from replay positions read as 0 for ever
(issue 34: ``treadle_db_replica_up`` stayed 1, lists stayed stale). Shown on an
in-process :class:`Database` running the heartbeat as the API does, and end to end on a
real ``treadle serve`` and worker over HTTP, whose lists must then show a run the
standby never received, with the gauges and the log saying why.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog
from sqlalchemy import text

from app.core.settings import Settings
from app.db import replica
from app.db.database import Database
from tests.acceptance.conftest import ROOT, Stack
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for, wait_for_sync
from tests.replica.conftest import (
    StreamingPair,
    asql,
    fallbacks,
    gauge,
    heartbeating,
    metric,
    replica_settings,
    served_by_standby,
    sql,
)

pytestmark = pytest.mark.xdist_group("replica")

LAG = "treadle_db_replica_lag_seconds"
UP = "treadle_db_replica_up"


@pytest.fixture
def database(pair: StreamingPair) -> Iterator[str]:
    """A migrated database of its own on the pair (other modules count the runs of theirs)."""
    name = pair.clone(remote_apply=False)
    yield name
    sql(pair.primary.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _settings(pair: StreamingPair, tmp: Path, database: str, max_lag: float) -> Settings:
    settings = replica_settings(pair, tmp, pair.standby.url(database), max_lag=max_lag)
    return settings.model_copy(update={"database_url": pair.primary.url(database)})


async def _replayed_all_received(pair: StreamingPair) -> bool:
    # What the old measure looked at: nothing received is left to replay.
    return bool(
        await asql(
            pair.standby.dsn(), "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()"
        )
    )


async def test_a_standby_cut_off_from_its_primary_is_skipped_until_it_streams_again(
    pair: StreamingPair, tmp_path: Path, database: str
) -> None:
    db = Database(_settings(pair, tmp_path, database, max_lag=1.0))
    try:
        async with heartbeating(pair, db):
            assert await served_by_standby(db)
            assert gauge(UP) == 1.0
            lagging = fallbacks("lagging")
            with structlog.testing.capture_logs() as logs:
                await pair.cut_off()
                try:
                    # Reachable, answering, nothing left to replay, and stale.
                    await wait_for(
                        lambda: _replayed_all_received(pair), what="the standby replayed all"
                    )

                    async def on_primary() -> bool:
                        return not await served_by_standby(db)

                    await wait_for(
                        on_primary, timeout=30, interval=0.1, what="reads moved to the primary"
                    )
                    assert fallbacks("lagging") > lagging
                    assert gauge(UP) == 0.0
                    lag = gauge(LAG)
                    assert lag is not None and lag > 1.0, lag
                finally:
                    await pair.reconnect()
            skipped = [e for e in logs if e["event"].startswith("read replica not used")]
            assert len(skipped) == 1, logs
            assert skipped[0]["reason"] == "lagging" and skipped[0]["lag_seconds"] > 1.0
            # The WAL receiver was not streaming (gone, or retrying the dead port).
            assert skipped[0]["wal_receiver"] != "streaming", skipped[0]
            await wait_for(
                lambda: served_by_standby(db), timeout=60, interval=0.1, what="standby used again"
            )
            lag = gauge(LAG)
            assert gauge(UP) == 1.0 and lag is not None and lag <= 1.0, lag
    finally:
        await db.dispose()


async def test_an_idle_standby_that_streams_counts_as_fresh(
    pair: StreamingPair, tmp_path: Path, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every read measures the lag (no recheck interval hides a bad measurement).
    monkeypatch.setattr(replica, "RECHECK_SECONDS", 0.0)
    db = Database(_settings(pair, tmp_path, database, max_lag=1.0))
    try:
        async with heartbeating(pair, db) as writer:
            lagging = fallbacks("lagging")
            written = writer.written
            # Nothing commits on the primary but the heartbeat, for three times the bound:
            # the standby's last replayed commit grows old, and yet every read, each one
            # measuring, is the standby's with a lag inside the bound. A window observed,
            # not a condition waited for: the loop paces its reads.
            deadline = time.monotonic() + 3.0
            reads = 0
            while time.monotonic() < deadline:
                assert await served_by_standby(db), f"read {reads} went to the primary"
                lag = gauge(LAG)
                assert lag is not None and 0.0 <= lag <= 1.0, lag
                reads += 1
                await asyncio.sleep(0.05)
            assert fallbacks("lagging") == lagging
            assert writer.written - written >= 4, "heartbeats every half bound (0.5 s)"
    finally:
        await db.dispose()


async def test_a_replica_without_a_heartbeat_is_not_trusted(
    pair: StreamingPair, tmp_path: Path, database: str
) -> None:
    # A database nobody beats for (no API with a replica has run on it): its lag cannot
    # be told, so the primary serves, and the gauge says unknown (-1).
    db = Database(_settings(pair, tmp_path, database, max_lag=30.0))
    try:
        empty = "SELECT count(*) = 0 FROM replica_heartbeat"
        assert await asql(pair.standby.dsn(database), empty)
        lagging = fallbacks("lagging")
        assert not await served_by_standby(db)
        assert fallbacks("lagging") == lagging + 1
        assert gauge(LAG) == -1.0 and gauge(UP) == 0.0
    finally:
        await db.dispose()


async def test_a_standby_of_a_database_without_the_heartbeat_table_is_not_trusted(
    pair: StreamingPair, tmp_path: Path, database: str
) -> None:
    # The read URL names another database of the standby (no Treadle schema): its lag
    # cannot be told, so the primary serves, rather than every list failing there.
    other = f"plain_{database}"
    await asyncio.to_thread(sql, pair.primary.dsn(), f'CREATE DATABASE "{other}"')
    try:
        await asyncio.to_thread(pair.wait_database, other)
        settings = _settings(pair, tmp_path, database, max_lag=30.0)
        db = Database(settings.model_copy(update={"read_database_url": pair.standby.url(other)}))
        try:
            lagging = fallbacks("lagging")
            assert not await served_by_standby(db)
            assert fallbacks("lagging") == lagging + 1
            assert gauge(LAG) == -1.0 and gauge(UP) == 0.0
        finally:
            await db.dispose()
    finally:
        drop = f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)'
        await asyncio.to_thread(sql, pair.primary.dsn(), drop)


async def test_many_processes_beating_write_about_once_an_interval(
    pair: StreamingPair, tmp_path: Path, database: str
) -> None:
    # Each API process beats every interval; a row younger than half of it is left alone,
    # so the primary sees about one heartbeat write per interval however many run.
    dbs = [Database(_settings(pair, tmp_path, database, max_lag=30.0)) for _ in range(3)]
    writers = [replica.ReplicaHeartbeat(d, replica.heartbeat_interval(30.0)) for d in dbs]
    age_sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp() - beat_at) FROM replica_heartbeat"
    try:
        # The table starts empty: the first beat inserts the row, the others find it fresh.
        assert [await w.beat_once() for w in writers] == [True, True, True]
        assert [w.written for w in writers] == [1, 0, 0]
        # Once it is older than half an interval, the next beat (whichever) moves it.
        async with dbs[0].write() as conn:
            await conn.execute(text("UPDATE replica_heartbeat SET beat_at = now() - interval '1h'"))
        assert [await w.beat_once() for w in reversed(writers)] == [True, True, True]
        assert [w.written for w in writers] == [1, 0, 1]
        async with dbs[0].read() as conn:
            rows, age = (
                await conn.execute(text(f"SELECT count(*), max(age) FROM ({age_sql}) AS a(age)"))
            ).one()
        assert rows == 1 and 0.0 <= float(age) < 0.5
    finally:
        for d in dbs:
            await d.dispose()


# --- end to end: treadle serve and a worker over HTTP ----------------------------------


@pytest.fixture
def stack(pair: StreamingPair, tmp_path: Path, database: str) -> Iterator[Stack]:
    """API and one worker on the primary, lists on the standby, a 2 s lag bound."""
    (tmp_path / "shared").mkdir()
    env = {
        "TREADLE_DATABASE_URL": pair.primary.url(database),
        "TREADLE_READ_DATABASE_URL": pair.standby.url(database),
        "TREADLE_READ_MAX_LAG_SECONDS": "2",
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_DATA_DIR": str(tmp_path / "data"),
        "TREADLE_LEASE_TTL_SECONDS": "3",
        "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
        "TREADLE_POLL_INTERVAL_SECONDS": "0.1",
        "TREADLE_LOG_FORMAT": "json",
        "TREADLE_TEST_DIR": str(tmp_path / "shared"),
        "PYTHONPATH": str(ROOT),
    }
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}, **env}
    s = Stack(database_url=env["TREADLE_DATABASE_URL"], tmp=tmp_path, env=env)
    try:
        s.start_api()
        s.start_worker()
        yield s
    finally:
        s.stop()


def _listed(c: httpx.Client) -> set[str]:
    resp = c.get("/runs", params={"limit": "200", "workflow": "acc-echo"})
    assert resp.status_code == 200, resp.text
    return {r["run_id"] for r in resp.json()["items"]}


def _run(c: httpx.Client, value: str) -> str:
    resp = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": value}})
    assert resp.status_code == 201, resp.text
    run_id = str(resp.json()["run_id"])
    assert c.get(f"/runs/{run_id}/result", params={"wait": 60}).json()["done"]
    return run_id


def _gauges(stack: Stack) -> tuple[float | None, float | None]:
    body = httpx.get(stack.url + "/metrics", timeout=30).text
    return metric(body, UP), metric(body, LAG)


def _api_log(stack: Stack) -> list[dict[str, object]]:
    lines = [
        line
        for log in stack.logs
        if log.name.startswith("api")
        for line in log.read_text(errors="replace").splitlines()
    ]
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_lists_stop_coming_from_a_standby_cut_off_from_its_primary(
    stack: Stack, pair: StreamingPair
) -> None:
    with stack.client() as c:
        before = _run(c, "before")
        wait_for_sync(lambda: before in _listed(c), timeout=60, what="the first run listed")
        up, lag = _gauges(stack)
        assert up == 1.0 and lag is not None and 0.0 <= lag <= 2.0, (up, lag)
        asyncio.run(pair.cut_off())
        try:
            # Finished on the primary after the cut: the standby never receives it, so a
            # list that shows it was served by the primary.
            after = _run(c, "after")
            wait_for_sync(
                lambda: after in _listed(c), timeout=30, interval=0.2, what="lists from the primary"
            )
            up, lag = _gauges(stack)
            assert up == 0.0 and lag is not None and lag > 2.0, (up, lag)
            body = httpx.get(stack.url + "/metrics", timeout=30).text
            moved = metric(body, "treadle_db_replica_fallbacks_total", '{reason="lagging"}')
            assert moved is not None and moved > 0
            # ... and stay so while it is cut off.
            assert {before, after} <= _listed(c)
        finally:
            asyncio.run(pair.reconnect())

        def fresh_again() -> bool:
            _listed(c)  # a read that may lag measures the standby again
            up, lag = _gauges(stack)
            return up == 1.0 and lag is not None and not math.isnan(lag) and lag <= 2.0

        wait_for_sync(fresh_again, timeout=60, interval=0.2, what="the standby used again")
        assert {before, after} <= _listed(c)
    events = _api_log(stack)
    skipped = [e for e in events if str(e.get("event", "")).startswith("read replica not used")]
    assert skipped and skipped[0]["reason"] == "lagging", skipped
    assert any(e.get("event") == "read replica in use again" for e in events)
