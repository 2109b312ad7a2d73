"""Chaos harness: thousands of runs while workers are killed and PostgreSQL restarts.

Usage::

    uv run python -m benchmarks.chaos --runs 2000 --kill-every 1.5
    uv run python -m benchmarks.chaos --runs 60 --kill-every 1 --timeout 240   # CI size

It creates its *own* PostgreSQL cluster (``initdb`` in a temporary directory, another
port) so it can restart it, migrates it, and starts ``treadle serve`` and three
``treadle worker`` processes loading :mod:`benchmarks.chaos_workflows`. It submits runs
mixing retries, parallel branches, durable sleeps, approvals and signals (the harness
decides the approvals and sends the signals, half of them before the run waits) and
permanent failures. Meanwhile it kills a random worker every ``--kill-every`` seconds
(``kill -9`` or SIGTERM, then starts a new one) and restarts PostgreSQL once, probing the
API while the database is down (it must answer 503 with ``Retry-After``, never 500).

When every run is terminal it stops the processes and prints an invariant table computed
from the database; the exit status is 1 if any invariant is violated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.db.migrations import upgrade_to_head
from benchmarks.chaos_workflows import KINDS, expected_output

ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("TREADLE_PG_BIN", "/usr/lib/postgresql/15/bin"))
SECRET = "chaos-secret-" + "c" * 40
TERMINAL = ("completed", "failed", "cancelled", "compensated")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A throwaway PostgreSQL cluster the harness may stop and start at will."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "pg"
        self.port = _free_port()
        self.log = root / "postgres.log"
        self.dir.mkdir()
        # initdb refuses to run as root: run the server as the postgres user then.
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
            shutil.chown(self.dir, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True)

    def init(self) -> None:
        """Initdb with trust auth for local connections."""
        self._run(str(PG_BIN / "initdb"), "-D", str(self.dir), "-U", "postgres", "-A", "trust")

    def start(self) -> None:
        """Start and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c fsync=off -c synchronous_commit=off"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-o", options, "-w",
            "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Fast shutdown (connections are cut, as in a failover)."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop")

    def url(self, database: str, driver: str = "postgresql+asyncpg") -> str:
        """URL of a database on this cluster."""
        return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"


@dataclass
class Stats:
    """What the harness did and saw."""

    kills: int = 0
    terms: int = 0
    worker_starts: int = 0
    pg_restarts: int = 0
    outage_statuses: Counter[int] = field(default_factory=Counter)
    outage_retry_after: int = 0
    server_errors: list[str] = field(default_factory=list)
    signals_sent: int = 0
    decisions_sent: int = 0


