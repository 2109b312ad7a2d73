"""Latency on PostgreSQL: submit → first step start, submit → completed, wake-up lateness.

Usage::

    uv run python -m benchmarks.latency --runs 200 --peak 300

Each part uses a fresh database and one ``treadle worker`` process (concurrency 16, the
default 1 s poll interval: wake-ups must come from LISTEN/NOTIFY, not from polling).
Every time is read from the database clock (``now()`` of the committing transaction):

- *idle*: one run in flight at a time (submit, wait until completed, next).
  ``first_step`` = the first step's ``started_at`` − the run's ``created_at``;
  ``completed`` = ``finished_at`` − ``created_at``.
- *half load*: runs submitted open-loop (in batches every 5 ms) at 50 % of ``--peak``
  runs/s (the one-worker peak measured by the throughput benchmark) for
  :data:`WARMUP_SECONDS` + ``--seconds``; same two figures, of the runs submitted after
  the warm-up (the warm-up's apart).
- *signal*: a run waits on ``ctx.signal``; lateness = the signal's ``consumed_at`` −
  ``received_at`` (sent through the engine's ``send_signal``, which NOTIFYs).
- *timer*: runs sleep 1 s on a durable timer (``TREADLE_INLINE_RETRY_MAX_SECONDS=0`` so
  the run is released and claimed again, the path every long timer takes); lateness =
  the timer step's ``finished_at`` − its ``deadline``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text

from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.engine import control
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
from benchmarks.workloads import bench_signal, bench_steps, bench_timer

TENANT = "bench"


def _summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 0.50), 2),
        "p95_ms": round(percentile(values_ms, 0.95), 2),
        "p99_ms": round(percentile(values_ms, 0.99), 2),
    }


class _Client:
    """In-process submitter plus the database, for one fresh database."""

    def __init__(self, url: str) -> None:
        self.settings = Settings(database_url=asyncpg_url(url), dev_secret=DEV_SECRET)
        self.db = Database(self.settings)
        self.submitter = Submitter(self.db, self.settings)

    async def register(self) -> None:
        async with self.db.write() as conn:
            await Registry([bench_steps, bench_timer, bench_signal]).register(conn)

    async def submit(self, workflow: str) -> uuid.UUID:
        row, _ = await self.submitter.submit(
            SubmitRequest(workflow=workflow, input={"steps": 1}), tenant_id=TENANT, subject="b"
        )
        run_id: uuid.UUID = row["run_id"]
        return run_id

    async def submit_many(self, workflow: str, n: int) -> None:
        """Submit ``n`` runs of ``workflow`` in one transaction (``POST /runs:batch``'s path)."""
        results = await self.submitter.submit_batch(
            [SubmitRequest(workflow=workflow, input={"steps": 1})] * n,
            tenant_id=TENANT,
            subject="b",
        )
        failed = [r.error for r in results if r.error is not None]
        if failed:
            raise RuntimeError(f"latency benchmark: {len(failed)} submits failed: {failed[0]}")

    async def scalar(self, sql: str, **params: Any) -> Any:
        async with self.db.read() as conn:
            return (await conn.execute(text(sql), params)).scalar()

    async def until(self, probe: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not await probe():
            if time.monotonic() > deadline:
                raise TimeoutError("latency benchmark: condition not reached in time")
            await asyncio.sleep(0.01)

    async def status_is(self, run_id: uuid.UUID, status: str) -> bool:
        got = await self.scalar("SELECT status FROM runs WHERE run_id = :r", r=run_id)
        return bool(got == status)

    async def all_completed(self) -> bool:
        left = await self.scalar("SELECT count(*) FROM runs WHERE status <> 'completed'")
        return bool(left == 0)

    async def run_latencies(self) -> tuple[list[float], list[float]]:
        """(submit → first step start, submit → completed) of every run, in ms, by submit time."""
        async with self.db.read() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT extract(epoch FROM s.started_at - r.created_at) * 1000,"
                        " extract(epoch FROM r.finished_at - r.created_at) * 1000"
                        " FROM runs r JOIN steps s ON s.run_id = r.run_id AND s.seq = 0"
                        " ORDER BY r.created_at"
                    )
                )
            ).all()
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows]

    async def close(self) -> None:
        await self.db.dispose()


def _with_worker(
    body: Callable[[_Client], Awaitable[dict[str, Any]]], **worker_env: str
) -> dict[str, Any]:
    with fresh_database("lat") as url:
        upgrade_to_head(asyncpg_url(url))

        async def setup() -> None:
            client = _Client(url)
            try:
                await client.register()
            finally:
                await client.close()

        asyncio.run(setup())
        procs = start_workers(url, 1, 16, **worker_env)
        try:

            async def go() -> dict[str, Any]:
                client = _Client(url)
                try:
                    # The worker is up once it has registered itself.
                    await client.until(
                        lambda: _truthy(client.scalar("SELECT count(*) FROM workers"))
                    )
                    return await body(client)
                finally:
                    await client.close()

            return asyncio.run(go())
        finally:
            stop(procs)


