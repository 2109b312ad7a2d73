"""DBOS Transact, the peer, and pgqueuer, the bare-queue floor, beside Treadle.

Usage::

    uv run python -m benchmarks.peer --runs 2000 --steps 1 --workers 1 2 4
    uv run python -m benchmarks.peer --engine pgqueuer --runs 2000 --workers 1 2 4

DBOS lives in its own virtual environment (``benchmarks/.peer-venv``, created here with
``uv`` at the pinned version) so its dependencies never touch ours; its side runs as
subprocesses of :mod:`benchmarks.peer_dbos`. For each measurement: a fresh database, one
process that enqueues N workflows of S no-op steps on a DBOS queue, then W worker
processes (``worker_concurrency`` = Treadle's per-worker concurrency, queue polling at
Treadle's benchmark poll interval) drain it. Throughput counts from the first workflow
start to the last completion recorded in DBOS's own ``workflow_status`` table.

pgqueuer (:mod:`benchmarks.peer_pgqueuer`, same venv) is the floor under one-step runs:
a job queue with no workflow state. Its own tables are installed in a fresh database, N
no-op jobs are enqueued before timing, then W consumer processes (at most Treadle's
per-worker concurrency in flight each, Treadle's poll interval as dequeue timeout) drain
them; the time counts from the first pick to the last completion in ``pgqueuer_log``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.common import RESULTS, ROOT, cpu_seconds, fresh_database, stop
from benchmarks.throughput import POLL_SECONDS, figures

DBOS_VERSION = "3.4.0"
PGQUEUER_VERSION = "1.6.0"
PEER_VENV = ROOT / "benchmarks" / ".peer-venv"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_dbos.py"
PGQUEUER_SCRIPT = ROOT / "benchmarks" / "peer_pgqueuer.py"
# What the peer venv holds: both peers at their pinned versions (pgqueuer's asyncpg extra
# is its driver; DBOS brings psycopg).
PEER_REQUIREMENTS = (f"dbos=={DBOS_VERSION}", f"pgqueuer[asyncpg]=={PGQUEUER_VERSION}")


def peer_python() -> Path:
    """The peer venv's interpreter, creating the venv and installing the peers if needed.

    Installs :data:`PEER_REQUIREMENTS` with ``uv pip`` (needs the package index once);
    an existing venv with both pinned versions is reused as it is.

    Raises:
        subprocess.CalledProcessError: the venv could not be created or installed.
    """
    python = PEER_VENV / "bin" / "python"
    probe = [
        str(python),
        "-c",
        "import dbos, pgqueuer, asyncpg, importlib.metadata as m; "
        f"assert m.version('dbos') == '{DBOS_VERSION}'; "
        f"assert m.version('pgqueuer') == '{PGQUEUER_VERSION}'",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    wanted = " ".join(PEER_REQUIREMENTS)
    print(f"installing {wanted} into {PEER_VENV.relative_to(ROOT)}", file=sys.stderr)
    if not python.exists():
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(PEER_VENV)], check=True)
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(python), *PEER_REQUIREMENTS],
        check=True,
    )
    return python


def _drain(
    engine: str,
    commands: Sequence[list[str]],
    probe: Callable[[], tuple[bool, bool]],
    *,
    polls: tuple[float, float],
    timeout_seconds: float = 1800,
) -> float:
    """Run a peer's worker processes until ``probe`` says the queue is drained.

    The one drain loop of both peers (DBOS, pgqueuer): start ``commands`` (one process
    each, from the repository root, output discarded), poll ``probe`` (returns
    ``(finished, started)``: every job done, and some job picked up) every ``polls[0]``
    seconds until the first pick and every ``polls[1]`` after, then stop the processes.

    Returns:
        The processes' CPU seconds from the first pick to the end (start-up, imports and
        connects excluded).

    Raises:
        TimeoutError: not drained within ``timeout_seconds``.
        RuntimeError: a worker process exited before the end.
    """
    start = time.monotonic()
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cmd in commands
    ]
    cpu_at_start: float | None = None
    try:
        while True:
            finished, started = probe()
            if finished:
                return cpu_seconds(procs) - (cpu_at_start or 0.0)
            if cpu_at_start is None and started:
                cpu_at_start = cpu_seconds(procs)
            if time.monotonic() - start > timeout_seconds:
                raise TimeoutError(
                    f"{engine} benchmark did not finish within {timeout_seconds:.0f} s"
                )
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a {engine} worker process exited early")
            time.sleep(polls[0] if cpu_at_start is None else polls[1])
    finally:
        stop(procs)


async def _status(url: str) -> tuple[int, float]:
    """(completed workflows, seconds from first start to last completion)."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, min(started_at_epoch_ms) AS first, max(completed_at) AS last"
            " FROM dbos.workflow_status WHERE status = 'SUCCESS' AND name LIKE '%bench_steps'"
        )
    finally:
        await conn.close()
    assert row is not None
    if not row["n"]:
        return 0, 0.0
    return int(row["n"]), (int(row["last"]) - int(row["first"])) / 1000.0


