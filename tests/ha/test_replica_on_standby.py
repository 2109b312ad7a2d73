"""Reads that may lag, served by the Patroni synchronous standby, before and after failover.

The API and a worker run with ``TREADLE_DATABASE_URL`` = the cluster's multi-host
read-write URL and ``TREADLE_READ_DATABASE_URL`` = the synchronous standby's own address
(docs/adr/0033-lag-tolerant-reads-on-a-replica.md on a real HA cluster; tests/replica
does the same against a ``pg_basebackup`` standby).

1. **Lists from the standby, decisions from the primary.** Replay is paused on the
   standby, with Patroni in maintenance mode meanwhile (it would resume the replay);
   Patroni's ``synchronous_mode`` waits for the standby's flush, not its replay, so
   commits go on: a list and the counts miss the run submitted afterwards,
   while its submit, idempotent retry, claim, execution and single-run ``GET`` behave.
   ``pg_stat_activity`` on the standby shows sessions of the API process only, none of
   the worker's; ``treadle_db_replica_up`` is 1.
2. **Failover** (``kill -9`` of the primary's postmaster): the standby named by the
   read URL is promoted. Lists keep answering (200, or 503 with ``Retry-After`` during
   the window, never another 5xx); afterwards a new run is listed at once, and the
   gauges say what is true of that node: up, no lag (it is the primary now).
3. **Switchover back**: the read URL's node is demoted (restarted as a standby). While
   it is down, lists go to the primary (``treadle_db_replica_fallbacks_total{reason=
   "unavailable"}`` grows, and every scrape that says down shows the lag as NaN); once
   it streams again, the API's sessions on it (a standby: only the replica pool can be
   there) serve the lists again, with ``treadle_db_replica_up`` 1 and a finite lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from tests.acceptance.conftest import ROOT, Stack
from tests.conftest import DEV_SECRET
from tests.ha.cluster import Node, PatroniCluster, available
from tests.helpers import wait_for_sync

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=str(available())),
    pytest.mark.xdist_group("ha"),
]

DATABASE = "treadle_reads"
# Replay stays paused for a while, and the heartbeat the lag is the age of
# (docs/adr/0049-replica-lag-from-a-heartbeat.md) ages meanwhile; the bound has its own tests.
MAX_LAG_SECONDS = 3600.0


def _fetch(node: Node, sql: str, *args: object) -> list[Any]:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(node.url("postgres"), timeout=5)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def _sessions_by_pid(node: Node, procs: dict[str, int]) -> dict[str, int]:
    """``{process name: its sessions on node's DATABASE}``, by client port (psutil)."""
    rows = _fetch(node, "SELECT client_port FROM pg_stat_activity WHERE datname = $1", DATABASE)
    ports = [int(r["client_port"]) for r in rows if r["client_port"] is not None]
    found: dict[str, int] = {}
    for name, pid in procs.items():
        local = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")}
        found[name] = sum(1 for p in ports if p in local)
    return found


def _in_recovery(node: Node) -> bool:
    return bool(_fetch(node, "SELECT pg_is_in_recovery()")[0][0])


def _metric(body: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", body, re.M)
    return None if match is None else float(match.group(1))


def _listed(c: httpx.Client) -> dict[str, str] | None:
    r = c.get("/runs", params={"limit": "200", "workflow": "acc-echo"})
    if r.status_code != 200:
        return None
    return {i["run_id"]: i["status"] for i in r.json()["items"]}


def _submit(c: httpx.Client, value: str) -> str:
    body = {"workflow": "acc-echo", "input": {"value": value}, "idempotency_key": value}

    def post() -> str | None:
        r = c.post("/runs", json=body)
        return str(r.json()["run_id"]) if r.status_code in (200, 201) else None

    run_id: str = wait_for_sync(post, timeout=60, interval=0.1, what=f"submit of {value}")
    return run_id


def _completed(c: httpx.Client, run_id: str) -> None:
    wait_for_sync(
        lambda: c.get(f"/runs/{run_id}").json().get("status") == "completed",
        timeout=60,
        interval=0.05,
        what=f"run {run_id} completed",
    )


def _pause_replay(cluster: PatroniCluster, standby: Node) -> None:
    cluster.maintenance(True)  # else Patroni resumes the replay within a loop
    _fetch(standby, "SELECT pg_wal_replay_pause()")
    wait_for_sync(
        lambda: _fetch(standby, "SELECT pg_get_wal_replay_pause_state()")[0][0] == "paused",
        timeout=60,
        what="replay paused on the standby",
    )


def _resume_replay(cluster: PatroniCluster, standby: Node) -> None:
    with contextlib.suppress(OSError, asyncpg.PostgresError):  # promoted: nothing paused
        _fetch(standby, "SELECT pg_wal_replay_resume()")
    cluster.maintenance(False)


def _gauges(stack: Stack) -> tuple[float | None, float | None]:
    body = httpx.get(stack.url + "/metrics", timeout=30).text
    return (
        _metric(body, "treadle_db_replica_up"),
        _metric(body, "treadle_db_replica_lag_seconds"),
    )


def _role_gauge(stack: Stack) -> float | None:
    body = httpx.get(stack.url + "/metrics", timeout=30).text
    return _metric(body, "treadle_db_replica_in_recovery")


class Reader:
    """Lists runs and scrapes /metrics in a loop beside a fault; records what it saw."""

    def __init__(self, stack: Stack) -> None:
        self.client = stack.client()
        self.metrics_url = stack.url + "/metrics"
        self.statuses: dict[int, int] = {}
        self.bad: list[str] = []  # 5xx other than 503, or a 503 without Retry-After
        self.samples: list[tuple[float, float | None]] = []  # (replica_up, lag) per scrape
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                r = self.client.get("/runs", params={"limit": "10"})
                self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
                if r.status_code >= 500 and not (
                    r.status_code == 503 and r.headers.get("retry-after")
                ):
                    self.bad.append(f"{r.status_code} {r.text[:200]}")
                body = httpx.get(self.metrics_url, timeout=30).text
                up = _metric(body, "treadle_db_replica_up")
                if up is not None:
                    self.samples.append((up, _metric(body, "treadle_db_replica_lag_seconds")))
            except httpx.HTTPError as exc:
                self.bad.append(f"transport: {exc}")
            time.sleep(0.05)

    def __enter__(self) -> Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.client.close()


def _fallbacks(stack: Stack) -> dict[str, float]:
    body = httpx.get(stack.url + "/metrics", timeout=30).text
    return {
        reason: _metric(body, "treadle_db_replica_fallbacks_total", f'{{reason="{reason}"}}') or 0.0
        for reason in ("unavailable", "lagging")
    }


@pytest.mark.timeout(420)
def test_lists_on_the_patroni_standby_before_and_after_failover(
    cluster: PatroniCluster, tmp_path: Path
) -> None:
    url = cluster.create_database(DATABASE)
    primary, standby = cluster.wait_healthy(timeout=120)
    read_url = f"postgresql+asyncpg://postgres@127.0.0.1:{standby.pg_port}/{DATABASE}"
    (tmp_path / "shared").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(
        {
            "TREADLE_DATABASE_URL": url,
            "TREADLE_READ_DATABASE_URL": read_url,
            "TREADLE_READ_MAX_LAG_SECONDS": str(MAX_LAG_SECONDS),
            "TREADLE_AUTH_MODE": "dev",
            "TREADLE_DEV_SECRET": DEV_SECRET,
            "TREADLE_DATA_DIR": str(tmp_path / "data"),
            "TREADLE_LEASE_TTL_SECONDS": "3",
            "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
            "TREADLE_POLL_INTERVAL_SECONDS": "0.2",
            "TREADLE_LOG_FORMAT": "json",
            "TREADLE_TEST_DIR": str(tmp_path / "shared"),
            "PYTHONPATH": str(ROOT),
        }
    )
    stack = Stack(database_url=url, tmp=tmp_path, env=env)
    paused = False
    try:
        stack.start_api()
        worker = stack.start_worker(timeout=120)
        assert stack.api is not None
        procs = {"api": stack.api.pid, "worker": worker.pid}
        with stack.client() as c:
            # --- 1. lists from the standby, decisions from the primary ------------------
            before = _submit(c, "before")
            _completed(c, before)
            wait_for_sync(
                lambda: (_listed(c) or {}).get(before) == "completed",
                timeout=60,
                what="the first run listed from the standby",
            )
            paused = True  # first: a failure half-way still ends maintenance mode
            _pause_replay(cluster, standby)
            after = _submit(c, "after")
            again = c.post(
                "/runs",
                json={
                    "workflow": "acc-echo",
                    "input": {"value": "after"},
                    "idempotency_key": "after",
                },
            )
            # The retry's idempotency lookup is the primary's: the standby lacks the key.
            assert again.status_code == 200 and again.json()["run_id"] == after, again.text
            _completed(c, after)  # claimed, checkpointed, finished on the primary
            assert c.get(f"/runs/{after}").json()["status"] == "completed"
            # The list and the counts are the standby's, which stopped before the submit.
            assert _listed(c) == {before: "completed"}
            assert c.get("/runs/counts").json()["total"] == 1
            up, lag = _gauges(stack)
            assert up == 1.0 and lag is not None and 0.0 <= lag <= MAX_LAG_SECONDS, (up, lag)
            assert _role_gauge(stack) == 1.0  # a standby: the reads are offloaded
            # Who is connected to the standby: the API (its replica pool), never the worker
            # (claims, heartbeats, checkpoints), although it was given the same read URL.
            on_standby = _sessions_by_pid(standby, procs)
            assert on_standby["api"] >= 1 and on_standby["worker"] == 0, on_standby
            assert _sessions_by_pid(primary, procs)["worker"] >= 1
            _resume_replay(cluster, standby)
            paused = False
            wait_for_sync(
                lambda: after in (_listed(c) or {}), timeout=60, what="listed after resume"
            )

            # --- 2. failover: the read URL's node becomes the primary -------------------
            with Reader(stack) as during_failover:
                killed = cluster.kill_primary_postmaster()
                assert killed is primary
                promoted, _rejoined = cluster.wait_healthy(timeout=120)
                assert promoted is standby
                post = _submit(c, "post-failover")
                _completed(c, post)
            assert not during_failover.bad, during_failover.bad[:5]
            assert not _in_recovery(standby)
            # The read URL now names the primary: a run is listed as soon as it is done.
            assert (_listed(c) or {}).get(post) == "completed"
            # Within a recheck interval the gauges say what is true of that node: it
            # serves, and it trails nothing.
            wait_for_sync(
                lambda: _gauges(stack) == (1.0, 0.0), timeout=10, what="gauges: up, lag 0"
            )
            # ... and that it is a primary now: the reads offload nothing.
            wait_for_sync(
                lambda: _role_gauge(stack) == 0.0, timeout=10, what="gauge: not in recovery"
            )
            failover_reads = dict(during_failover.statuses)

            # --- 3. switchover back: the read URL's node is a standby again -------------
            skipped = _fallbacks(stack)
            with Reader(stack) as during_switchover:
                old, new = cluster.switchover()
                assert (old, new) == (standby, primary)
                cluster.wait_healthy(timeout=120)
                wait_for_sync(
                    lambda: _in_recovery(standby), timeout=60, what="the read node a standby"
                )
                back = _submit(c, "post-switchover")
                _completed(c, back)
                wait_for_sync(
                    lambda: (_listed(c) or {}).get(back) == "completed",
                    timeout=60,
                    what="the run listed after the switchover",
                )
            assert not during_switchover.bad, during_switchover.bad[:5]
            # While the node restarted, reads went to the primary and were counted so:
            # unavailable while it was down, lagging while its lag could not be told.
            skipped_now = _fallbacks(stack)
            assert sum(skipped_now.values()) > sum(skipped.values()), (skipped, skipped_now)
            # Every scrape is consistent with the gauges' meaning (app/core/metrics.py):
            # up with a lag inside the bound, or down with NaN (unreachable), -1 (lag
            # unknown: no heartbeat seen on it, docs/adr/0049) or a lag past it.
            for up, lag in during_switchover.samples + during_failover.samples:
                assert lag is not None, (up, lag)
                if up == 1.0:
                    assert 0.0 <= lag <= MAX_LAG_SECONDS, (up, lag)
                else:
                    assert up == 0.0 and (math.isnan(lag) or lag == -1.0 or lag > MAX_LAG_SECONDS)
            # The gauges say the standby serves again, within a recheck interval...
            wait_for_sync(
                lambda: (
                    (g := _gauges(stack))[0] == 1.0
                    and g[1] is not None
                    and 0.0 <= g[1] <= MAX_LAG_SECONDS
                ),
                timeout=30,
                what="gauges: up, a lag inside the bound",
            )
            wait_for_sync(
                lambda: _role_gauge(stack) == 1.0, timeout=30, what="gauge: a standby again"
            )
            # ... and it does: with its replay paused, lists miss a run finished since.
            paused = True  # first: a failure half-way still ends maintenance mode
            _pause_replay(cluster, standby)
            unseen = _submit(c, "unseen")
            _completed(c, unseen)
            listed = _listed(c)
            assert listed is not None and back in listed and unseen not in listed, listed
            assert _gauges(stack)[0] == 1.0
            assert _sessions_by_pid(standby, procs)["worker"] == 0
            _resume_replay(cluster, standby)
            paused = False
            seen = Counter(
                "up" if up == 1.0 else ("down, NaN" if math.isnan(lag or 0.0) else f"down, {lag}")
                for up, lag in during_switchover.samples
            )
            print()
            print(f"reads during the failover: {failover_reads}")
            print(f"reads during the switchover: {during_switchover.statuses}")
            print(f"gauges scraped during the switchover: {dict(seen)}")
            print(f"fallbacks by reason over the switchover: {skipped} -> {skipped_now}")
    finally:
        if paused:
            _resume_replay(cluster, standby)
        stack.stop()
