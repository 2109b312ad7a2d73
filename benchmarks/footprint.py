"""What a run costs PostgreSQL: commits, WAL bytes, rows, bytes and connections.

Usage::

    uv run python -m benchmarks.footprint --runs 500 --steps 1 10

The figures behind docs/scaling.md. It starts its *own* PostgreSQL cluster (the chaos
harness's :class:`benchmarks.chaos.Cluster`, on a free port), so the server-wide WAL
counters see nothing but this measurement. For each step count it creates a database,
migrates it, submits ``--runs`` runs of the ten-step benchmark workflow through the
engine's submit path (the API's own code, without HTTP), then drains them with one
``treadle worker``, and reads the server's own counters around each phase:

- **commits**: ``pg_stat_database.xact_commit`` of that database, read after every backend
  of the phase has exited (a backend reports its counters when it ends). The drain's count
  includes the worker's claims that found nothing and its heartbeats, so it is an upper
  bound on what a step itself costs;
- **WAL bytes**: ``pg_current_wal_lsn()`` before and after (full-page writes included, so
  a longer run lowers the per-step figure a little);
- **rows and bytes per run** in every table after the drain (``pg_total_relation_size``,
  indexes and TOAST included), i.e. the history a run leaves until retention removes it;
- **connections**: the most backends the worker held at once, sampled while it drained.

Prints a table and writes ``benchmarks/results/footprint-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from app.db.migrations import upgrade_to_head
from app.db.tables import metadata
from benchmarks.chaos import Cluster
from benchmarks.common import RESULTS, start_workers, stop
from benchmarks.throughput import POLL_SECONDS, POOL_SIZE, prepare

DEADLINE_SECONDS = 1800.0


async def _one(dsn: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def _value(dsn: str, sql: str, *args: Any) -> Any:
    return asyncio.run(_one(dsn, sql, *args))


def _settled(admin: str, database: str) -> None:
    """Wait until no backend is connected to ``database`` (its counters are then in)."""
    deadline = time.monotonic() + 60
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
    while _value(admin, sql, database):
        if time.monotonic() > deadline:
            raise TimeoutError(f"backends of {database} did not exit within 60 s")
        time.sleep(0.05)


def _counters(admin: str, database: str) -> tuple[int, int]:
    """(commits of ``database``, the server's WAL position in bytes)."""
    _settled(admin, database)
    commits = _value(
        admin,
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
        database,
    )
    wal = _value(admin, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(commits), int(wal)


async def _table_sizes(dsn: str) -> dict[str, tuple[int, int]]:
    """Rows and total bytes (indexes and TOAST included) of every Treadle table."""
    conn = await asyncpg.connect(dsn)
    try:
        sizes: dict[str, tuple[int, int]] = {}
        for name in sorted(metadata.tables):
            rows = await conn.fetchval(f'SELECT count(*) FROM "{name}"')
            size = await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", name)
            if rows:
                sizes[name] = (int(rows), int(size))
        return sizes
    finally:
        await conn.close()


def measure(cluster: Cluster, n_runs: int, n_steps: int) -> dict[str, Any]:
    """Submit and drain ``n_runs`` runs of ``n_steps`` steps on a fresh database.

    Returns:
        The figures (per run and per step), as described in the module docstring.

    Raises:
        TimeoutError: the drain did not finish within 30 minutes.
        RuntimeError: the worker exited early.
    """
    database = f"footprint_{n_steps}"
    admin = cluster.url("postgres", driver="postgresql")
    url = cluster.url(database, driver="postgresql")
    _value(admin, f'CREATE DATABASE "{database}"')
    upgrade_to_head(cluster.url(database))
    before_submit = _counters(admin, database)
    asyncio.run(prepare(url, n_runs, n_steps))
    before_drain = _counters(admin, database)
    procs = start_workers(
        url, 1, 16, TREADLE_POLL_INTERVAL_SECONDS=POLL_SECONDS, TREADLE_DB_POOL_SIZE=POOL_SIZE
    )
    peak_connections = 0
    polls = 0
    start = time.monotonic()
    live = "SELECT count(*) FROM runs WHERE available_at IS NOT NULL"
    active = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
    try:
        while _value(url, live):
            polls += 1
            if time.monotonic() - start > DEADLINE_SECONDS:
                raise TimeoutError("the drain did not finish within 30 minutes")
            if procs[0].poll() is not None:
                raise RuntimeError("the worker exited early")
            peak_connections = max(peak_connections, int(_value(admin, active, database)))
            time.sleep(0.2)
    finally:
        stop(procs)
    after = _counters(admin, database)
    sizes = asyncio.run(_table_sizes(url))
    steps = n_runs * n_steps
    submit_commits = before_drain[0] - before_submit[0]
    # Our polls of ``live`` commit too: every one that found runs, and the last.
    drain_commits = after[0] - before_drain[0] - polls - 1
    return {
        "runs": n_runs,
        "steps_per_run": n_steps,
        "submit_commits_per_run": round(submit_commits / n_runs, 2),
        "submit_wal_bytes_per_run": round((before_drain[1] - before_submit[1]) / n_runs),
        "drain_commits_per_step": round(drain_commits / steps, 2),
        "drain_commits_per_run": round(drain_commits / n_runs, 2),
        "drain_wal_bytes_per_step": round((after[1] - before_drain[1]) / steps),
        "drain_wal_bytes_per_run": round((after[1] - before_drain[1]) / n_runs),
        "worker_peak_connections": peak_connections,
        "rows_per_run": {k: round(r / n_runs, 2) for k, (r, _) in sizes.items()},
        "bytes_per_run": round(sum(b for _, b in sizes.values()) / n_runs),
    }


def main() -> None:
    """Start the private cluster, measure each step count, print and save the figures."""
    parser = argparse.ArgumentParser(description="What a Treadle run costs PostgreSQL")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 10])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treadle-footprint-") as tmp:
        cluster = Cluster(Path(tmp))
        cluster.init()
        cluster.start()
        try:
            results = [measure(cluster, args.runs, s) for s in args.steps]
        finally:
            cluster.stop()
    head = (
        f"{'steps/run':>9} {'runs':>6} {'submit commits/run':>18} {'submit WAL B/run':>16} "
        f"{'drain commits/step':>18} {'drain WAL B/step':>16} {'bytes/run kept':>14} "
        f"{'worker conns':>12}"
    )
    print(head)
    for r in results:
        print(
            f"{r['steps_per_run']:>9} {r['runs']:>6} {r['submit_commits_per_run']:>18} "
            f"{r['submit_wal_bytes_per_run']:>16} {r['drain_commits_per_step']:>18} "
            f"{r['drain_wal_bytes_per_step']:>16} {r['bytes_per_run']:>14} "
            f"{r['worker_peak_connections']:>12}"
        )
    for r in results:
        rows = ", ".join(f"{k} {v}" for k, v in r["rows_per_run"].items())
        print(f"rows per run ({r['steps_per_run']} steps): {rows}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"footprint-{stamp}.json"
    out.write_text(json.dumps({"machine": os.uname().nodename, "results": results}, indent=2))
    print(f"wrote {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
