"""Scale curve: claim throughput and statement p99 as finished runs pile up.

Usage::

    uv run python -m benchmarks.scale --rows 10000 100000 1000000 --runs 200

For each size, a fresh database gets that many *finished* runs by bulk SQL
(``generate_series``, then ``VACUUM ANALYZE`` and a ``CHECKPOINT`` so that the load's
write-back is over), as a long-lived installation accumulates them.
Then:

- ``steps_per_second``: one worker (concurrency 16) drains ``--runs`` fresh one-step
  runs, as in :mod:`benchmarks.throughput`;
- ``claim_p99_ms``: the claim statement (:func:`app.db.queries.runs.claim_runs`, limit 16)
  timed 200 times over 16 due runs, each in a transaction rolled back so every iteration
  sees the same table;
- ``list_p99_ms``: the first page (50) of ``GET /runs`` for the tenant that owns every
  finished row (:func:`app.db.queries.run_filters.list_runs`).

The bar (DESIGN/issue): no more than 20 % degradation from 10 k to 1 M finished rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.queries import run_filters as filters_q
from app.db.queries import runs as runs_q
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from benchmarks.common import (
    DEV_SECRET,
    RESULTS,
    asyncpg_url,
    fresh_database,
    percentile,
    start_workers,
    stop,
)
from benchmarks.throughput import measure_on, prepare
from benchmarks.workloads import bench_wait

_FILL = """
INSERT INTO runs (run_id, tenant_id, workflow, version, status, reason, input, output,
  fence, attempt, created_by, created_at, updated_at, started_at, finished_at)
SELECT gen_random_uuid(), 'bench', 'bench-steps', '1', 'completed', 'succeeded',
  :input, '1', 1, 1, 'bulk', now() - interval '1 day', now() - interval '1 day',
  now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, :n)
"""


async def _fill(url: str, rows: int) -> None:
    db = Database(Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET))
    try:
        for start in range(0, rows, 100_000):
            async with db.write() as conn:
                await conn.execute(
                    text(_FILL), {"n": min(100_000, rows - start), "input": '{"steps":1}'}
                )
        async with db.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE runs"))
            # Write the bulk load's dirty pages out now: otherwise the background writer
            # and the next checkpoint do it during the few seconds of the drain below,
            # which then measures the load's write-back instead of the claim.
            await conn.execute(text("CHECKPOINT"))
    finally:
        await db.dispose()


async def _statement_p99(url: str, iterations: int = 200) -> tuple[float, float]:
    """(claim p99 ms, list p99 ms) over ``iterations`` executions each."""
    db = Database(Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET))
    claims: list[float] = []
    lists: list[float] = []
    try:
        for _ in range(iterations):
            async with db.engine.connect() as conn:
                tx = await conn.begin()
                t0 = time.perf_counter()
                got = await runs_q.claim_runs(
                    conn,
                    worker_id="bench",
                    definition_keys=[("bench-steps", "1")],
                    limit=16,
                    lease_ttl=30,
                )
                claims.append((time.perf_counter() - t0) * 1000)
                await tx.rollback()
                assert got, "nothing to claim: the scale benchmark needs due runs"
            async with db.read() as conn:
                t0 = time.perf_counter()
                await filters_q.list_runs(
                    conn, "bench", filters_q.RunListFilters(), before_run_id=None, limit=50
                )
                lists.append((time.perf_counter() - t0) * 1000)
    finally:
        await db.dispose()
    return percentile(claims, 0.99), percentile(lists, 0.99)


def measure(sizes: list[int], n_runs: int) -> list[dict[str, Any]]:
    """One row per size: drain throughput and the two statements' p99."""
    out = []
    for rows in sizes:
        with fresh_database("scale") as url:
            upgrade_to_head(asyncpg_url(url))
            t0 = time.monotonic()
            asyncio.run(_fill(url, rows))
            fill_seconds = time.monotonic() - t0
            asyncio.run(prepare(url, 16, 1))
            claim_p99, list_p99 = asyncio.run(_statement_p99(url))
            drained = measure_on(url, n_runs, 1, 1, 16, already=16)
        out.append(
            {
                "finished_rows": rows,
                "fill_seconds": round(fill_seconds, 1),
                "steps_per_second": drained["steps_per_second"],
                "claim_p99_ms": round(claim_p99, 2),
                "list_p99_ms": round(list_p99, 2),
            }
        )
        print(f"  {rows:>9} finished rows: {out[-1]}", flush=True)
    return out


async def _count(url: str, sql: str) -> int:
    db = Database(Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET))
    try:
        async with db.read() as conn:
            return int((await conn.execute(text(sql))).scalar_one())
    finally:
        await db.dispose()


async def _submit_waiting(url: str, n: int) -> None:
    settings = Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([bench_wait]).register(conn)
        submitter = Submitter(db, settings)
        for _ in range(n):
            await submitter.submit(
                SubmitRequest(workflow="bench-wait", input={"steps": 1}),
                tenant_id="bench",
                subject="bench",
            )
    finally:
        await db.dispose()


def _rss(pid: int) -> int:
    """Resident set size of a process in bytes (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory(n_waiting: int) -> dict[str, Any]:
    """RSS of one worker process before and after ``n_waiting`` runs wait on timers.

    Each run executes one step, then sleeps an hour: released by the worker, so what
    stays is what the worker keeps per run it has seen (caches, metrics, logs).
    """
    with fresh_database("mem") as url:
        upgrade_to_head(asyncpg_url(url))
        asyncio.run(_submit_waiting(url, 0))  # register the definition
        [proc] = start_workers(url, 1, 16)
        try:
            deadline = time.monotonic() + 60
            while not asyncio.run(_count(url, "SELECT count(*) FROM workers")):
                if time.monotonic() > deadline:
                    raise TimeoutError("worker did not start")
                time.sleep(0.1)
            before = _rss(proc.pid)
            asyncio.run(_submit_waiting(url, n_waiting))
            deadline = time.monotonic() + 600
            waiting = "SELECT count(*) FROM runs WHERE status = 'waiting_timer'"
            while asyncio.run(_count(url, waiting)) < n_waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError("runs did not all reach waiting_timer")
                time.sleep(0.2)
            after = _rss(proc.pid)
        finally:
            stop([proc])
    return {
        "waiting_runs": n_waiting,
        "rss_idle_mib": round(before / 2**20, 1),
        "rss_after_mib": round(after / 2**20, 1),
        "per_run_kib": round((after - before) / 1024 / max(n_waiting, 1), 2),
    }


def main() -> None:
    """Parse arguments, measure, print and save."""
    parser = argparse.ArgumentParser(description="Treadle scale curve")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--waiting", type=int, default=1000, help="runs waiting on timers")
    args = parser.parse_args()
    result = {"curve": measure(args.rows, args.runs), "memory": memory(args.waiting)}
    print(json.dumps(result["memory"]))
    (RESULTS / "scale.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
