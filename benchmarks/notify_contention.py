"""Many concurrent submitters on PostgreSQL: NOTIFY in each submit's commit vs coalesced.

Usage::

    uv run python -m benchmarks.notify_contention --processes 4 --submitters 16 --seconds 8

``--processes`` submitter processes each run ``--submitters`` concurrent loops of
:meth:`app.engine.submit.Submitter.submit` (the API's one-statement path, no HTTP) against
one fresh database, for ``--seconds`` from a common start (each process warms up first).
Two modes alternate, ``--rounds`` times each (the defaults: 64 submitters, 3 x 2 rounds
of 8 s, about two minutes with process start-up):

* ``in-commit``: the submit statement carries ``pg_notify`` (the shape before
  docs/adr/0037-coalesced-wake-ups.md), so every submit's commit takes PostgreSQL's
  global notification lock;
* ``coalesced``: the shipped path, the submit commits without NOTIFY and each process's
  :class:`app.db.wakeups.WakeCoalescer` sends one per ``TREADLE_NOTIFY_COALESCE_MS``.

No worker runs (the runs stay queued); a LISTEN connection in the parent counts the
notifications each round delivers. Prints runs/s per round and the median per mode, and
saves them to ``benchmarks/results/notify_contention.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from typing import Any, cast

import asyncpg
from sqlalchemy import bindparam, text

from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.queries import submits as submits_q
from app.db.tables import runs
from app.db.wakeups import NOTIFY_CHANNEL
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from benchmarks.common import DEV_SECRET, RESULTS, asyncpg_url, fresh_database
from benchmarks.workloads import bench_steps

MODES = ("in-commit", "coalesced")


def _in_commit_statement() -> Any:
    # The pre-0037 statement: the same CTEs plus a pg_notify read FROM inserted, so the
    # NOTIFY is part of the submit's own transaction.
    sql = cast(Any, submits_q._SUBMIT.element).text
    head, tail = sql.rsplit("\nSELECT ", 1)
    announced = ",\nannounced AS (\n    SELECT pg_notify(:channel, '') FROM inserted\n)"
    sql = f"{head}{announced}\nSELECT {tail.replace('FROM inserted', 'FROM inserted, announced')}"
    binds = [
        bindparam(k, type_=v.type)
        for k, v in cast(Any, submits_q._SUBMIT.element)._bindparams.items()
    ]
    return text(sql).bindparams(*binds, bindparam("channel", value=NOTIFY_CHANNEL)).columns(*runs.c)


async def _submitters(
    url: str, mode: str, submitters: int, seconds: float, ready: Any, go: Any
) -> int:
    settings = Settings(
        database_url=asyncpg_url(url), dev_secret=DEV_SECRET, db_pool_size=submitters + 2
    )
    db = Database(settings)
    if mode == "in-commit":
        submits_q._SUBMIT = _in_commit_statement()
        db.wake_workers = lambda: None  # type: ignore[method-assign]
    submitter = Submitter(db, settings)
    request = SubmitRequest(workflow="bench-steps", input={"steps": 1})
    done = 0
    try:
        # Warm up (imports done, pool filled, caches filled) before the common start: a
        # spawned process takes seconds to import on a loaded machine, and a process that
        # started late would otherwise submit alone at the end of the round.
        await asyncio.gather(
            *(submitter.submit(request, tenant_id="bench", subject="b") for _ in range(submitters))
        )
        ready.put(None)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await submitter.submit(request, tenant_id="bench", subject="b")
                done += 1

        await asyncio.gather(*(loop() for _ in range(submitters)))
    finally:
        await db.dispose()
    return done


def _child(
    url: str, mode: str, submitters: int, seconds: float, ready: Any, go: Any, out: Any
) -> None:
    out.put(asyncio.run(_submitters(url, mode, submitters, seconds, ready, go)))


async def _round(
    url: str, mode: str, processes: int, submitters: int, seconds: float
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_child, args=(url, mode, submitters, seconds, ready, go, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    loop = asyncio.get_running_loop()
    for _ in procs:
        await loop.run_in_executor(None, ready.get)
    # Counted from the common start only: the warm-up's notifications are not the round's.
    listen = await asyncpg.connect(url)
    received = 0

    def count(*_: object) -> None:
        nonlocal received
        received += 1

    await listen.add_listener(NOTIFY_CHANNEL, count)
    go.set()
    counts = [await loop.run_in_executor(None, out.get) for _ in procs]
    for p in procs:
        p.join()
    # The last notifications (one coalescing window at most) are delivered within this.
    await asyncio.sleep(0.2)
    await listen.close()
    total = sum(counts)
    return {
        "mode": mode,
        "runs": total,
        "runs_per_s": round(total / seconds, 1),
        "notifications": received,
    }


def measure(processes: int, submitters: int, seconds: float, rounds: int) -> dict[str, Any]:
    """Alternate the modes ``rounds`` times on one fresh database; per-round and medians."""
    with fresh_database("notify") as url:
        upgrade_to_head(asyncpg_url(url))

        async def setup() -> None:
            db = Database(Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET))
            try:
                async with db.write() as conn:
                    await Registry([bench_steps]).register(conn)
            finally:
                await db.dispose()

        asyncio.run(setup())
        results = [
            asyncio.run(_round(url, mode, processes, submitters, seconds))
            for _ in range(rounds)
            for mode in MODES
        ]
    medians = {
        mode: statistics.median(r["runs_per_s"] for r in results if r["mode"] == mode)
        for mode in MODES
    }
    return {
        "concurrent_submitters": processes * submitters,
        "processes": processes,
        "seconds_per_round": seconds,
        "rounds": results,
        "median_runs_per_s": medians,
    }


def main() -> None:
    """Parse arguments, measure, print and save (benchmarks/results/notify_contention.json)."""
    parser = argparse.ArgumentParser(description="NOTIFY in the submit commit vs coalesced")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--submitters", type=int, default=16, help="per process")
    parser.add_argument("--seconds", type=float, default=8.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.processes, args.submitters, args.seconds, args.rounds)
    print(json.dumps(result, indent=2))
    (RESULTS / "notify_contention.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