async def _truthy(value: Awaitable[Any]) -> bool:
    return bool(await value)


async def _idle(client: _Client, n: int) -> dict[str, Any]:
    for _ in range(n):
        run_id = await client.submit("bench-steps")
        await client.until(lambda r=run_id: client.status_is(r, "completed"))  # type: ignore[misc]
    first, done = await client.run_latencies()
    return {"first_step": _summary(first), "completed": _summary(done)}


WARMUP_SECONDS = 2.0
"""Half load's warm-up: submissions at the same rate before the measured window."""

TICK_SECONDS = 0.005
"""Half load's submission interval: the runs due in each go in one batch submit."""


async def _half_load(client: _Client, rate: float, seconds: float) -> dict[str, Any]:
    # A worker's first second is not its steady state (each pooled connection's first
    # Parse of every hot statement, the first compilation of each clause): the runs
    # submitted in the first WARMUP_SECONDS are reported apart, as "warmup", and the
    # figures are of the runs submitted after it, still open loop at the same rate.
    warm = max(int(rate * WARMUP_SECONDS), 1)
    n = warm + max(int(rate * seconds), 1)
    start = time.monotonic()
    tasks = []
    sent = 0
    while sent < n:
        # Open loop: every TICK_SECONDS, the runs whose scheduled time has come go in one
        # batch submit, whatever the previous batches did. Batched because one submit per
        # run costs this process about half a core at a few hundred runs/s, on the cores
        # the worker and PostgreSQL need (docs/benchmarks.md, "Method").
        due = min(n, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            tasks.append(asyncio.create_task(client.submit_many("bench-steps", due - sent)))
            sent = due
        await asyncio.sleep(TICK_SECONDS)
    await asyncio.gather(*tasks)
    await client.until(client.all_completed, timeout=300)
    first, done = await client.run_latencies()
    return {
        "rate_runs_per_second": round(rate, 1),
        "warmup_seconds": WARMUP_SECONDS,
        "first_step": _summary(first[warm:]),
        "completed": _summary(done[warm:]),
        "warmup": {"first_step": _summary(first[:warm]), "completed": _summary(done[:warm])},
    }


async def _signals(client: _Client, n: int) -> dict[str, Any]:
    for _ in range(n):
        run_id = await client.submit("bench-signal")
        await client.until(lambda r=run_id: client.status_is(r, "waiting_signal"))  # type: ignore[misc]
        await control.send_signal(
            client.db,
            client.settings,
            tenant_id=TENANT,
            run_id=run_id,
            name="go",
            payload=None,
            actor="bench",
        )
        await client.until(lambda r=run_id: client.status_is(r, "completed"))  # type: ignore[misc]
    async with client.db.read() as conn:
        rows = (
            await conn.execute(
                text("SELECT extract(epoch FROM consumed_at - received_at) * 1000 FROM signals")
            )
        ).all()
    return {"lateness": _summary([float(r[0]) for r in rows])}


async def _timers(client: _Client, n: int) -> dict[str, Any]:
    # Staggered so the timers come due one by one, as in real traffic.
    for _ in range(n):
        await client.submit("bench-timer")
        await asyncio.sleep(0.05)
    await client.until(client.all_completed, timeout=120)
    async with client.db.read() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT extract(epoch FROM finished_at - deadline) * 1000 FROM steps"
                    " WHERE kind = 'timer'"
                )
            )
        ).all()
    return {"lateness": _summary([float(r[0]) for r in rows])}


def measure(n_runs: int, peak: float, seconds: float) -> dict[str, Any]:
    """All four latency measurements; ``peak`` is the peak runs/s for the half-load part."""
    return {
        "idle": _with_worker(lambda c: _idle(c, n_runs)),
        "half_load": _with_worker(lambda c: _half_load(c, peak / 2, seconds)),
        "signal": _with_worker(lambda c: _signals(c, max(n_runs // 4, 5))),
        "timer": _with_worker(
            lambda c: _timers(c, max(n_runs // 4, 5)), TREADLE_INLINE_RETRY_MAX_SECONDS="0"
        ),
    }


def main() -> None:
    """Parse arguments, measure, print and save."""
    parser = argparse.ArgumentParser(description="Treadle latency on PostgreSQL")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--peak", type=float, default=100.0, help="peak runs/s (1-step)")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    result = measure(args.runs, args.peak, args.seconds)
    print(json.dumps(result, indent=2))
    (RESULTS / "latency.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
