"""Engine throughput on PostgreSQL: pre-submit runs, drain them with W worker processes.

Usage::

    uv run python -m benchmarks.throughput --runs 2000 --steps 1 --workers 1 2
    uv run python -m benchmarks.throughput --runs 500 --steps 10 --workers 2

For each worker count it creates a fresh database, migrates it, registers the benchmark
workflow, inserts the runs through the engine's submit path, starts the worker processes
and measures the time until every run is completed (polled from the database). Prints a
table and writes JSON to ``benchmarks/results/throughput-<timestamp>.json``.

The side-by-side comparison with DBOS and the pgbench checkpoint limit is not part of this
script yet (see the performance issue); this measures Treadle alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import func, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.tables import runs
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from benchmarks.workloads import bench_steps

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("TREADLE_BENCH_PG", "postgres@127.0.0.1:5432")


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(f"postgresql://{SERVER}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _prepare(url: str, n_runs: int, n_steps: int) -> None:
    settings = Settings(database_url=url, dev_secret="b" * 32)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([bench_steps]).register(conn)
        submitter = Submitter(db, settings)
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                await submitter.submit(
                    SubmitRequest(workflow="bench-steps", input={"steps": n_steps}),
                    tenant_id="bench",
                    subject="bench",
                )

        await asyncio.gather(*(one(i) for i in range(n_runs)))
    finally:
        await db.dispose()


async def _span(url: str) -> float:
    """Seconds from the first claim to the last finish, on the database clock.

    Worker process start-up is not counted.
    """
    db = Database(Settings(database_url=url, dev_secret="b" * 32))
    try:
        async with db.read() as conn:
            first, last = (
                await conn.execute(
                    select(func.min(runs.c.started_at), func.max(runs.c.finished_at))
                )
            ).one()
        return float((last - first).total_seconds())
    finally:
        await db.dispose()


async def _completed(url: str) -> int:
    db = Database(Settings(database_url=url, dev_secret="b" * 32))
    try:
        async with db.read() as conn:
            stmt = select(func.count()).select_from(runs).where(runs.c.status == "completed")
            return int((await conn.execute(stmt)).scalar_one())
    finally:
        await db.dispose()


def measure(n_runs: int, n_steps: int, n_workers: int, concurrency: int) -> dict[str, Any]:
    """One measurement on a fresh database; returns the figures."""
    name = f"treadle_bench_{os.getpid()}"
    url = f"postgresql+asyncpg://{SERVER}/{name}"
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        upgrade_to_head(url)
        asyncio.run(_prepare(url, n_runs, n_steps))
        env = {
            **os.environ,
            "TREADLE_DATABASE_URL": url,
            "TREADLE_DEV_SECRET": "b" * 32,
            "TREADLE_LOG_LEVEL": "WARNING",
            "TREADLE_POLL_INTERVAL_SECONDS": "0.05",
        }
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.cli.main",
                    "worker",
                    "--handlers",
                    "benchmarks.workloads",
                    "--concurrency",
                    str(concurrency),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(n_workers)
        ]
        try:
            while asyncio.run(_completed(url)) < n_runs:
                if time.perf_counter() - start > 1800:
                    raise SystemExit("benchmark did not finish within 30 minutes")
                time.sleep(0.2)
            elapsed = asyncio.run(_span(url))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return {
        "runs": n_runs,
        "steps_per_run": n_steps,
        "workers": n_workers,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "runs_per_second": round(n_runs / elapsed, 1),
        "steps_per_second": round(n_runs * n_steps / elapsed, 1),
    }


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
    out = ROOT / "benchmarks" / "results" / f"throughput-{stamp}.json"
    out.write_text(json.dumps({"machine": os.uname().nodename, "results": results}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
