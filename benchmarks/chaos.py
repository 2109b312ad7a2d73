"""Chaos harness: thousands of runs while workers are killed and PostgreSQL restarts.

Usage::

    uv run python -m benchmarks.chaos --runs 2000 --kill-every 1.5
    uv run python -m benchmarks.chaos --runs 60 --kill-every 1 --pg-restart-every 3:8  # CI
    uv run python -m benchmarks.chaos --pg-restart-every off   # one restart, mid-run

It creates its *own* PostgreSQL cluster (``initdb`` in a temporary directory, another
port) so it can restart it, migrates it, and starts ``treadle serve`` and three
``treadle worker`` processes loading :mod:`benchmarks.chaos_workflows`. It submits runs
mixing retries, parallel branches, durable sleeps, approvals and signals (the harness
decides the approvals and sends the signals, half of them before the run waits) and
permanent failures. Meanwhile it kills a random worker every ``--kill-every`` seconds
(``kill -9`` or SIGTERM, then starts a new one) and a database chaos monkey
(:class:`PostgresMonkey`, its own thread) restarts PostgreSQL for the whole run: every
``--pg-restart-every`` LO:HI seconds (default 5:40), down ``--pg-down`` LO:HI seconds
(default 0:2) each time, alternately a crash (``pg_ctl stop -m immediate``) and a clean
shutdown (``-m fast``). While the database is down it probes the API: it
must answer 503 with ``Retry-After``, never 500, and within 10 s. ``--pg-restart-every off``
restarts PostgreSQL once instead, mid-submission.

When every run is terminal it stops the monkey, checks that every live worker heartbeats
again, stops the processes and prints an invariant table computed from the database
(acknowledged runs, signals and decisions present; restarts done, with runs in flight;
the 503 and 500 counts); the exit status is 1 if any invariant is violated.
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
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
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
            # fsync off: only PostgreSQL is crashed, never the machine, so what reached the
            # kernel survives. synchronous_commit stays on: a crash restart (``pg_ctl stop
            # -m immediate``) would lose commits still in the WAL buffers, which the API
            # had already acknowledged; that loss would be the harness's, not Treadle's.
            "-c max_connections=200 -c fsync=off"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-o", options, "-w",
            "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server and wait until it is gone.

        Args:
            mode: ``"fast"`` (a clean shutdown: connections are cut, as in a failover)
                or ``"immediate"`` (a crash: every process quits at once, the next start
                replays the WAL), the ``pg_ctl stop -m`` modes.
        """
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", mode, "-w", "stop")

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
    # Every 5xx status any call of the harness got (503s are expected while the database
    # is down, or busy just after; anything else is a violation).
    server_statuses: Counter[int] = field(default_factory=Counter)
    # Processes that exited without the harness signalling them: "<what>: <why>".
    unexpected_exits: list[str] = field(default_factory=list)
    # Workers still running 30 s after their SIGTERM (then killed).
    slow_shutdowns: int = 0
    # Live workers that did not heartbeat once the database was back for good.
    silent_workers: list[str] = field(default_factory=list)


def seconds_range(text: str) -> tuple[float, float] | None:
    """Parse a ``LO:HI`` range of seconds (or one number, ``LO`` = ``HI``).

    Returns:
        ``(lo, hi)``, or None for ``off`` / ``0`` (the monkey is off).

    Raises:
        argparse.ArgumentTypeError: not numbers, negative, or ``lo > hi``.
    """
    if text.strip().lower() in ("off", "0", "0:0"):
        return None
    try:
        lo, _, hi = text.partition(":")
        bounds = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI seconds, got {text!r}") from None
    if bounds[0] < 0 or bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO <= HI, got {text!r}")
    return bounds


@dataclass(frozen=True)
class Restart:
    """One restart by the monkey.

    Attributes:
        mode: ``"immediate"`` (a crash) or ``"fast"`` (a clean shutdown).
        down_seconds: from the server being gone to the start being issued.
        in_flight: runs submitted and not yet terminal, as the harness last counted them.
    """

    mode: str
    down_seconds: float
    in_flight: int


