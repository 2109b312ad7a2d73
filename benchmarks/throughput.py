"""Engine throughput on PostgreSQL: pre-submit runs, drain them with W worker processes.

Usage::

    uv run python -m benchmarks.throughput --runs 2000 --steps 1 --workers 1 2
    uv run python -m benchmarks.throughput --runs 500 --steps 10 --workers 2

For each worker count it creates a fresh database, migrates it, registers the benchmark
workflow, inserts the runs through the engine's submit path, starts the worker processes
and measures the time from the first claim to the last finish (database clock), so worker
start-up is not counted. Prints a table and writes JSON to
``benchmarks/results/throughput-<timestamp>.json``. ``make bench`` (``benchmarks.bench``)
runs this beside DBOS and pgbench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.tables import runs
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from benchmarks.common import (
    DEV_SECRET,
    RESULTS,
    asyncpg_url,
    cpu_seconds,
    fresh_database,
    start_workers,
    stop,
)
from benchmarks.workloads import bench_steps

# How often idle workers poll; LISTEN/NOTIFY wakes them on submit anyway.
POLL_SECONDS = "0.05"
# Connections per worker process: the DBOS side gets the same (``sys_db_pool_size``), and
# more than the 16 runs a worker executes at once, so no run waits for a connection.
POOL_SIZE = "20"


def _settings(url: str) -> Settings:
    return Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET)


async def prepare(url: str, n_runs: int, n_steps: int) -> None:
    """Register the benchmark workflow and submit ``n_runs`` runs through the engine."""
    settings = _settings(url)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([bench_steps]).register(conn)
        submitter = Submitter(db, settings)
        sem = asyncio.Semaphore(16)

        async def one() -> None:
            async with sem:
                await submitter.submit(
                    SubmitRequest(workflow="bench-steps", input={"steps": n_steps}),
                    tenant_id="bench",
                    subject="bench",
                )

        await asyncio.gather(*(one() for _ in range(n_runs)))
    finally:
        await db.dispose()


# Only runs submitted by :func:`prepare` count (the scale benchmark adds others).
_OURS = runs.c.created_by == "bench"


async def _span(url: str) -> float:
    """Seconds from the first claim to the last finish, on the database clock."""
    db = Database(_settings(url))
    try:
        async with db.read() as conn:
            first, last = (
                await conn.execute(
                    select(func.min(runs.c.started_at), func.max(runs.c.finished_at)).where(_OURS)
                )
            ).one()
        return float((last - first).total_seconds())
    finally:
        await db.dispose()


# While draining, poll only through the partial index ix_runs_claimable (rows with
# ``available_at``: queued or leased runs). A filter on ``created_by`` is a sequential
# scan, and on the scale benchmark's million finished rows those scans, several a
# second, were most of what the database did during the drain.
_LIVE = runs.c.available_at.isnot(None)


async def _left(url: str) -> int:
    """How many runs are still queued or leased (the drained ones no longer are)."""
    db = Database(_settings(url))
    try:
        async with db.read() as conn:
            stmt = select(func.count()).select_from(runs).where(_LIVE)
            return int((await conn.execute(stmt)).scalar_one())
    finally:
        await db.dispose()


async def _not_completed(url: str) -> int:
    """How many of our runs ended other than ``completed`` (checked once, after)."""
    db = Database(_settings(url))
    try:
        async with db.read() as conn:
            stmt = select(func.count()).select_from(runs).where(_OURS, runs.c.status != "completed")
            return int((await conn.execute(stmt)).scalar_one())
    finally:
        await db.dispose()


async def _started(url: str) -> bool:
    db = Database(_settings(url))
    try:
        async with db.read() as conn:
            stmt = (
                select(func.count()).select_from(runs).where(_LIVE, runs.c.started_at.isnot(None))
            )
            return bool((await conn.execute(stmt)).scalar_one())
    finally:
        await db.dispose()


def figures(
    n_runs: int, n_steps: int, n_workers: int, concurrency: int, seconds: float
) -> dict[str, Any]:
    """The result record of one throughput measurement."""
    return {
        "runs": n_runs,
        "steps_per_run": n_steps,
        "workers": n_workers,
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "runs_per_second": round(n_runs / seconds, 1),
        "steps_per_second": round(n_runs * n_steps / seconds, 1),
    }


def measure_on(
    url: str, n_runs: int, n_steps: int, n_workers: int, concurrency: int, already: int = 0
) -> dict[str, Any]:
    """Submit ``n_runs`` into an existing migrated database and drain them.

    ``already``: runs of ``n_steps`` steps submitted earlier by :func:`prepare` and not
    yet finished; they are drained too and counted in the figures.

    Raises:
        TimeoutError: the runs did not all complete within 30 minutes.
    """
    asyncio.run(prepare(url, n_runs, n_steps))
    start = time.monotonic()
    procs = start_workers(
        url,
        n_workers,
        concurrency,
        TREADLE_POLL_INTERVAL_SECONDS=POLL_SECONDS,
        TREADLE_DB_POOL_SIZE=POOL_SIZE,
    )
    total = n_runs + already
    cpu_at_start: float | None = None
    try:
        while asyncio.run(_left(url)) > 0:
            if time.monotonic() - start > 1800:
                raise TimeoutError("benchmark did not finish within 30 minutes")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker process exited early")
            if cpu_at_start is None and asyncio.run(_started(url)):
                cpu_at_start = cpu_seconds(procs)  # start-up (imports) excluded
            time.sleep(0.05 if cpu_at_start is None else 0.2)
        cpu = cpu_seconds(procs) - (cpu_at_start or 0.0)
        elapsed = asyncio.run(_span(url))
        failed = asyncio.run(_not_completed(url))
        if failed:
            raise RuntimeError(f"{failed} benchmark runs did not complete")
    finally:
        stop(procs)
    return {
        **figures(total, n_steps, n_workers, concurrency, elapsed),
        "worker_cpu_ms_per_step": round(cpu * 1000 / (total * n_steps), 2),
    }


def measure(n_runs: int, n_steps: int, n_workers: int, concurrency: int) -> dict[str, Any]:
    """One measurement on a fresh database; returns the figures.

    Raises:
        TimeoutError: the runs did not all complete within 30 minutes.
    """
    with fresh_database("tput") as url:
        upgrade_to_head(asyncpg_url(url))
        return {**measure_on(url, n_runs, n_steps, n_workers, concurrency), "engine": "treadle"}


def main() -> None:
    """Parse arguments, run the measurements, print and save them."""
    parser = argparse.ArgumentParser(description="Treadle engine throughput on PostgreSQL")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    results = [measure(args.runs, args.steps, w, args.concurrency) for w in args.workers]
    print(
        f"{'workers':>7} {'runs':>6} {'steps/run':>9} {'seconds':>8} {'runs/s':>8} {'steps/s':>8}"
    )
    for r in results:
        print(
            f"{r['workers']:>7} {r['runs']:>6} {r['steps_per_run']:>9} {r['seconds']:>8} "
            f"{r['runs_per_second']:>8} {r['steps_per_second']:>8}"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"throughput-{stamp}.json"
    out.write_text(json.dumps({"machine": os.uname().nodename, "results": results}, indent=2))
    print(f"wrote {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
