"""Treadle on a Patroni HA cluster: a kill -9 failover and a planned switchover under load.

The API (``treadle serve``) and two workers (``benchmarks.chaos_workflows``) connect with
a multi-host URL and ``target_session_attrs=read-write``. While runs with steps, durable
timers, signals and approvals are in flight, the primary's postmaster is killed (Patroni
promotes the synchronous standby), then a switchover is made. Every API response is
recorded; afterwards the chaos harness's invariants (``benchmarks.chaos.invariants``) are
checked from the database, plus: no acknowledged run missing, no 5xx but 503 (each with
Retry-After). The unavailability window (first failing to first succeeding ``POST /runs``)
is printed for each fault.

After each fault every worker process, a third one included that polls only once a
minute (``tests/ha/wake_workflows.py``), must have a LISTEN session on the new primary
(``application_name`` ``treadle-worker-listen`` in that node's ``pg_stat_activity``,
begun after the fault, tied to the worker by its client port) within 30 s of the cluster
being healthy, and that worker must then start a new run within 10 s: a ``NOTIFY``
wake-up, since its poll would take up to 60 s.

Bounded by default; ``TREADLE_HA_LONG=1`` (``make ha``) runs more runs and three
failovers in a row.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from app.worker.worker import LISTEN_APPLICATION_NAME
from benchmarks.chaos import Harness, Stats, invariants
from benchmarks.chaos_workflows import KINDS
from tests.acceptance.conftest import ROOT, Stack, token
from tests.conftest import DEV_SECRET
from tests.ha.cluster import Node, PatroniCluster, available
from tests.helpers import TLS, wait_for_sync

LONG = os.environ.get("TREADLE_HA_LONG") == "1"
RUNS = 120 if LONG else 30
FAILOVERS = 3 if LONG else 1
WORKERS = 2
SLEEPY_POLL_SECONDS = 60.0  # the long-poll worker's TREADLE_POLL_INTERVAL_SECONDS (max 60)
WAKE_BOUND_SECONDS = 10.0  # a NOTIFY-driven wake-up, far inside that poll interval
LISTEN_BOUND_SECONDS = 30.0  # LISTEN back on the new primary, after it is healthy

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=str(available())),
    pytest.mark.xdist_group("ha"),
]


class Load:
    """Submits runs, answers their waits, and records every API response with its time.

    Runs in a thread beside the test. A POST that fails (503, or any other status) is
    retried with the same idempotency key, so a run is acknowledged at most once.
    """

    def __init__(self, stack: Stack, runs: int) -> None:
        self.stack = stack
        self.todo = [(KINDS[i % len(KINDS)], i) for i in range(runs)]
        self.last = self.todo[-1]
        self.runs: dict[str, tuple[str, int]] = {}
        self.acked: set[str] = set()
        self.statuses: Counter[int] = Counter()
        self.no_retry_after = 0
        self.server_errors: list[str] = []
        self.transport_errors = 0
        self.posts: list[tuple[float, bool]] = []  # (monotonic time, succeeded) of POST /runs
        self.signalled: set[str] = set()
        self.decided: set[str] = set()
        self.stop = threading.Event()
        self.paced = threading.Event()  # set: submit one run per tick (keeps POSTs coming)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.stats = Stats()
        self.client = httpx.Client(
            base_url=stack.url,
            headers={"Authorization": f"Bearer {token()}"},
            timeout=30,
            verify=TLS,
        )
        self.approver = token(subject="approver")

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError:
            self.transport_errors += 1
            return None
        self.statuses[r.status_code] += 1
        if r.status_code == 503 and not r.headers.get("retry-after"):
            self.no_retry_after += 1
        if r.status_code >= 500 and r.status_code != 503:
            self.server_errors.append(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r

    def _submit(self, kind: str, n: int) -> bool:
        body = {
            "workflow": "chaos-mix",
            "input": {"kind": kind, "n": n},
            "idempotency_key": f"ha-{kind}-{n}",
        }
        r = self.call("POST", "/runs", json=body)
        ok = r is not None and r.status_code in (200, 201)
        self.posts.append((time.monotonic(), ok))
        if ok:
            assert r is not None
            run_id = r.json()["run_id"]
            self.runs[run_id] = (kind, n)
            self.acked.add(run_id)
        return ok

    def _answer(self) -> None:
        for status in ("waiting_approval", "waiting_signal"):
            r = self.call("GET", f"/runs?status={status}&workflow=chaos-mix&limit=200")
            if r is None or r.status_code != 200:
                continue
            for item in r.json()["items"]:
                run_id = item["run_id"]
                if run_id not in self.runs:
                    continue
                if status == "waiting_signal" and run_id not in self.signalled:
                    s = self.call(
                        "POST",
                        f"/runs/{run_id}/signals/go",
                        json={"payload": {"n": self.runs[run_id][1]}},
                    )
                    if s is not None and s.status_code == 202:
                        self.signalled.add(run_id)
                        self.stats.signals_sent += 1
                elif status == "waiting_approval" and run_id not in self.decided:
                    d = self.call(
                        "POST",
                        f"/runs/{run_id}/approvals/ok",
                        headers={"Authorization": f"Bearer {self.approver}"},
                        json={"decision": "approve"},
                    )
                    if d is not None and d.status_code in (200, 409):
                        self.decided.add(run_id)

    def _loop(self) -> None:
        while not self.stop.is_set():
            if self.todo:
                kind, n = self.todo[0]
                if self._submit(kind, n):
                    self.todo.pop(0)
            else:
                # Every run submitted: keep probing POST /runs with the last one's
                # idempotency key (200, the same run), so a later fault's window is seen.
                kind, n = self.last
                self._submit(kind, n)
            self._answer()
            time.sleep(0.05)

    def windows(self, since: float) -> float | None:
        """Seconds from the first failing POST after ``since`` to the next succeeding one."""
        first_fail = None
        for at, ok in self.posts:
            if at < since:
                continue
            if not ok and first_fail is None:
                first_fail = at
            elif ok and first_fail is not None:
                return at - first_fail
        return None


def _database(cluster: PatroniCluster) -> str:
    return cluster.create_database("treadle")


def _listeners(node: Node, since_epoch: float = 0.0) -> dict[int, int]:
    """``{client port: count}`` of LISTEN sessions on ``node`` that began after ``since``.

    ``since_epoch`` (wall-clock seconds, the same clock PostgreSQL's ``backend_start``
    reads on this machine) keeps out a session that was already there before a fault.
    Only sessions on ``node`` itself: the new primary, asked directly, not through the
    multi-host URL.
    """

    async def query() -> dict[int, int]:
        conn = await asyncpg.connect(node.url("postgres"), timeout=5)
        try:
            rows = await conn.fetch(
                "SELECT client_port, count(*) AS n FROM pg_stat_activity "
                "WHERE application_name = $1 AND datname = 'treadle' "
                "AND backend_start >= to_timestamp($2) GROUP BY client_port",
                LISTEN_APPLICATION_NAME,
                since_epoch,
            )
            return {int(r["client_port"]): int(r["n"]) for r in rows}
        finally:
            await conn.close()

    try:
        return asyncio.run(query())
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return {}


def _listening_workers(
    node: Node, workers: list[subprocess.Popen[bytes]], since_epoch: float = 0.0
) -> dict[int, int] | None:
    """``{worker pid: its LISTEN sessions on node}`` once every worker has one, else None.

    A LISTEN session is tied to its worker by the TCP port: pg_stat_activity's
    ``client_port`` is the local port of one of that worker process's sockets (psutil).
    """
    ports = _listeners(node, since_epoch)
    found: dict[int, int] = {}
    for proc in workers:
        try:
            local = {c.laddr.port for c in psutil.Process(proc.pid).net_connections("tcp")}
        except psutil.Error:
            return None
        found[proc.pid] = sum(n for port, n in ports.items() if port in local)
    return found if all(n >= 1 for n in found.values()) else None


def _wake_probe(stack: Stack, n: int) -> float:
    """Submit one ``ha-wake`` run; seconds from its acknowledgement to its completion.

    Only the long-poll worker runs ``ha-wake`` (tests/ha/wake_workflows.py), so a run
    finished well inside that worker's poll interval was claimed on a NOTIFY.
    """
    body = {"workflow": "ha-wake", "input": {"n": n}, "idempotency_key": f"ha-wake-{n}"}
    with stack.client() as c:

        def submit() -> str | None:
            r = c.post("/runs", json=body)
            return str(r.json()["run_id"]) if r.status_code in (200, 201) else None

        run_id = wait_for_sync(submit, timeout=60, interval=0.1, what="the wake probe acked")
        at = time.monotonic()
        wait_for_sync(
            lambda: c.get(f"/runs/{run_id}").json().get("status") == "completed",
            timeout=SLEEPY_POLL_SECONDS * 2,
            interval=0.05,
            what="the wake probe completed",
        )
        return time.monotonic() - at


def _terminal(cluster: PatroniCluster, runs: int) -> bool:
    async def count() -> int:
        conn = await asyncpg.connect(cluster.url("treadle", "postgresql"), timeout=5)
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM runs WHERE workflow = 'chaos-mix' AND status IN "
                    "('completed', 'failed', 'cancelled', 'compensated')"
                )
            )
        finally:
            await conn.close()

    try:
        return asyncio.run(count()) >= runs
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False


@pytest.mark.timeout(600 if LONG else 240)
def test_failover_and_switchover_under_load(cluster: PatroniCluster, tmp_path: Path) -> None:
    url = _database(cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(
        {
            "TREADLE_DATABASE_URL": url,
            "TREADLE_AUTH_MODE": "dev",
            "TREADLE_DEV_SECRET": DEV_SECRET,
            "TREADLE_DATA_DIR": str(tmp_path / "data"),
            "TREADLE_LEASE_TTL_SECONDS": "3",
            "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
            "TREADLE_POLL_INTERVAL_SECONDS": "0.2",
            "TREADLE_DRAIN_GRACE_SECONDS": "2",
            "TREADLE_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }
    )
    stack = Stack(database_url=url, tmp=tmp_path, env=env)
    load: Load | None = None
    faults: list[tuple[str, float | None]] = []
    wakes: list[tuple[str, float]] = []
    relisten: list[tuple[str, float, dict[int, int]]] = []
    try:
        stack.start_api()
        for _ in range(WORKERS):
            stack.start_worker("benchmarks.chaos_workflows", concurrency=16, timeout=120)
        # A third worker, of ha-wake only, that polls once a minute: a run of it that
        # starts within seconds was woken by NOTIFY, i.e. by a live LISTEN.
        stack.start_worker(
            "tests.ha.wake_workflows",
            concurrency=2,
            timeout=120,
            extra_env={
                "TREADLE_POLL_INTERVAL_SECONDS": str(SLEEPY_POLL_SECONDS),
                "TREADLE_LEASE_TTL_SECONDS": str(SLEEPY_POLL_SECONDS * 2),
            },
        )
        leader, _ = cluster.wait_healthy(timeout=120)
        wait_for_sync(
            lambda: _listening_workers(leader, stack.workers),
            timeout=60,
            what="every worker LISTENing",
        )
        wakes.append(("before any fault", _wake_probe(stack, 0)))
        load_started = time.monotonic()
        load = Load(stack, RUNS)
        load.thread.start()
        per_fault = max(1, RUNS // (FAILOVERS + 2))
        for i in range(FAILOVERS + 1):
            target = per_fault * (i + 1)
            wait_for_sync(
                lambda: len(load.acked) >= target or not load.todo,  # noqa: B023
                timeout=120,
                what="runs acknowledged before the fault",
            )
            cluster.wait_healthy(timeout=120)
            since = time.monotonic()
            since_epoch = time.time()
            if i < FAILOVERS:
                old = cluster.kill_primary_postmaster()
                name = f"kill -9 of {old.name}'s postmaster"
            else:
                old, _new = cluster.switchover()
                name = f"switchover from {old.name}"
            new, _standby = cluster.wait_healthy(timeout=120)
            assert new.name != old.name
            healthy_at = time.monotonic()
            # Each worker (by its own sockets) has a LISTEN session on the new primary,
            # opened after the fault.
            per_worker = wait_for_sync(
                lambda: _listening_workers(new, stack.workers, since_epoch),  # noqa: B023
                timeout=LISTEN_BOUND_SECONDS,
                interval=0.1,
                what=f"every worker LISTENing on {new.name} after the {name}",
            )
            relisten.append((name, time.monotonic() - healthy_at, per_worker))
            wakes.append((f"after the {name}", _wake_probe(stack, i + 1)))
            wait_for_sync(
                lambda: load.windows(since) is not None,  # noqa: B023
                timeout=60,
                what="a POST /runs to succeed after the fault",
            )
            faults.append((name, load.windows(since)))
        wait_for_sync(lambda: not load.todo, timeout=180, what="every run submitted")
        wait_for_sync(
            lambda: _terminal(cluster, len(load.runs)), timeout=180, what="every run terminal"
        )
    finally:
        if load is not None:
            load.stop.set()
            load.thread.join(timeout=60)
            load.client.close()
        stack.stop()
    assert load is not None
    load.stats.pg_restarts = len(faults)
    load.stats.outage_statuses = Counter({s: c for s, c in load.statuses.items() if s >= 500})
    load.stats.server_errors = load.server_errors
    load.stats.outage_retry_after = load.statuses[503] - load.no_retry_after
    # The chaos harness's invariant table, over this test's runs (its Harness attributes).
    h = SimpleNamespace(
        cluster=cluster,
        runs=load.runs,
        logs=stack.logs,
        stats=load.stats,
        args=SimpleNamespace(runs=RUNS),
        elapsed=time.monotonic() - load_started,
    )
    table = asyncio.run(invariants(cast(Harness, h)))
    print()
    for name, value, ok in table:
        print(f"{'ok  ' if ok else 'FAIL'} {name}  {value}")
    for name, window in faults:
        shown = "no failed POST seen" if window is None else f"{window:.2f} s"
        print(f"unavailability window, {name}: {shown}")
    for name, seconds, per_worker in relisten:
        print(
            f"LISTEN on the new primary {seconds:.2f} s after it was healthy, {name}: "
            f"sessions per worker pid {per_worker}"
        )
    for name, seconds in wakes:
        print(
            f"NOTIFY wake-up of the {SLEEPY_POLL_SECONDS:g} s-poll worker, {name}: {seconds:.2f} s"
        )
    print(f"API statuses: {dict(load.statuses)}; transport errors {load.transport_errors}")
    failed = [name for name, _, ok in table if not ok]
    assert not failed, failed
    assert not load.server_errors, load.server_errors[:5]
    assert load.no_retry_after == 0
    assert load.transport_errors == 0
    assert len(load.acked) == RUNS
    # The kill -9 failovers must have been seen by clients (else the probe proved nothing).
    assert all(w is not None for _, w in faults if _.startswith("kill")), faults
    # Every fault was followed by LISTEN on the new primary and a NOTIFY-speed wake-up.
    assert len(relisten) == len(faults) == FAILOVERS + 1
    slow = [(name, s) for name, s in wakes if s > WAKE_BOUND_SECONDS]
    assert not slow, f"woken by polling, not NOTIFY: {slow}"