class PostgresMonkey:
    """Restarts PostgreSQL at random for the whole run, from a thread of its own.

    As DBOS's chaos tests do: it waits a uniform ``every`` (LO, HI seconds), stops the
    cluster, keeps it down a uniform ``down`` (LO, HI) seconds while calling ``probe()``
    (at least once per outage: the API must answer 503), and starts it again; until
    :meth:`stop`. The stops alternate between ``pg_ctl stop -m immediate`` (a crash: the
    next start replays the WAL) and ``-m fast`` (clean), the first chosen at random, so
    any two restarts include one of each. Its own thread, so restarts land whatever the
    harness's loop is blocked on (a submission retrying, a worker's SIGTERM).

    Args:
        cluster: the harness's own cluster (never the shared one).
        every: seconds between restarts (uniform in the range).
        down: seconds each outage lasts (uniform in the range).
        seed: of the monkey's own random choices (the harness's stay reproducible).
        probe: called repeatedly while the server is down.
        in_flight: the number of runs not yet terminal (recorded per restart).

    Attributes:
        restarts: every restart done, in order.
        errors: ``pg_ctl`` failures (a restart the harness could not do is a failed run).
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        every: tuple[float, float],
        down: tuple[float, float],
        seed: int,
        probe: Callable[[], None],
        in_flight: Callable[[], int],
    ) -> None:
        self.cluster = cluster
        self.every = every
        self.down = down
        self.rng = random.Random(seed)
        self.probe = probe
        self.in_flight = in_flight
        self.restarts: list[Restart] = []
        self.errors: list[str] = []
        self.down_for_good = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pg-monkey", daemon=True)

    def start(self) -> None:
        """Begin restarting (the first restart comes after one ``every`` interval)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop restarting; returns once the thread is done and the server is up."""
        self._stop.set()
        self._thread.join()
        if self.down_for_good:
            self.cluster.start()  # one last try, raising if the server will not start

    def _loop(self) -> None:
        modes = ["immediate", "fast"]
        self.rng.shuffle(modes)
        while not self._stop.wait(self.rng.uniform(*self.every)):
            mode = modes[len(self.restarts) % 2]
            outage = self.rng.uniform(*self.down)
            in_flight = self.in_flight()
            try:
                self.cluster.stop(mode)
            except subprocess.CalledProcessError as exc:
                self.errors.append(f"pg_ctl stop -m {mode}: {exc.stderr!r:.300}")
                continue
            gone = time.monotonic()
            self.probe()
            while time.monotonic() - gone < outage and not self._stop.is_set():
                self.probe()
                time.sleep(0.1)
            down_seconds = time.monotonic() - gone
            self._start_again()
            self.restarts.append(Restart(mode, down_seconds, in_flight))

    def _start_again(self) -> None:
        # A start that fails (the port taken meanwhile, a slow crash recovery past
        # pg_ctl's wait) is retried: the run must not end with the database down.
        for attempt in range(5):
            try:
                self.cluster.start()
                return
            except subprocess.CalledProcessError as exc:
                self.errors.append(f"pg_ctl start (attempt {attempt + 1}): {exc.stderr!r:.300}")
                time.sleep(1)
        self.down_for_good = True


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
        self.signal_ids: set[int] = set()  # every signal the API acknowledged (202)
        self.log_of: dict[int, Path] = {}  # pid -> its log
        self.last_done = 0  # terminal runs at the last count (the monkey reads it)
        self.monkey: PostgresMonkey | None = None
        self.elapsed = 0.0

    # --- processes ------------------------------------------------------------------------

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.root / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli.main", *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.log_of[proc.pid] = log
        return proc

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
        try:
            # A drain lasts TREADLE_DRAIN_GRACE_SECONDS (2) plus its releases, even with
            # the database down (they fail fast): 30 s means the worker hung.
            victim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.stats.slow_shutdowns += 1
            victim.kill()
            victim.wait()
        self.workers[index] = self.start_worker()

    def _last_lines(self, proc: subprocess.Popen[bytes], n: int = 3) -> str:
        log = self.log_of.get(proc.pid)
        if log is None or not log.exists():
            return ""
        lines = log.read_text(errors="replace").strip().splitlines()[-n:]
        return " | ".join(line[:300] for line in lines)

    def reap_exited(self) -> None:
        """Record and replace every process that exited without the harness's signal.

        A worker or the API must outlive any database outage: one that exits (say, one
        started while PostgreSQL was down) is a violation, replaced so the run goes on.
        """
        for index, proc in enumerate(self.workers):
            if proc.poll() is not None:
                self.stats.unexpected_exits.append(
                    f"worker pid {proc.pid} exited {proc.returncode}: {self._last_lines(proc)}"
                )
                self.workers[index] = self.start_worker()
        if self.api is not None and self.api.poll() is not None:
            self.stats.unexpected_exits.append(
                f"API pid {self.api.pid} exited {self.api.returncode}: {self._last_lines(self.api)}"
            )
            self.start_api()

    async def _silent_workers(self, within: float) -> list[int]:
        pids = [p.pid for p in self.workers if p.poll() is None]
        conn = await asyncpg.connect(self.cluster.url("treadle", "postgresql"))
        try:
            alive = await conn.fetch(
                "SELECT pid FROM workers WHERE stopped_at IS NULL AND "
                "last_heartbeat_at > now() - make_interval(secs => $1)",
                within,
            )
        finally:
            await conn.close()
        return sorted(set(pids) - {int(r["pid"]) for r in alive})

    def check_workers_heartbeat(self, deadline_seconds: float = 30) -> None:
        """Once the database is back for good: every live worker must heartbeat again.

        A worker that stays silent (wedged on a connection that died with a restart, its
        heartbeat loop gone) would hold no runs yet look alive; its pid is recorded.
        Polls until every worker heartbeated within the last 2 s (four heartbeat
        intervals) or the deadline passes.
        """
        silent: list[int] = []
        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline:
            try:
                silent = asyncio.run(self._silent_workers(within=2.0))
            except (OSError, asyncpg.PostgresError) as exc:
                silent = [-1]
                self.stats.silent_workers = [f"cannot read workers: {exc}"]
            if not silent:
                self.stats.silent_workers = []
                return
            time.sleep(0.5)
        by_pid = {p.pid: p for p in self.workers}
        self.stats.silent_workers = [
            f"pid {pid}: {self._last_lines(by_pid[pid])}" if pid in by_pid else str(pid)
            for pid in silent
        ]

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
        if r.status_code >= 500:
            self.stats.server_statuses[r.status_code] += 1
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
            self.signal_ids.add(int(r.json()["signal_id"]))
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

    def probe_outage(self) -> None:
        """One read and one submission while PostgreSQL is down: both must be 503s.

        Each status is counted in ``outage_statuses``; no answer within 10 s counts as
        status 0 (an unbounded wait is a violation too).
        """
        for method, path, body in (
            ("GET", "/runs?limit=1", None),
            ("POST", "/runs", {"workflow": "chaos-mix", "input": {"kind": "sleep", "n": 0}}),
        ):
            try:
                r = httpx.request(
                    method,
                    self.url + path,
                    headers={"Authorization": f"Bearer {self.token}"},
                    json=body,
                    timeout=10,
                )
            except httpx.HTTPError:
                self.stats.outage_statuses[0] += 1
                continue
            self.stats.outage_statuses[r.status_code] += 1
            if r.status_code >= 500:
                self.stats.server_statuses[r.status_code] += 1
            if r.status_code == 503 and r.headers.get("retry-after"):
                self.stats.outage_retry_after += 1
            elif r.status_code != 503:
                self.stats.server_errors.append(
                    f"{method} {path} (database down): {r.status_code} {r.text[:200]}"
                )

    def restart_postgres(self) -> None:
        """Stop PostgreSQL, probe the API while it is down, start it again."""
        self.cluster.stop()
        for _ in range(5):
            self.probe_outage()
            time.sleep(0.2)
        self.cluster.start()
        self.stats.pg_restarts += 1

    def start_monkey(self) -> None:
        """Start the database chaos monkey (``--pg-restart-every``), if it is on."""
        if self.args.pg_restart_every is None:
            return
        self.monkey = PostgresMonkey(
            self.cluster,
            every=self.args.pg_restart_every,
            down=self.args.pg_down,
            seed=self.args.seed + 1,
            probe=self.probe_outage,
            in_flight=lambda: len(self.runs) - self.last_done,
        )
        self.monkey.start()

    def restarts_done(self) -> bool:
        """True unless the monkey is on and has not yet done ``--min-restarts`` restarts.

        A short run may end before the monkey's first restart: it then waits for them
        (the workers must come through them even idle), so a bounded run still proves
        what it claims.
        """
        return self.monkey is None or len(self.monkey.restarts) >= self.args.min_restarts

    def stop_monkey(self) -> None:
        """Stop the monkey (the server is up when this returns) and count its restarts."""
        if self.monkey is not None:
            self.monkey.stop()
            self.stats.pg_restarts += len(self.monkey.restarts)

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
        # With the monkey on it does every restart; else one restart, mid-submission.
        restarted = self.args.pg_restart_every is not None
        self.start_monkey()
        try:
            while True:
                for kind, n in todo[: self.args.submit_batch]:
                    self.submit(kind, n)
                todo = todo[self.args.submit_batch :]
                now = time.monotonic()
                self.reap_exited()
                if now >= next_kill:
                    self.kill_one()
                    next_kill = now + self.args.kill_every
                done = self.terminal_count()
                self.last_done = max(self.last_done, done)
                if not restarted and len(self.runs) >= self.args.runs // 2:
                    self.restart_postgres()
                    restarted = True
                self.answer_waiting()
                if not todo and done >= len(self.runs) and self.restarts_done():
                    break
                if now - started > self.args.timeout:
                    print(f"timeout: {done}/{len(self.runs)} runs terminal", file=sys.stderr)
                    break
                time.sleep(0.2)
        finally:
            self.stop_monkey()
        self.elapsed = time.monotonic() - started
        self.reap_exited()
        self.check_workers_heartbeat()
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
        ("steps re-run after a lost worker (recoveries)", recovered, True),
        ("steps with lost attempts recorded", lost_marks, True),
        ("stale commits refused ('lease lost' in logs)", lease_lost, True),
        ("elapsed seconds", round(h.elapsed, 1), True),
    ]


async def fault_invariants(h: Harness) -> list[tuple[str, Any, bool]]:
    """(name, value, ok) rows about the database faults: restarts, answers, acknowledgements.

    Every check asserts something: with the monkey on, a run without a restart (or
    without one while runs were in flight) fails, and so does an outage without a probe.
    An acknowledgement is the API's promise: a run answered 201, a signal 202 (its
    ``signal_id``) or a decision 200 must be in the database, whatever crashed after.
    """
    conn = await asyncpg.connect(h.cluster.url("treadle", "postgresql"))
    try:
        run_ids = {
            str(r)
            for r in await conn.fetchval("SELECT COALESCE(array_agg(run_id), '{}') FROM runs")
        }
        signal_ids = set(
            await conn.fetchval("SELECT COALESCE(array_agg(signal_id), '{}') FROM signals")
        )
        decided = {
            str(r)
            for r in await conn.fetchval(
                "SELECT COALESCE(array_agg(run_id), '{}') FROM approval_decisions"
            )
        }
    finally:
        await conn.close()
    s = h.stats
    outage = dict(s.outage_statuses)
    answered_503 = outage.get(503, 0)
    rows: list[tuple[str, Any, bool]] = [
        ("acknowledged runs missing", len(set(h.runs) - run_ids), set(h.runs) <= run_ids),
        (
            "acknowledged signals missing",
            len(h.signal_ids - signal_ids),
            h.signal_ids <= signal_ids,
        ),
        ("acknowledged decisions missing", len(h.decided - decided), h.decided <= decided),
    ]
    monkey = h.monkey
    if monkey is None:
        rows.append(("PostgreSQL restarts", s.pg_restarts, s.pg_restarts >= 1 or h.args.runs < 2))
    else:
        crashes = sum(r.mode == "immediate" for r in monkey.restarts)
        downs = [r.down_seconds for r in monkey.restarts]
        loaded = sum(r.in_flight > 0 for r in monkey.restarts)
        rows += [
            (
                "PostgreSQL restarts by the monkey (crash / clean)",
                f"{len(monkey.restarts)} ({crashes} / {len(monkey.restarts) - crashes})",
                len(monkey.restarts) >= max(1, h.args.min_restarts),
            ),
            ("  of which with runs in flight", loaded, loaded >= 1),
            (
                "  seconds down: total / longest",
                f"{sum(downs):.1f} / {max(downs, default=0):.1f}",
                True,
            ),
            ("pg_ctl failures", len(monkey.errors), not monkey.errors),
        ]
    rows += [
        (
            "API statuses while PostgreSQL was down (0: no answer)",
            outage,
            bool(outage) and set(outage) == {503},
        ),
        (
            "  of which 503 with Retry-After",
            f"{s.outage_retry_after} / {answered_503}",
            s.outage_retry_after == answered_503,
        ),
        ("503 answers seen by the harness (all calls)", s.server_statuses.get(503, 0), True),
        ("500 answers", s.server_statuses.get(500, 0), s.server_statuses.get(500, 0) == 0),
        ("5xx other than 503 seen by the harness", len(s.server_errors), not s.server_errors),
        (
            "processes that exited on their own",
            len(s.unexpected_exits),
            not s.unexpected_exits,
        ),
        ("workers not exiting 30 s after SIGTERM", s.slow_shutdowns, s.slow_shutdowns == 0),
        (
            "live workers silent once PostgreSQL stayed up",
            len(s.silent_workers),
            not s.silent_workers,
        ),
    ]
    return rows


async def stuck_runs(h: Harness, limit: int = 10) -> list[str]:
    """One line per run not terminal (up to ``limit``): what it is waiting on, for diagnosis."""
    conn = await asyncpg.connect(h.cluster.url("treadle", "postgresql"))
    try:
        rows = await conn.fetch(
            "SELECT run_id, status, waiting_kind, waiting_name, attempt, fence, lease_owner, "
            "lease_expires_at, available_at, now() AS now FROM runs "
            "WHERE status <> ALL($1::text[]) ORDER BY created_at LIMIT $2",
            list(TERMINAL),
            limit,
        )
    finally:
        await conn.close()
    return [
        f"{r['run_id']} {h.runs.get(str(r['run_id']), ('?', 0))}: {r['status']} "
        f"waiting={r['waiting_kind']}:{r['waiting_name']} attempt={r['attempt']} "
        f"fence={r['fence']} lease={r['lease_owner']} until {r['lease_expires_at']} "
        f"available_at={r['available_at']} (now {r['now']})"
        for r in rows
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
    parser.add_argument(
        "--pg-restart-every",
        type=seconds_range,
        default=(5.0, 40.0),
        metavar="LO:HI",
        help="the database chaos monkey: restart PostgreSQL every LO..HI s for the whole "
        "run (default 5:40); 'off': one restart, mid-submission",
    )
    parser.add_argument(
        "--min-restarts",
        type=int,
        default=1,
        help="with the monkey on, the run lasts until it restarted PostgreSQL this often",
    )
    parser.add_argument(
        "--pg-down",
        type=seconds_range,
        default=(0.0, 2.0),
        metavar="LO:HI",
        help="seconds PostgreSQL stays down at each restart (default 0:2)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster and logs")
    args = parser.parse_args(argv)
    if args.pg_down is None:
        args.pg_down = (0.0, 0.0)
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
        table = [*asyncio.run(invariants(harness)), *asyncio.run(fault_invariants(harness))]
        stuck = asyncio.run(stuck_runs(harness))
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
    for exit_ in harness.stats.unexpected_exits[:10]:
        print("  exited:", exit_)
    for silent in harness.stats.silent_workers[:10]:
        print("  silent:", silent)
    for line in stuck:
        print("  not terminal:", line)
    if harness.monkey is not None:
        for error in harness.monkey.errors[:10]:
            print("  pg_ctl:", error)
    if args.keep:
        print(f"kept in {root}")
    return 0 if all(ok for _, _, ok in table) else 1


if __name__ == "__main__":
    sys.exit(main())
