"""A 10,000-run bulk cancel on PostgreSQL: how long it takes and whether the counts are exact.

Run by hand (not part of ``make bench``)::

    uv run python -m benchmarks.bulk_cancel --runs 10000 --chunk 100

It creates a fresh database, submits ``--runs`` queued runs labelled ``bench=bulk`` (of a
workflow no worker runs, so they stay queued), creates a bulk-cancel batch by that label
filter (``create_batch``, what ``POST /runs:cancel`` calls) and processes it with one
:class:`~app.engine.batches.BatchRunner` (what each ``treadle worker`` runs), then checks
``done + skipped + failed == matched`` and one ``run_cancelled`` event per run. Prints the
figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select, text

from app.auth.principal import Principal, Scope
from app.core.labels import LabelFilter, validate_labels
from app.core.settings import AuthMode, Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.queries.run_filters import RunListFilters
from app.db.tables import events, runs
from app.engine import batches
from app.engine.batches import BatchAction, BatchRunner
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import WorkflowContext, workflow
from benchmarks.common import DEV_SECRET, asyncpg_url, fresh_database

TENANT = "bench"


class Job(BaseModel):
    """The idle run's input."""

    n: int


@workflow("bench-bulk-idle")
async def idle(ctx: WorkflowContext, job: Job) -> Any:
    """Waits for a signal nobody sends (never claimed here: no worker registers it)."""
    return await ctx.signal("never")


async def measure(url: str, n_runs: int, chunk: int, tmp: Path) -> dict[str, Any]:
    """Seed ``n_runs``, bulk-cancel them, return the timings and counts."""
    settings = Settings(
        database_url=url,
        auth_mode=AuthMode.DEV,
        dev_secret=DEV_SECRET,
        data_dir=tmp,
        batch_chunk_size=chunk,
        batch_max_runs=max(n_runs, 1),
    )
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([idle]).register(conn)
        submitter = Submitter(db, settings)
        labels = validate_labels({"bench": "bulk"})
        t0 = time.perf_counter()
        for n in range(n_runs):
            await submitter.submit(
                SubmitRequest(workflow="bench-bulk-idle", input={"n": n}, labels=labels),
                tenant_id=TENANT,
                subject="bench",
            )
        seeded = time.perf_counter() - t0
        # Fresh tables have no statistics until autovacuum gets to them; a deployment's
        # tables do, so plan the batch's snapshot as it would be planned there.
        async with db.autocommit() as conn:
            await conn.execute(text("ANALYZE runs"))
            await conn.execute(text("ANALYZE run_labels"))
        flt = RunListFilters(labels=(LabelFilter(key="bench", value="bulk"),))
        t1 = time.perf_counter()
        row = await batches.create_batch(
            db,
            settings,
            principal=Principal(
                tenant_id=TENANT, subject="bench", scopes=frozenset({Scope.RUNS_CANCEL})
            ),
            action=BatchAction.CANCEL,
            run_ids=None,
            filters=flt,
            selection={"filter": {"labels": {"bench": "bulk"}}},
            params={},
            reason="benchmark",
            dry_run=False,
        )
        created = time.perf_counter() - t1
        assert not isinstance(row, batches.DryRun)
        t2 = time.perf_counter()
        runner = BatchRunner(db, settings, worker_id="bench")
        while await runner.run_once():
            pass
        processed = time.perf_counter() - t2
        final = await batches.get_batch(db, tenant_id=TENANT, batch_id=row["batch_id"])
        async with db.read() as conn:
            cancelled = (
                await conn.execute(
                    select(func.count()).select_from(runs).where(runs.c.status == "cancelled")
                )
            ).scalar_one()
            per_run = (
                select(events.c.run_id, func.count().label("n"))
                .where(events.c.kind == "run_cancelled")
                .group_by(events.c.run_id)
                .subquery()
            )
            rows = await conn.execute(select(per_run.c.n, func.count()).group_by(per_run.c.n))
            histogram: dict[int, int] = {int(n): int(k) for n, k in rows.all()}
        counts = {k: int(final[k]) for k in ("matched", "done", "skipped", "failed")}
        return {
            "runs": n_runs,
            "chunk_size": chunk,
            "seed_seconds": round(seeded, 2),
            "create_batch_seconds": round(created, 3),
            "process_seconds": round(processed, 2),
            "runs_per_second": round(n_runs / processed, 1) if processed else None,
            **counts,
            "state": final["state"],
            "exact": counts["done"] + counts["skipped"] + counts["failed"] == counts["matched"],
            "runs_cancelled": int(cancelled),
            "cancel_events_per_run": {str(k): int(v) for k, v in histogram.items()},
        }
    finally:
        await db.dispose()


def main() -> None:
    """Parse the options, measure once on a fresh database, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=100)
    args = parser.parse_args()
    with fresh_database("bulk") as url:
        upgrade_to_head(asyncpg_url(url))
        tmp = Path("/tmp") / f"treadle-bench-bulk-{time.time_ns()}"
        result = asyncio.run(measure(asyncpg_url(url), args.runs, args.chunk, tmp))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