class Harness:
    """The API, the workers, the client side and the faults."""

    def __init__(self, args: argparse.Namespace, root: Path, cluster: Cluster) -> None:
        self.args = args
        self.root = root
        self.cluster = cluster
        self.rng = random.Random(args.seed)
        self.stats = Stats()
        self.url = ""
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
        self.env.update(
            {
                "TREADLE_DATABASE_URL": cluster.url("treadle"),
                # Explicit: `treadle serve` on PostgreSQL refuses dev auth nobody chose.
                "TREADLE_AUTH_MODE": "dev",
                "TREADLE_DEV_SECRET": SECRET,
                "TREADLE_DATA_DIR": str(root / "data"),
                "TREADLE_LEASE_TTL_SECONDS": "3",
                "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
                "TREADLE_POLL_INTERVAL_SECONDS": "0.2",
                "TREADLE_DRAIN_GRACE_SECONDS": "2",
                "TREADLE_LOG_FORMAT": "json",
                "PYTHONPATH": str(ROOT),
            }
        )
        tokens = DevTokens(SECRET)
        self.token = tokens.mint(tenant_id="chaos", subject="harness", scopes=ALL_SCOPES)
        self.approver = tokens.mint(tenant_id="chaos", subject="approver", scopes=ALL_SCOPES)
        self.runs: dict[str, tuple[str, int]] = {}
        self.signalled: set[str] = set()
        self.decided: set[str] = set()

    # --- processes ------------------------------------------------------------------------

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.root / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "app.cli.main", *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def start_api(self) -> None:
        """Start ``treadle serve`` and wait for /readyz."""
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.api = self._spawn(["serve", "--port", str(port)], "api")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("the API did not become ready")

    def start_worker(self) -> subprocess.Popen[bytes]:
        """Start one worker process (it registers itself)."""
        self.stats.worker_starts += 1
        return self._spawn(
            ["worker", "--handlers", "benchmarks.chaos_workflows", "--concurrency", "16"],
            "worker",
        )

    def kill_one(self) -> None:
        """``kill -9`` (two times in three) or SIGTERM a random worker; start a new one."""
        index = self.rng.randrange(len(self.workers))
        victim = self.workers[index]
        if self.rng.random() < 2 / 3:
            victim.send_signal(signal.SIGKILL)
            self.stats.kills += 1
        else:
            victim.send_signal(signal.SIGTERM)
            self.stats.terms += 1
        victim.wait(timeout=30)
        self.workers[index] = self.start_worker()

    def stop_all(self) -> None:
        """SIGTERM every process and wait for it."""
        procs = [*self.workers, *([self.api] if self.api else [])]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # --- client side ----------------------------------------------------------------------

    def call(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        """One API call; 5xx other than 503 is recorded as a violation; None on failure."""
        try:
            r = httpx.request(
                method,
                self.url + path,
                headers={"Authorization": f"Bearer {token or self.token}"},
                timeout=30,
                **kw,
            )
        except httpx.HTTPError:
            return None
        if r.status_code >= 500 and r.status_code != 503:
            self.stats.server_errors.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
        return r

    def submit(self, kind: str, n: int) -> None:
        """Submit one run (retrying while the database is down)."""
        key = f"chaos-{kind}-{n}"
        body = {"workflow": "chaos-mix", "input": {"kind": kind, "n": n}, "idempotency_key": key}
        for _ in range(100):
            r = self.call("POST", "/runs", json=body)
            if r is not None and r.status_code in (200, 201):
                run_id = r.json()["run_id"]
                self.runs[run_id] = (kind, n)
                if kind == "signal" and n % 2 == 0:  # half before the run waits: buffered
                    self.send_signal(run_id, n)
                return
            time.sleep(0.2)
        raise SystemExit(f"could not submit {key}")

    def send_signal(self, run_id: str, n: int) -> None:
        """Send the run's one signal (once)."""
        r = self.call("POST", f"/runs/{run_id}/signals/go", json={"payload": {"n": n}})
        if r is not None and r.status_code == 202:
            self.signalled.add(run_id)
            self.stats.signals_sent += 1

    def answer_waiting(self) -> None:
        """Approve waiting approvals and signal waiting runs not signalled yet."""
        for status in ("waiting_approval", "waiting_signal"):
            r = self.call("GET", f"/runs?status={status}&workflow=chaos-mix&limit=200")
            if r is None or r.status_code != 200:
                continue
            for item in r.json()["items"]:
                run_id = item["run_id"]
                if status == "waiting_signal" and run_id not in self.signalled:
                    self.send_signal(run_id, self.runs[run_id][1])
                elif status == "waiting_approval" and run_id not in self.decided:
                    d = self.call(
                        "POST",
                        f"/runs/{run_id}/approvals/ok",
                        token=self.approver,
                        json={"decision": "approve"},
                    )
                    if d is not None and d.status_code == 200:
                        self.decided.add(run_id)
                        self.stats.decisions_sent += 1

    def restart_postgres(self) -> None:
        """Stop PostgreSQL, probe the API while it is down, start it again."""
        self.cluster.stop()
        for _ in range(5):
            for method, path, body in (
                ("GET", "/runs?limit=1", None),
                ("POST", "/runs", {"workflow": "chaos-mix", "input": {"kind": "sleep", "n": 0}}),
            ):
                r = self.call(method, path, json=body)
                if r is not None:
                    self.stats.outage_statuses[r.status_code] += 1
                    if r.status_code == 503 and r.headers.get("retry-after"):
                        self.stats.outage_retry_after += 1
            time.sleep(0.2)
        self.cluster.start()
        self.stats.pg_restarts += 1

    # --- the run ---------------------------------------------------------------------------

    async def _terminal_count(self) -> int:
        conn = await asyncpg.connect(self.cluster.url("treadle", "postgresql"))
        try:
            value = await conn.fetchval(
                "SELECT count(*) FROM runs WHERE status = ANY($1::text[])", list(TERMINAL)
            )
            return int(value)
        finally:
            await conn.close()

    def terminal_count(self) -> int:
        """Runs already terminal (0 while the database is unreachable)."""
        try:
            return asyncio.run(self._terminal_count())
        except (OSError, asyncpg.PostgresError):
            return 0

    def run(self) -> None:
        """Submit, fault, answer waits, until every run is terminal or the timeout."""
        self.start_api()
        self.workers = [self.start_worker() for _ in range(self.args.workers)]
        todo = [(KINDS[i % len(KINDS)], i) for i in range(self.args.runs)]
        self.rng.shuffle(todo)
        started = time.monotonic()
        next_kill = started + self.args.kill_every
        restarted = False
        while True:
            for kind, n in todo[: self.args.submit_batch]:
                self.submit(kind, n)
            todo = todo[self.args.submit_batch :]
            now = time.monotonic()
            if now >= next_kill:
                self.kill_one()
                next_kill = now + self.args.kill_every
            done = self.terminal_count()
            if not restarted and len(self.runs) >= self.args.runs // 2:
                self.restart_postgres()
                restarted = True
            self.answer_waiting()
            if not todo and done >= len(self.runs):
                break
            if now - started > self.args.timeout:
                print(f"timeout: {done}/{len(self.runs)} runs terminal", file=sys.stderr)
                break
            time.sleep(0.2)
        self.elapsed = time.monotonic() - started
        self.stop_all()


async def invariants(h: Harness) -> list[tuple[str, Any, bool]]:
    """(name, value, ok) rows computed from the database after the run."""
    conn = await asyncpg.connect(h.cluster.url("treadle", "postgresql"))
    try:
        rows = await conn.fetch("SELECT run_id, status, output, attempt, lease_owner FROM runs")
        q = conn.fetchval
        by_id = {str(r["run_id"]): r for r in rows}
        wrong = []
        for run_id, (kind, n) in h.runs.items():
            row = by_id.get(run_id)
            status, output = expected_output(kind, n)
            got = None if row is None or row["output"] is None else json.loads(row["output"])
            if row is None or row["status"] != status or got != output:
                wrong.append(run_id)
        not_terminal = sum(r["status"] not in TERMINAL for r in rows)
        dup_results = await q(
            "SELECT count(*) FROM (SELECT run_id, step_id FROM events WHERE kind = "
            "'step_succeeded' GROUP BY run_id, step_id HAVING count(*) > 1) d"
        )
        dup_completions = await q(
            "SELECT count(*) FROM (SELECT run_id FROM events WHERE kind = 'run_completed' "
            "GROUP BY run_id HAVING count(*) > 1) d"
        )
        future_fence = await q(
            "SELECT count(*) FROM steps s JOIN runs r USING (run_id) WHERE s.fence > r.fence"
        )
        unconsumed = await q("SELECT count(*) FROM signals WHERE consumed_step_id IS NULL")
        double_consumed = await q(
            "SELECT count(*) FROM (SELECT run_id, consumed_step_id FROM signals WHERE "
            "consumed_step_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1) d"
        )
        signal_runs = [r for r, (k, _) in h.runs.items() if k == "signal"]
        approval_runs = [r for r, (k, _) in h.runs.items() if k == "approval"]
        decisions = await q("SELECT count(*) FROM approval_decisions")
        unresolved = await q(
            "SELECT count(*) FROM steps WHERE kind = 'approval' AND status <> 'succeeded'"
        )
        held = sum(r["lease_owner"] is not None for r in rows)
        # Attempts cut short by a killed worker do not use the retry budget (up to
        # TREADLE_MAX_LOST_ATTEMPTS, default 3): they are recorded in the step's detail.
        lost = "COALESCE((detail::jsonb ->> 'lost_attempts')::int, 0)"
        over_limit = await q(f"SELECT count(*) FROM steps WHERE attempt - {lost} > max_attempts")
        max_lost = await q(f"SELECT COALESCE(max({lost}), 0) FROM steps")
        recovered = await q(
            "SELECT count(*) FROM steps WHERE kind = 'step' AND name NOT LIKE '%flaky%' "
            "AND attempt > 1"
        )
        lost_marks = await q("SELECT count(*) FROM steps WHERE detail LIKE '%lost_attempts%'")
    finally:
        await conn.close()
    lease_lost = sum(log.read_text(errors="replace").count("lease lost") for log in h.logs)
    s = h.stats
    outage = dict(s.outage_statuses)
    return [
        ("runs submitted", len(h.runs), len(h.runs) == h.args.runs),
        ("runs not terminal", not_terminal, not_terminal == 0),
        ("runs with an unexpected status or output", len(wrong), not wrong),
        ("steps with two committed results", dup_results, dup_results == 0),
        ("runs completed twice", dup_completions, dup_completions == 0),
        ("checkpoints under a fence the run never had", future_fence, future_fence == 0),
        ("signals sent / signal runs", f"{s.signals_sent} / {len(signal_runs)}", True),
        ("signals not consumed", unconsumed, unconsumed == 0),
        ("waits that consumed two signals", double_consumed, double_consumed == 0),
        ("approval decisions / approval runs", f"{decisions} / {len(approval_runs)}", True),
        ("approvals not resolved", unresolved, unresolved == 0),
        ("leases still held", held, held == 0),
        ("steps over max_attempts (lost attempts aside)", over_limit, over_limit == 0),
        ("most lost attempts of one step (limit 3)", max_lost, max_lost <= 3),
        ("kill -9 / SIGTERM / worker starts", f"{s.kills} / {s.terms} / {s.worker_starts}", True),
        ("PostgreSQL restarts", s.pg_restarts, s.pg_restarts >= 1 or h.args.runs < 2),
        ("API statuses while PostgreSQL was down", outage, set(outage) <= {503}),
        ("  of which 503 with Retry-After", s.outage_retry_after, True),
        ("5xx other than 503 seen by the harness", len(s.server_errors), not s.server_errors),
        ("steps re-run after a lost worker (recoveries)", recovered, True),
        ("steps with lost attempts recorded", lost_marks, True),
        ("stale commits refused ('lease lost' in logs)", lease_lost, True),
        ("elapsed seconds", round(h.elapsed, 1), True),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the harness; print the invariant table; 0 when every invariant holds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=1.5, help="seconds between kills")
    parser.add_argument("--submit-batch", type=int, default=25, help="runs submitted per tick")
    parser.add_argument("--timeout", type=float, default=1800, help="give up after (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the cluster and logs")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="treadle-chaos-"))
    cluster = Cluster(root)
    cluster.init()
    cluster.start()
    harness = Harness(args, root, cluster)
    try:

        async def create() -> None:
            conn = await asyncpg.connect(cluster.url("postgres", "postgresql"))
            try:
                await conn.execute("CREATE DATABASE treadle")
            finally:
                await conn.close()

        asyncio.run(create())
        upgrade_to_head(cluster.url("treadle"))
        try:
            harness.run()
        finally:
            harness.stop_all()
        table = asyncio.run(invariants(harness))
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    width = max(len(name) for name, _, _ in table)
    print(f"chaos run {uuid.uuid4().hex[:8]}: {args.runs} runs, seed {args.seed}")
    for name, value, ok in table:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<{width}}  {value}")
    for error in harness.stats.server_errors[:10]:
        print("  5xx:", error)
    if args.keep:
        print(f"kept in {root}")
    return 0 if all(ok for _, _, ok in table) else 1


if __name__ == "__main__":
    sys.exit(main())