async def _started(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM dbos.workflow_status WHERE status <> 'ENQUEUED'"
            )
        )
    finally:
        await conn.close()


def measure(n_runs: int, n_steps: int, n_workers: int, concurrency: int) -> dict[str, Any]:
    """One DBOS measurement on a fresh database; returns the figures.

    Raises:
        TimeoutError: the workflows did not all complete within 30 minutes.
    """
    import asyncio

    python = str(peer_python())
    with fresh_database("dbos") as url:
        subprocess.run(
            [
                python,
                str(PEER_SCRIPT),
                "enqueue",
                url,
                str(n_runs),
                str(n_steps),
                POLL_SECONDS,
                str(concurrency),
            ],
            check=True,
            cwd=ROOT,
        )
        seconds = 0.0
        seen_start = False

        def probe() -> tuple[bool, bool]:
            nonlocal seconds, seen_start
            done, seconds = asyncio.run(_status(url))
            if not seen_start:
                seen_start = asyncio.run(_started(url))
            return done >= n_runs, seen_start

        cpu = _drain(
            "DBOS",
            [
                [python, str(PEER_SCRIPT), "worker", url, f"bench-worker-{i}"]
                for i in range(n_workers)
            ],
            probe,
            polls=(0.05, 0.2),
        )
    return {
        **figures(n_runs, n_steps, n_workers, concurrency, seconds),
        "worker_cpu_ms_per_step": round(cpu * 1000 / (n_runs * n_steps), 2),
        "engine": "dbos",
    }


async def _pgqueuer_status(url: str) -> tuple[int, int, float]:
    """(jobs left in the queue, jobs completed, seconds from first pick to last completion).

    Read from pgqueuer's own ``pgqueuer`` (live jobs) and ``pgqueuer_log`` tables, whose
    ``created`` is the database clock of each pick and completion.
    """
    conn = await asyncpg.connect(url)
    try:
        left = int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'successful') AS n,"
            " min(created) FILTER (WHERE status = 'picked') AS first,"
            " max(created) FILTER (WHERE status = 'successful') AS last"
            " FROM pgqueuer_log"
        )
    finally:
        await conn.close()
    assert row is not None
    if not row["n"]:
        return left, 0, 0.0
    return left, int(row["n"]), float((row["last"] - row["first"]).total_seconds())


def measure_pgqueuer(n_jobs: int, n_workers: int, concurrency: int) -> dict[str, Any]:
    """One pgqueuer drain of ``n_jobs`` no-op jobs on a fresh database; returns the figures.

    The record has the shape of :func:`benchmarks.throughput.figures` with one step per
    job (a job is the unit a one-step run is compared with), plus worker CPU ms per job.

    Raises:
        TimeoutError: the jobs did not all complete within 30 minutes.
        RuntimeError: a consumer process exited early, or a job did not succeed.
    """
    import asyncio

    python = str(peer_python())
    with fresh_database("pgq") as url:
        for argv in (["install", url], ["enqueue", url, str(n_jobs)]):
            subprocess.run([python, str(PGQUEUER_SCRIPT), *argv], check=True, cwd=ROOT)

        def probe() -> tuple[bool, bool]:
            left, _, _ = asyncio.run(_pgqueuer_status(url))
            return left == 0, left < n_jobs

        worker = [python, str(PGQUEUER_SCRIPT), "worker", url, str(concurrency), POLL_SECONDS]
        cpu = _drain("pgqueuer", [worker] * n_workers, probe, polls=(0.02, 0.1))
        # The last completions may be logged after the queue row is gone; read once more.
        _, done, seconds = asyncio.run(_pgqueuer_status(url))
        if done != n_jobs:
            raise RuntimeError(f"{n_jobs - done} pgqueuer jobs did not succeed")
    return {
        **figures(n_jobs, 1, n_workers, concurrency, seconds),
        "worker_cpu_ms_per_step": round(cpu * 1000 / n_jobs, 2),
        "engine": "pgqueuer",
    }


def main() -> None:
    """Parse arguments, run the peer's measurements, print and save them."""
    parser = argparse.ArgumentParser(description="DBOS / pgqueuer throughput on PostgreSQL")
    parser.add_argument("--engine", choices=["dbos", "pgqueuer"], default="dbos")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=1, help="DBOS only (pgqueuer: 1)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.engine == "dbos":
        results = [measure(args.runs, args.steps, w, args.concurrency) for w in args.workers]
    else:
        results = [measure_pgqueuer(args.runs, w, args.concurrency) for w in args.workers]
    for r in results:
        print(
            f"{args.engine} workers={r['workers']} runs={r['runs']} "
            f"steps/run={r['steps_per_run']} seconds={r['seconds']} "
            f"steps/s={r['steps_per_second']}"
        )
    (RESULTS / f"peer-{args.engine}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
